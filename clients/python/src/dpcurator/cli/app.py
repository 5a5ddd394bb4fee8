"""``dpcurator``: the command line for owners, analysts and clients (and the admin's setup).

Every command talks to one server (``--url`` / ``CURATOR_URL``, default the embedded
``http://127.0.0.1:8000``) with one key (``--key`` / ``CURATOR_KEY``). Errors are printed as one
line (``error: budget-exhausted (409): ...``) with exit status 1; usage errors exit with 2.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from dpcurator import __version__
from dpcurator.chain import Checkpoint, new_checkpoint
from dpcurator.cli import render
from dpcurator.client import DEFAULT_URL, CuratorClient
from dpcurator.errors import CuratorError, ProblemError
from dpcurator.models import PrincipalCreated, Release, Verification
from dpcurator.results import AteResult, EbmShapeResult, UpliftTable

ROLES = ("owner", "analyst", "client")
# The CLI's δ budget when an owner names none: each release charges its own δ (at most 1e-5
# by default: min(1e-5, 1 / (10 n_min))), so about ten releases fit; 1e-5 allowed one.
DEFAULT_DELTA_TOTAL = 1e-4


class CliError(click.ClickException):
    """One line on stderr, exit status 1."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


class CuratorGroup(click.Group):
    """Turns every client error (and any unexpected one) into one line, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except ProblemError as exc:
            raise CliError(exc.one_line()) from None
        except CuratorError as exc:
            raise CliError(str(exc)) from None
        except ImportError as exc:  # an optional extra is missing (plots: matplotlib)
            raise CliError(str(exc)) from None
        except OSError as exc:
            where = f": {exc.filename}" if exc.filename else ""
            raise CliError(f"{exc.strerror or type(exc).__name__}{where}") from None
        except KeyboardInterrupt:
            raise click.Abort() from None
        except Exception as exc:
            raise CliError(f"unexpected {type(exc).__name__}: {exc}") from None


class State:
    def __init__(self, url: str, key: str | None, as_json: bool, timeout: float) -> None:
        self.url, self.key, self.as_json, self.timeout = url, key, as_json, timeout
        self._client: CuratorClient | None = None

    @property
    def client(self) -> CuratorClient:
        if self._client is None:
            self._client = CuratorClient(self.url, self.key, timeout=self.timeout)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


pass_state = click.make_pass_decorator(State)


def emit(state: State, text: Callable[[], str], data: Callable[[], Any]) -> None:
    """Print the human view, or JSON with ``--json``."""
    if state.as_json:
        click.echo(json.dumps(data(), indent=2, default=str))
    else:
        click.echo(text())


def dump(model: Any) -> Any:
    if isinstance(model, list):
        return [dump(m) for m in model]
    return model.model_dump(mode="json", by_alias=True)


def parse_params(pairs: tuple[str, ...], raw_json: str | None) -> dict[str, Any]:
    """``-p epsilon=1.0 -p nuisance=none`` (JSON values when they parse) and ``--params``; a
    name in both is refused (one of the two would be silently dropped)."""
    params: dict[str, Any] = {}
    if raw_json:
        try:
            loaded = json.loads(raw_json)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not JSON: {exc.msg}", param_hint="--params") from None
        if not isinstance(loaded, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--params")
        params.update(loaded)
    from_json = set(params)
    for item in pairs:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"'{item}' is not NAME=VALUE", param_hint="-p")
        if name in from_json:
            raise click.BadParameter(
                f"'{name}' is given both in --params and by -p: give it once", param_hint="-p"
            )
        try:
            params[name] = json.loads(value)
        except json.JSONDecodeError:
            params[name] = value
    return params


def fail(message: str) -> NoReturn:
    raise CliError(message)


@click.group(cls=CuratorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url",
    envvar="CURATOR_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="The server (env CURATOR_URL).",
)
@click.option("--key", envvar="CURATOR_KEY", help="Your API key (env CURATOR_KEY).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--timeout", default=60.0, show_default=True, help="Seconds per HTTP request.")
@click.version_option(version=__version__, message="%(version)s")
@click.pass_context
def cli(ctx: click.Context, url: str, key: str | None, as_json: bool, timeout: float) -> None:
    """DP causal curator: upload, budget, grant and audit (owners); quote and release (analysts)."""
    state = State(url, key, as_json, timeout)
    ctx.obj = state
    ctx.call_on_close(state.close)


@cli.command()
@pass_state
def health(state: State) -> None:
    """Check that the server answers and its database is ready."""
    if not state.client.health():
        fail("the server is not healthy")
    if not state.client.ready():
        fail(f"{state.url} answers but is not ready (database or migrations)")
    click.echo(f"ok: {state.url} is ready")


@cli.command()
@pass_state
def whoami(state: State) -> None:
    """Show the principal behind the key."""
    me = state.client.me()
    emit(
        state,
        lambda: render.pairs([("id", me.id), ("name", me.name), ("role", me.role)]),
        lambda: dump(me),
    )


# ---- principals (admin) ----------------------------------------------------------------------


@cli.group()
def principal() -> None:
    """Principals (the admin creates owners, analysts and clients)."""


@principal.command("create")
@click.argument("name")
@click.option("--role", type=click.Choice(ROLES), required=True)
@pass_state
def principal_create(state: State, name: str, role: str) -> None:
    """Create a principal; its API key is printed once."""
    _emit_key(state, state.client.create_principal(name, role), "store it")


def _emit_key(state: State, p: PrincipalCreated, note: str) -> None:
    """A principal with the API key the server shows only once."""
    emit(
        state,
        lambda: (
            render.pairs([("id", p.id), ("role", p.role), ("api key", p.api_key)])
            + f"\n(the key is shown only now: {note})"
        ),
        lambda: dump(p),
    )


@principal.command("list")
@pass_state
def principal_list(state: State) -> None:
    """List principals (admin, owners)."""
    items = state.client.list_principals()
    emit(
        state,
        lambda: render.table(
            ["id", "name", "role", "key", "created", "disabled"],
            [
                [p.id, p.name, p.role, p.key_prefix, p.created_at, "yes" if p.disabled else ""]
                for p in items
            ],
        ),
        lambda: dump(items),
    )


def _set_disabled(state: State, principal_id: str, disabled: bool) -> None:
    p = state.client.set_disabled(principal_id, disabled)
    emit(
        state,
        lambda: render.pairs([("id", p.id), ("name", p.name), ("disabled", str(p.disabled))]),
        lambda: dump(p),
    )


@principal.command("disable")
@click.argument("principal_id")
@pass_state
def principal_disable(state: State, principal_id: str) -> None:
    """Disable a principal: its key is refused at once (admin)."""
    _set_disabled(state, principal_id, True)


@principal.command("enable")
@click.argument("principal_id")
@pass_state
def principal_enable(state: State, principal_id: str) -> None:
    """Enable a disabled principal again, with its old key (admin)."""
    _set_disabled(state, principal_id, False)


@principal.command("new-key")
@click.argument("principal_id", default="me")
@pass_state
def principal_new_key(state: State, principal_id: str) -> None:
    """Replace a key (yours by default; anyone's as the admin); the old one stops working."""
    _emit_key(
        state, state.client.replace_key(principal_id), "store it; the old key no longer works"
    )


@principal.command("events")
@click.argument("principal_id", default="me")
@click.option(
    "--verify", is_flag=True, help="Recompute the chain on the server; exit 1 if it is broken."
)
@pass_state
def principal_events(state: State, principal_id: str, verify: bool) -> None:
    """A principal's account record: creation, disables, enables and key replacements, with who
    made each (yours by default; anyone's as the admin)."""
    if verify:
        _emit_verification(state, state.client.verify_principal_events(principal_id))
        return
    items = state.client.principal_events(principal_id)
    emit(
        state,
        lambda: render.table(
            ["seq", "event", "by", "key", "at"],
            [[e.seq, e.event, e.actor_id, e.key_prefix, e.created_at] for e in items],
        ),
        lambda: dump(items),
    )


# ---- datasets (owners) -----------------------------------------------------------------------


@cli.group()
def dataset() -> None:
    """Datasets: upload with a public schema, list, show, delete rows."""


F = TypeVar("F", bound=Callable[..., Any])


schema_option = click.option(
    "--schema",
    "schema_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="The public schema (JSON): bounds, treatment, outcome, design, policies.",
)


def csv_format_options(command: F) -> F:
    """The file-format options of ``dataset upload`` and ``dataset check``."""
    options = [
        click.option(
            "--delimiter",
            type=click.Choice([",", ";", "tab", "|"]),
            help="The file's field separator (default: found from the header line).",
        ),
        click.option(
            "--decimal-comma",
            is_flag=True,
            help="Numbers are written with a decimal comma (30,5).",
        ),
        click.option(
            "--encoding",
            type=click.Choice(["utf-8", "cp1252", "latin-1"]),
            default="utf-8",
            show_default=True,
            help="The file's text encoding (cp1252: Excel's plain 'CSV' on a "
            "Western-European Windows).",
        ),
        click.option(
            "--missing-value",
            "missing_values",
            multiple=True,
            help="A missing-value marker besides the built-in ones (empty, NA, NULL, NaN, "
            "...), e.g. '.'; repeat for more.",
        ),
        click.option(
            "--labels",
            "labels_path",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help='Text values to read as numbers, by column (JSON), e.g. {"arm": {"treated": '
            '1, "control": 0}, "sex": {"F": 0, "M": 1}}.',
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _csv_format(
    delimiter: str | None,
    decimal_comma: bool,
    encoding: str,
    missing_values: tuple[str, ...],
    labels_path: Path | None,
) -> dict[str, Any]:
    csv_format: dict[str, Any] = {"encoding": encoding, "missing_values": list(missing_values)}
    if labels_path is not None:
        try:
            # a BOM (Windows editors) is fine; keys named twice are refused by the server
            csv_format["labels"] = json.loads(labels_path.read_text(encoding="utf-8-sig"))
        except (OSError, ValueError) as exc:
            raise CliError(f"--labels: not a JSON file of labels ({exc})") from None
    if delimiter is not None:
        csv_format["delimiter"] = "\t" if delimiter == "tab" else delimiter
    if decimal_comma:
        csv_format["decimal"] = ","
    return csv_format


def _report_pairs(report: Any) -> list[tuple[str, Any]]:
    by_column = report.rows_rejected_by_column
    return [
        ("rows received", report.rows_received),
        ("rows rejected", report.rows_rejected),
        *([("rejected by column", by_column)] if by_column else []),
        ("cells clipped", report.cells_clipped or "none"),
        ("cells imputed", report.cells_imputed or "none"),
        *(
            [("not a declared code (counted as missing)", report.cells_not_a_code)]
            if getattr(report, "cells_not_a_code", None)
            else []
        ),
        *([("read as", _format_words(report.csv_format))] if report.csv_format else []),
    ]


@dataset.command("check")
@click.argument("csv", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@schema_option
@csv_format_options
@pass_state
def dataset_check(
    state: State,
    csv: Path,
    schema_path: Path,
    delimiter: str | None,
    decimal_comma: bool,
    encoding: str,
    missing_values: tuple[str, ...],
    labels_path: Path | None,
) -> None:
    """Check CSV against its schema as an upload would; nothing is stored (a dataset cannot be
    deleted once uploaded, only its rows)."""
    csv_format = _csv_format(delimiter, decimal_comma, encoding, missing_values, labels_path)
    checked = state.client.check_upload(csv, schema_path, csv_format=csv_format)
    report = checked.ingest_report

    def text() -> str:
        return "\n".join(
            [
                f"an upload would keep {checked.n} rows (nothing was stored)",
                "",
                "ingest report (to you only; not public):",
                render.pairs(_report_pairs(report)),
                *(f"warning: {w}" for w in report.warnings),
            ]
        )

    emit(state, text, lambda: dump(checked))


@dataset.command("upload")
@click.argument("csv", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@schema_option
@click.option("--name", required=True)
@click.option("--description", default="")
@click.option("--allow-paper-mode", is_flag=True, help="Allow paper-mode (heuristic) kinds.")
@csv_format_options
@click.option("--epsilon", "epsilon_total", type=float, help="Also set the ε budget.")
@click.option(
    "--delta",
    "delta_total",
    type=float,
    default=DEFAULT_DELTA_TOTAL,
    show_default=True,
    help="δ budget (with --epsilon). Each release charges its own δ (at most 1e-5 by "
    "default), so the default allows about ten releases.",
)
@pass_state
def dataset_upload(
    state: State,
    csv: Path,
    schema_path: Path,
    name: str,
    description: str,
    allow_paper_mode: bool,
    delimiter: str | None,
    decimal_comma: bool,
    encoding: str,
    missing_values: tuple[str, ...],
    labels_path: Path | None,
    epsilon_total: float | None,
    delta_total: float,
) -> None:
    """Upload CSV with its public schema. The ingest report is shown to you once."""
    csv_format = _csv_format(delimiter, decimal_comma, encoding, missing_values, labels_path)
    created = state.client.upload_dataset(
        name,
        csv,
        schema_path,
        description=description,
        allow_paper_mode=allow_paper_mode,
        csv_format=csv_format,
    )
    out: dict[str, Any] = dump(created)
    budget_warnings: list[str] = []
    if epsilon_total is not None:
        budget = state.client.set_budget(
            created.id, epsilon_total=epsilon_total, delta_total=delta_total
        )
        out["budget"] = dump(budget)
        budget_warnings = budget.warnings
    report = created.ingest_report

    def text() -> str:
        lines = [
            render.pairs([("id", created.id), ("name", created.name), ("n", created.n)]),
            "",
            "ingest report (shown once, to you only; not public):",
            render.pairs(_report_pairs(report)),
            *(f"warning: {w}" for w in report.warnings),
        ]
        if epsilon_total is not None:
            lines += ["", f"budget set: epsilon {epsilon_total:g}, delta {delta_total:g}"]
            lines += [f"warning: {w}" for w in budget_warnings]
        return "\n".join(lines)

    emit(state, text, lambda: out)


def _format_words(fmt: dict[str, Any]) -> str:
    delimiter = {"\t": "tab"}.get(str(fmt.get("delimiter")), repr(fmt.get("delimiter")))
    words = f"delimiter {delimiter}, decimal {fmt.get('decimal', '.')!r}, {fmt.get('encoding')}"
    extra = fmt.get("missing_values") or []
    words += f", missing also {', '.join(repr(m) for m in extra)}" if extra else ""
    labelled = fmt.get("labels") or {}
    return words + (f", labels for {', '.join(labelled)}" if labelled else "")


@dataset.command("list")
@pass_state
def dataset_list(state: State) -> None:
    """Datasets you own or are granted."""
    items = state.client.list_datasets()
    emit(state, lambda: render.datasets(items), lambda: dump(items))


@dataset.command("show")
@click.argument("dataset_id")
@pass_state
def dataset_show(state: State, dataset_id: str) -> None:
    """A dataset's public metadata and budget."""
    d = state.client.get_dataset(dataset_id)
    emit(state, lambda: render.dataset(d), lambda: dump(d))


@dataset.command("update")
@click.argument("dataset_id")
@click.option("--description", help="A new public description.")
@click.option(
    "--allow-paper-mode/--no-allow-paper-mode",
    default=None,
    help="Allow (or stop allowing) paper-mode (heuristic) releases on the dataset.",
)
@pass_state
def dataset_update(
    state: State, dataset_id: str, description: str | None, allow_paper_mode: bool | None
) -> None:
    """Change a dataset's description or paper-mode setting (owner)."""
    if description is None and allow_paper_mode is None:
        raise click.UsageError("give --description and/or --allow-paper-mode/--no-allow-paper-mode")
    d = state.client.update_dataset(
        dataset_id, description=description, allow_paper_mode=allow_paper_mode
    )
    emit(state, lambda: render.dataset(d), lambda: dump(d))


@dataset.command("delete-rows")
@click.argument("dataset_id")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_state
def dataset_delete_rows(state: State, dataset_id: str, yes: bool) -> None:
    """Delete the stored rows (the ledger and releases stay)."""
    if not yes:
        click.confirm(f"delete the rows of {dataset_id}? This cannot be undone", abort=True)
    state.client.delete_rows(dataset_id)
    click.echo(f"rows of {dataset_id} deleted")


# ---- budget and grants (owners) --------------------------------------------------------------


@cli.group()
def budget() -> None:
    """A dataset's privacy budget."""


@budget.command("show")
@click.argument("dataset_id")
@pass_state
def budget_show(state: State, dataset_id: str) -> None:
    """Total, spent and remaining (ε, δ)."""
    b = state.client.get_budget(dataset_id)
    emit(state, lambda: render.budget(b), lambda: dump(b))


@budget.command("set")
@click.argument("dataset_id")
@click.option("--epsilon", type=float, required=True, help="ε total.")
@click.option(
    "--delta",
    type=float,
    help=f"δ total. Omitted: the current δ total, or {DEFAULT_DELTA_TOTAL:g} if no budget is "
    "set yet (each release charges its own δ, at most 1e-5 by default).",
)
@pass_state
def budget_set(state: State, dataset_id: str, epsilon: float, delta: float | None) -> None:
    """Set the (ε, δ) total; it can never drop below what is spent."""
    if delta is None:
        current = state.client.get_budget(dataset_id)
        delta = current.delta_total if current.is_set else DEFAULT_DELTA_TOTAL
    b = state.client.set_budget(dataset_id, epsilon_total=epsilon, delta_total=delta)
    emit(state, lambda: render.budget(b), lambda: dump(b))


@cli.group()
def grant() -> None:
    """Access grants of analysts and clients, with per-principal caps."""


@grant.command("add")
@click.argument("dataset_id")
@click.argument("principal_id")
@click.option("--epsilon-cap", type=float, help="Most ε this principal may spend.")
@click.option("--delta-cap", type=float, help="Most δ this principal may spend.")
@click.option("--no-epsilon-cap", is_flag=True, help="Remove the grant's ε cap.")
@click.option("--no-delta-cap", is_flag=True, help="Remove the grant's δ cap.")
@pass_state
def grant_add(
    state: State,
    dataset_id: str,
    principal_id: str,
    epsilon_cap: float | None,
    delta_cap: float | None,
    no_epsilon_cap: bool,
    no_delta_cap: bool,
) -> None:
    """Grant an analyst or client, or update the caps of their grant: a cap you do not give
    stays as it is (--no-epsilon-cap / --no-delta-cap remove one)."""
    if epsilon_cap is not None and no_epsilon_cap:
        raise click.UsageError("give --epsilon-cap or --no-epsilon-cap, not both")
    if delta_cap is not None and no_delta_cap:
        raise click.UsageError("give --delta-cap or --no-delta-cap, not both")
    # The API replaces both caps (PUT): keep the ones not given (an owner's --delta-cap had
    # silently removed an epsilon cap of 2).
    current = next(
        (g for g in state.client.list_grants(dataset_id) if g.principal_id == principal_id),
        None,
    )  # a revoked grant's caps too: granting again keeps them unless removed
    if current is not None:
        if epsilon_cap is None and not no_epsilon_cap:
            epsilon_cap = current.epsilon_cap
        if delta_cap is None and not no_delta_cap:
            delta_cap = current.delta_cap
    g = state.client.grant(dataset_id, principal_id, epsilon_cap=epsilon_cap, delta_cap=delta_cap)
    emit(
        state,
        lambda: (
            f"granted {g.principal_id} (epsilon cap {render.fmt(g.epsilon_cap)}, "
            f"delta cap {render.fmt(g.delta_cap)})"
        ),
        lambda: dump(g),
    )


@grant.command("list")
@click.argument("dataset_id")
@pass_state
def grant_list(state: State, dataset_id: str) -> None:
    """Grants of a dataset with what each principal spent."""
    items = state.client.list_grants(dataset_id)

    def names() -> dict[str, str]:
        # an owner may list the principals it can grant to; anyone else sees ids only
        try:
            return {
                p.id: p.name + (" (disabled: key refused)" if getattr(p, "disabled", False) else "")
                for p in state.client.list_principals()
            }
        except CuratorError:
            return {}

    def text() -> str:
        known = names()
        return render.table(
            ["principal", "name", "eps cap", "delta cap", "eps spent", "delta spent", "revoked"],
            [
                [
                    g.principal_id,
                    known.get(g.principal_id),
                    g.epsilon_cap,
                    g.delta_cap,
                    g.epsilon_spent,
                    g.delta_spent,
                    g.revoked,
                ]
                for g in items
            ],
        )

    emit(state, text, lambda: dump(items))


@grant.command("revoke")
@click.argument("dataset_id")
@click.argument("principal_id")
@pass_state
def grant_revoke(state: State, dataset_id: str, principal_id: str) -> None:
    """Revoke a grant (what was spent stays spent)."""
    state.client.revoke(dataset_id, principal_id)
    click.echo(f"revoked {principal_id} on {dataset_id}")


# ---- ledger (owners' audit views) ------------------------------------------------------------


@cli.group()
def ledger() -> None:
    """The append-only, hash-chained ledger of a dataset (owner's audit views)."""


@ledger.command("show")
@click.argument("dataset_id")
@pass_state
def ledger_show(state: State, dataset_id: str) -> None:
    """Every budget event: creation, budget and grant changes, charges."""
    entries = state.client.ledger(dataset_id)
    try:  # names beside the ids (an owner may list principals); ids alone otherwise
        names = {p.id: p.name for p in state.client.list_principals()}
    except CuratorError:
        names = {}
    emit(state, lambda: render.ledger(entries, names), lambda: dump(entries))


@ledger.command("export")
@click.argument("dataset_id")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write here instead of stdout.",
)
@click.option(
    "--format", "fmt", type=click.Choice(["csv", "json"]), default="csv", show_default=True
)
@pass_state
def ledger_export(state: State, dataset_id: str, output: Path | None, fmt: str) -> None:
    """Export the full ledger (hashes included) as CSV or JSON."""
    if fmt == "csv":
        text = state.client.ledger_csv(dataset_id)
    else:
        text = json.dumps(dump(state.client.ledger(dataset_id)), indent=2) + "\n"
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        click.echo(f"wrote {output}", err=True)


@ledger.command("verify")
@click.argument("dataset_id")
@click.option(
    "--local",
    is_flag=True,
    help="Recompute the chain here from the exported entries instead of on the server.",
)
@click.option(
    "--checkpoint",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A file you keep: the entry it names (saved by an earlier check) must still be there "
    "unchanged; after a valid check it names the new head. Implies --local.",
)
@click.option(
    "--fail-on-changes",
    is_flag=True,
    help="With --checkpoint (a cron job): exit status 2, and keep the checkpoint where it is, "
    "when budget, grant or settings (paper mode) entries were added since it; confirm them by "
    "running without this.",
)
@pass_state
def ledger_verify(
    state: State, dataset_id: str, local: bool, checkpoint: Path | None, fail_on_changes: bool
) -> None:
    """Verify the hash chain; exit status 1 if it is broken (2: --fail-on-changes found limits
    changed since the checkpoint)."""
    if fail_on_changes and checkpoint is None:
        # exit 1, not click's usage status 2: a cron job reads 2 as "changes to confirm"
        raise click.ClickException("--fail-on-changes needs --checkpoint FILE")
    if checkpoint is None and not local:
        _emit_verification(state, state.client.verify_ledger(dataset_id))
        return
    try:
        saved = Checkpoint.load(checkpoint) if checkpoint is not None else None
        if saved is not None and saved.dataset_id != dataset_id:
            raise ValueError(f"it is dataset {saved.dataset_id}'s checkpoint, not {dataset_id}'s")
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise click.ClickException(f"{checkpoint}: not a usable checkpoint file ({exc})") from None
    v = state.client.verify_ledger_locally(dataset_id, checkpoint=saved)
    if checkpoint is not None and v.valid and v.entries:
        if saved is not None:
            click.echo(f"checkpoint: entry {saved.seq} unchanged since {saved.saved_at}", err=True)
            # what changed the limits since: the owner confirms these were theirs (an entry
            # appended after the checkpoint with its chain recomputed passes every check)
            changes = [
                e
                for e in state.client.ledger(dataset_id)[saved.seq :]
                if e.entry_type in ("budget", "grant", "settings")  # paper mode too
            ]
            for e in changes:
                click.echo(
                    f"since the checkpoint: entry {e.seq} ({e.created_at[:19]}): "
                    f"{render.entry_note(e) or e.entry_type}: confirm it was yours",
                    err=True,
                )
            if changes and fail_on_changes:
                # an insider's forged grant passes every check; only the owner knows its own
                # limits, so a cron job must not move past them unconfirmed
                click.echo(
                    f"checkpoint: kept at entry {saved.seq}: {len(changes)} budget, grant or "
                    "settings entries to confirm (run without --fail-on-changes once they are "
                    "yours)",
                    err=True,
                )
                _emit_verification(state, v)
                sys.exit(2)
        if saved is None or saved.seq != v.entries:
            new_checkpoint(dataset_id, v).save(checkpoint)
            click.echo(f"checkpoint: entry {v.entries} saved to {checkpoint}", err=True)
    _emit_verification(state, v)


def _emit_verification(state: State, v: Verification) -> None:
    """A hash chain's verification; exit status 1 if it is broken."""
    emit(
        state,
        lambda: (
            f"valid: {v.entries} entries, head {v.head_hash}"
            if v.valid
            else f"INVALID at seq {v.first_invalid_seq}: {v.reason}"
            if v.first_invalid_seq is not None
            else f"INVALID: {v.reason}"  # the tables beside the chain, not an entry
        ),
        lambda: dump(v),
    )
    if not v.valid:
        sys.exit(1)


@ledger.command("plot")
@click.argument("dataset_id")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="PNG file to write.",
)
@pass_state
def ledger_plot(state: State, dataset_id: str, output: Path) -> None:
    """Plot ε spent over time against the total, to a PNG."""
    from dpcurator.plots import plot_budget_spend

    entries = state.client.ledger(dataset_id)
    plot_budget_spend(entries, output, title=f"Privacy budget of {dataset_id}")
    click.echo(f"wrote {output}")


# ---- quotes and releases (analysts) ----------------------------------------------------------


@cli.group()
def release() -> None:
    """Quotes and releases: ask the cost, request, wait, show results."""


PARAM_OPTIONS = [
    click.option("--kind", default="ate", show_default=True, help="Release kind."),
    click.option(
        "-p",
        "--param",
        "param_pairs",
        multiple=True,
        metavar="NAME=VALUE",
        help="A parameter, e.g. -p epsilon=1.0 (repeatable; JSON values).",
    ),
    click.option("--params", "params_json", metavar="JSON", help="All parameters as JSON."),
]


def with_params(f: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(PARAM_OPTIONS):
        f = option(f)
    return f


@release.command("quote")
@click.argument("dataset_id")
@with_params
@pass_state
def release_quote(
    state: State, dataset_id: str, kind: str, param_pairs: tuple[str, ...], params_json: str | None
) -> None:
    """Cost and expected accuracy of a release (free: no charge, no data read)."""
    q = state.client.quote(dataset_id, kind, parse_params(param_pairs, params_json))
    emit(state, lambda: render.quote(q), lambda: dump(q))


def _wait_with_bar(state: State, release_id: str, timeout: float) -> Release:
    done = 0
    with click.progressbar(
        length=1000,
        label=f"release {release_id}",  # the whole id: the one `release show` takes
        file=sys.stderr,
        show_eta=False,
        item_show_func=lambda stage: stage,
    ) as bar:

        def on_progress(r: Release) -> None:
            nonlocal done
            target = int(round(1000 * max(0.0, min(1.0, r.progress))))
            bar.update(max(0, target - done), r.stage)
            done = max(done, target)

        return state.client.wait(release_id, timeout=timeout, on_progress=on_progress)


def _show_finished(state: State, r: Release, *, every_row: bool = False) -> None:
    if r.status != "done" or r.result is None:
        emit(state, lambda: render.release(r), lambda: dump(r))
        return
    parsed = state.client.result(r)
    max_rows = None if every_row else render.MAX_ROWS

    def text() -> str:
        names = (
            _covariate_names(state, r.dataset_id)
            if isinstance(parsed, (EbmShapeResult, UpliftTable))
            else None
        )
        return render.release(r) + "\n\nresult:\n" + render.result(parsed, max_rows, names)

    emit(state, text, lambda: dump(r))


def _covariate_names(state: State, dataset_id: str) -> list[str] | None:
    """The dataset's covariate names in schema order, to label EBM features; None where the
    caller may not read the dataset (a decision-support client) or the call fails."""
    try:
        schema = state.client.get_dataset(dataset_id).public_schema
    except CuratorError:
        return None
    return [str(c.get("name")) for c in schema.get("covariates", [])]


every_row_option = click.option(
    "--all",
    "every_row",
    is_flag=True,
    help=f"Every row of a long table (default: the first {render.MAX_ROWS} and a count).",
)


@release.command("request")
@click.argument("dataset_id")
@with_params
@click.option("--fresh", is_flag=True, help="A new, charged release even if one is stored.")
@click.option("--idempotency-key", help="Reuse a key to retry safely (default: a new one).")
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Wait for the result with a progress bar.",
)
@click.option("--wait-timeout", default=900.0, show_default=True, help="Seconds to wait.")
@every_row_option
@pass_state
def release_request(
    state: State,
    dataset_id: str,
    kind: str,
    param_pairs: tuple[str, ...],
    params_json: str | None,
    fresh: bool,
    idempotency_key: str | None,
    wait: bool,
    wait_timeout: float,
    every_row: bool,
) -> None:
    """Request a release: charged now, runs as a job."""
    created = state.client.request_release(
        dataset_id,
        kind,
        parse_params(param_pairs, params_json),
        fresh=fresh,
        idempotency_key=idempotency_key,
    )
    if created.cached:
        click.echo(f"an identical release is stored: {created.id} (nothing charged)", err=True)
    else:
        click.echo(
            f"release {created.id} charged epsilon {created.epsilon:g}, delta {created.delta:g}",
            err=True,
        )
    if not wait:
        emit(state, lambda: render.release(created), lambda: dump(created))
        return
    final = created if created.status == "done" else _wait_with_bar(state, created.id, wait_timeout)
    _show_finished(state, final, every_row=every_row)


@release.command("wait")
@click.argument("release_id")
@click.option("--wait-timeout", default=900.0, show_default=True, help="Seconds to wait.")
@every_row_option
@pass_state
def release_wait(state: State, release_id: str, wait_timeout: float, every_row: bool) -> None:
    """Wait for a release with a progress bar, then show its result."""
    _show_finished(state, _wait_with_bar(state, release_id, wait_timeout), every_row=every_row)


@release.command("show")
@click.argument("release_id")
@every_row_option
@pass_state
def release_show(state: State, release_id: str, every_row: bool) -> None:
    """A release's status and, once done, its result."""
    _show_finished(state, state.client.get_release(release_id), every_row=every_row)


@release.command("list")
@click.argument("dataset_id")
@click.option("--limit", type=click.IntRange(1, 1000), help="At most this many (a page).")
@click.option("--offset", type=click.IntRange(0), default=0, show_default=True, help="Skip these.")
@click.option("--newest", is_flag=True, help="Newest first (default: oldest first).")
@pass_state
def release_list(
    state: State, dataset_id: str, limit: int | None, offset: int, newest: bool
) -> None:
    """Releases of a dataset."""
    items = state.client.list_releases(dataset_id, limit=limit, offset=offset, newest_first=newest)
    emit(state, lambda: render.releases(items), lambda: dump(items))


@release.command("plot")
@click.argument("release_ids", nargs=-1, required=True)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="PNG file to write.",
)
@click.option("--reference", type=float, help="Draw a reference line (e.g. a known truth).")
@pass_state
def release_plot(
    state: State, release_ids: tuple[str, ...], output: Path, reference: float | None
) -> None:
    """Plot ATE releases with their confidence intervals, to a PNG."""
    from dpcurator.plots import default_ate_labels, plot_ate

    results: list[AteResult] = []
    labels = []
    for rid in release_ids:
        r = state.client.get_release(rid)
        parsed = state.client.result(r) if r.result is not None else None
        if not isinstance(parsed, AteResult):
            fail(f"release {rid} is not a finished ate release")
        results.append(parsed)
        labels.append(f"{rid[:8]} {default_ate_labels([parsed])[0]}")  # eps, estimator, clip
    plot_ate(results, output, labels=labels, reference=reference)
    click.echo(f"wrote {output}")


# ---- points for evaluations and predictions (clients, analysts, owners) -------------------------


POINT_OPTIONS = [
    click.option(
        "--points",
        "points_json",
        metavar="JSON",
        help="Points as JSON, e.g. '[[50, 0.3, 25, 1, 0]]' (covariates in schema order).",
    ),
    click.option(
        "--csv",
        "points_csv",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Points from a CSV file: with a header, the dataset's covariate columns by name "
        "(other columns such as an id are ignored); without one, every column, in order.",
    ),
    click.option(
        "--id-column",
        metavar="NAME",
        help="With --csv (and a header): a column, e.g. patient_id, shown beside each answer "
        "(in --json as 'ids') so answers map back to rows by name, not by order.",
    ),
]


def with_points(f: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(POINT_OPTIONS):
        f = option(f)
    return f


def _number(text: str) -> float:
    """A CSV cell as a number; ``float`` without its Python-only forms (``6_2`` is not 62, as
    the upload refuses it)."""
    if "_" in text:
        raise ValueError(text)
    return float(text)


def _is_number(text: str) -> bool:
    try:
        _number(text)
    except ValueError:
        return False
    return True


def _csv_rows(path: Path) -> list[list[str]]:
    """The non-blank rows of a points CSV (header included, if any); a UTF-8 byte-order mark
    (Excel's "CSV UTF-8") is not part of the first column's name."""
    with path.open(newline="", encoding="utf-8-sig") as handle:
        return [r for r in csv.reader(handle) if r and any(c.strip() for c in r)]


def _header(rows: list[list[str]], names: Sequence[str]) -> list[str] | None:
    """The first row as a header where it names a covariate, None where it is a data row (all
    numbers); anything else is refused, saying which (a headerless row with an empty cell had
    been read as a header lacking every covariate)."""
    first = [c.strip() for c in rows[0]]
    if any(c in names for c in first):
        # a covariate named twice is ambiguous; other columns are ignored, repeated or not
        repeated = sorted({c for c in first if c in names and first.count(c) > 1})
        if repeated:
            raise click.BadParameter(
                f"the header names {', '.join(repeated)} more than once (which column holds "
                "the value is ambiguous)",
                param_hint="--csv",
            )
        return first
    if all(_is_number(c) for c in first):
        return None
    j = next(j for j, c in enumerate(first) if not _is_number(c))
    raise click.BadParameter(
        f"the first row is neither a header (it names none of the covariates "
        f"{', '.join(names[:8])}{', ...' if len(names) > 8 else ''}) nor a row of numbers "
        f"(value {j + 1} is {'empty' if not first[j] else 'not a number'})",
        param_hint="--csv",
    )


def read_points(
    points_json: str | None,
    points_csv: Path | None,
    covariates: Callable[[], Sequence[str]],
) -> list[list[float]]:
    """The points of ``--points`` or ``--csv`` (exactly one); ``covariates`` names the columns."""
    if (points_json is None) == (points_csv is None):
        raise click.UsageError("give exactly one of --points and --csv")
    if points_json is not None:
        try:
            loaded = json.loads(points_json)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not JSON: {exc.msg}", param_hint="--points") from None
        if not isinstance(loaded, list) or not all(isinstance(p, list) for p in loaded):
            raise click.BadParameter("must be a JSON list of lists", param_hint="--points")
        bad = [
            (i, j)
            for i, p in enumerate(loaded)
            for j, c in enumerate(p)
            if isinstance(c, bool) or not isinstance(c, (int, float))
        ]
        if bad:
            i, j = bad[0]
            raise click.BadParameter(
                f"coordinates must be JSON numbers (point {i}, coordinate {j} is not; strings "
                "and booleans are never read as numbers)",
                param_hint="--points",
            )
        points = [[float(c) for c in p] for p in loaded]
    else:
        assert points_csv is not None
        rows = _csv_rows(points_csv)
        header = None
        if rows and not all(_is_number(c) for c in rows[0]):
            names = list(covariates())
            header = _header(rows, names)
        if header is not None:
            missing = [n for n in names if n not in header]
            if missing:
                raise click.BadParameter(
                    f"the header lacks covariate column(s) {', '.join(missing)}",
                    param_hint="--csv",
                )
            # a row of another length is misaligned (a short row, or a decimal comma that
            # splits a value in two): refused, as its values could be read for the wrong columns
            uneven = next(
                (i for i, r in enumerate(rows[1:], start=1) if len(r) != len(header)), None
            )
            if uneven is not None:
                raise click.BadParameter(
                    f"data row {uneven} has {len(rows[uneven])} values, the header {len(header)}",
                    param_hint="--csv",
                )
            columns = [header.index(n) for n in names]
            rows = [[r[j] for j in columns] for r in rows[1:]]
        points = []
        for i, r in enumerate(rows, start=1):
            try:
                points.append([_number(c) for c in r])
            except ValueError:
                j = next(j for j, c in enumerate(r) if not _is_number(c))
                known = list(covariates())
                column = f"'{known[j]}'" if j < len(known) else f"value {j + 1}"
                raise click.BadParameter(
                    f"every cell must be a number: data row {i}, column {column} is not one",
                    param_hint="--csv",
                ) from None
    if not points:
        raise click.BadParameter("no points", param_hint="--csv" if points_csv else "--points")
    infinite = next((i for i, p in enumerate(points) if any(not math.isfinite(c) for c in p)), None)
    if infinite is not None:
        raise click.BadParameter(f"coordinates must be finite (point {infinite + 1} is not)")
    return points


def read_ids(points_csv: Path | None, id_column: str | None) -> list[str] | None:
    """The ``--id-column`` values of ``--csv``'s data rows, in order (None without one)."""
    if id_column is None:
        return None
    if points_csv is None:
        raise click.UsageError("--id-column goes with --csv")
    rows = _csv_rows(points_csv)
    header = [c.strip() for c in rows[0]] if rows else []
    if id_column not in header:
        raise click.BadParameter(
            f"the header has no column {id_column!r}", param_hint="--id-column"
        )
    if header.count(id_column) > 1:
        raise click.BadParameter(
            f"the header names {id_column!r} more than once", param_hint="--id-column"
        )
    j = header.index(id_column)
    return [r[j] if j < len(r) else "" for r in rows[1:]]


def _covariates(state: State, dataset_id: str) -> Callable[[], list[str]]:
    def names() -> list[str]:
        schema = state.client.get_dataset(dataset_id).public_schema
        return [str(c["name"]) for c in schema.get("covariates", [])]

    return names


@release.command("predict")
@click.argument("release_id")
@with_points
@pass_state
def release_predict(
    state: State,
    release_id: str,
    points_json: str | None,
    points_csv: Path | None,
    id_column: str | None,
) -> None:
    """CATE of an ebm_cate or uplift_table release at points (free: no charge)."""

    def covariates() -> list[str]:
        return _covariates(state, state.client.get_release(release_id).dataset_id)()

    ids = read_ids(points_csv, id_column)
    points = read_points(points_json, points_csv, covariates)
    pr = state.client.predict(release_id, points)
    emit(
        state,
        lambda: render.prediction(pr, ids),
        lambda: {**pr.raw, **({"ids": ids} if ids is not None else {})},
    )


@cli.group()
def function() -> None:
    """Released CATE functions: public metadata and free evaluation (clients, analysts, owners)."""


@function.command("show")
@click.argument("function_id")
@pass_state
def function_show(state: State, function_id: str) -> None:
    """A function's status, basis, capacity, noise sd and public box (its id is the release id)."""
    info = state.client.function_info(function_id)
    emit(state, lambda: render.function_info(info), lambda: vars(info))


@function.command("evaluate")
@click.argument("function_id")
@with_points
@click.option(
    "--level",
    default=0.95,
    show_default=True,
    type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
    help="Level of the pointwise noise band, in (0, 1).",
)
@pass_state
def function_evaluate(
    state: State,
    function_id: str,
    points_json: str | None,
    points_csv: Path | None,
    id_column: str | None,
    level: float,
) -> None:
    """Evaluate a released CATE function at points (free; a repeated point gets the same value)."""

    def covariates() -> list[str]:
        return _covariates(state, state.client.function_info(function_id).dataset_id)()

    ids = read_ids(points_csv, id_column)
    points = read_points(points_json, points_csv, covariates)
    try:
        ev = state.client.evaluate_function(function_id, points)
    except ProblemError as exc:
        if exc.partial is None:
            raise
        # the batches before the refused one were answered (an exact-basis function stored them
        # and counts them against its capacity): show them, and say which were not answered
        done = exc.partial
        shown = None if ids is None else ids[: len(done.values)]
        emit(
            state,
            lambda: render.evaluation(done, level, shown),
            lambda: {
                **done.raw,
                "points": done.points,
                **({"ids": shown} if shown is not None else {}),
                "partial": True,
                "points_requested": len(points),
            },
        )
        answered = len(done.values)
        missing = f"points {answered + 1}-{len(points)}"
        if ids is not None:
            missing += f" (ids {ids[answered]} to {ids[-1]})"
        raise CliError(
            f"{exc.one_line()} -- the first {answered} of {len(points)} points were answered "
            f"(above); {missing} were not (pointers count from 0: #/points/{answered} is "
            f"point {answered + 1})"
        ) from None
    emit(
        state,
        lambda: render.evaluation(ev, level, ids),
        lambda: {**ev.raw, "points": ev.points, **({"ids": ids} if ids is not None else {})},
    )


def main(argv: list[str] | None = None) -> None:
    """The ``dpcurator`` entry point."""
    try:
        cli.main(args=argv, prog_name="dpcurator")
    except Exception as exc:  # pragma: no cover - the group already maps errors
        click.echo(f"error: unexpected {type(exc).__name__}: {exc}", err=True)
        sys.exit(1)
