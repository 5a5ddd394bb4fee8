"""Plain-text rendering for the CLI: aligned tables and key/value blocks."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from dpcurator.models import Budget, Dataset, LedgerEntry, Quote, Release
from dpcurator.results import (
    AteResult,
    CateVectorResult,
    EbmShapeResult,
    FunctionEvaluation,
    FunctionHandle,
    FunctionInfo,
    Prediction,
    TypedResult,
    UpliftTable,
    feature_label,
)


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, Decimal):
        return format(value.normalize(), "f") if value == value.to_integral() else str(value)
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """An aligned text table; numbers right-aligned."""
    raw = [list(row) for row in rows]
    cells = [[fmt(v) for v in row] for row in raw]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    numeric = [
        all(isinstance(r[i], int | float | Decimal) and not isinstance(r[i], bool) for r in raw)
        and bool(raw)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(widths[i]) if numeric[i] else v.ljust(widths[i]) for i, v in enumerate(values)
        ]
        return "  ".join(parts).rstrip()

    out = [line(list(headers)), line(["-" * w for w in widths])]
    out += [line(row) for row in cells]
    return "\n".join(out)


def pairs(items: Sequence[tuple[str, Any]]) -> str:
    width = max((len(k) for k, _ in items), default=0)
    return "\n".join(f"{k.ljust(width)}  {fmt(v)}" for k, v in items)


def budget(b: Budget) -> str:
    if not b.is_set:
        return "budget: not set"
    shown = table(
        ["", "total", "spent", "remaining"],
        [
            ["epsilon", b.epsilon_total, b.epsilon_spent, b.epsilon_remaining],
            ["delta", b.delta_total, b.delta_spent, b.delta_remaining],
        ],
    )
    return "\n".join([shown, *(f"warning: {w}" for w in b.warnings)])


def dataset(d: Dataset) -> str:
    schema = d.public_schema
    # 0-based positions (what effect_columns and adjustment_columns take) and declared roles
    covariates = ", ".join(
        f"{i} {c.get('name')} {_box(c)}{_roles(c)}"
        for i, c in enumerate(schema.get("covariates", []))
    )
    outcome = schema.get("outcome", {})
    head = pairs(
        [
            ("id", d.id),
            ("name", d.name),
            ("description", d.description or None),
            ("status", d.status),
            ("n", d.n),
            ("design", schema.get("design", "observational")),
            ("assignment probability", schema.get("treatment_probability")),
            ("treatment", schema.get("treatment", {}).get("name")),
            ("outcome", f"{outcome.get('name')} {_box(outcome)}" if outcome else None),
            ("covariates", covariates),
            ("out of bounds", schema.get("out_of_bounds")),
            ("missing values", schema.get("missing")),
            ("paper mode", d.allow_paper_mode),
            ("schema hash", d.schema_hash),
            ("created", d.created_at),
        ]
    )
    return head + "\n\n" + budget(d.budget)


def _box(column: dict[str, Any]) -> str:
    """A column's public values: its codes {0, 1} (with the owner's labels: {0 female, 1
    male}) or its bounds [lower, upper] and unit."""
    codes = column.get("codes")
    if codes:
        labels = column.get("code_labels") or {}
        shown = ", ".join(
            fmt(c) + (f" {labels[str(c)]}" if str(c) in labels else "") for c in codes[:10]
        )
        return "{" + shown + (", …}" if len(codes) > 10 else "}")
    unit = column.get("unit")
    return f"[{fmt(column.get('lower'))}, {fmt(column.get('upper'))}]" + (
        f" {unit}" if unit else ""
    )


def _ci_label(parsed: AteResult) -> str:
    """'95% CI', or where the simulations measured less, '95% CI (nominal; measured 0-75%)':
    a reader must not take such an interval at its level."""
    label = f"{parsed.ci_level:.0%} CI"
    measured = parsed.measured_coverage
    if measured is None or not parsed.below_nominal:
        return label
    low, high = measured
    return f"{label} (nominal; measured {100 * low:.0f}-{100 * high:.0f}%)"


def _chunks(raw: dict[str, Any]) -> str:
    """A subsample-and-aggregate result's chunks: how many, their size and their estimates."""
    estimates = raw.get("chunk_estimates") or []
    shown = ", ".join(f"{float(e):.4g}" for e in estimates)
    return (
        f"{raw.get('chunks')} of {raw.get('chunk_size')} rows (t interval over their "
        f"estimates: {shown})"
    )


def _contrast(treatment: dict[str, Any] | None) -> str | None:
    """What an effect compares: '<label of 1> minus <label of 0>' where the owner labelled
    the treatment's codes."""
    if not treatment:
        return None
    labels = treatment.get("code_labels") or {}
    name = treatment.get("name")
    treated = labels.get("1", f"{name} = 1")
    control = labels.get("0", f"{name} = 0")
    return f"{treated} minus {control}"


def _roles(covariate: dict[str, Any]) -> str:
    roles = [
        role
        for role, flag in (("adjustment set", "adjust_for"), ("effect modifier", "effect_modifier"))
        if covariate.get(flag)
    ]
    return f" ({', '.join(roles)})" if roles else ""


def datasets(items: Sequence[Dataset]) -> str:
    return table(
        ["id", "name", "n", "status", "eps spent", "eps total", "delta spent", "delta total"],
        [
            [
                d.id,
                d.name,
                d.n,
                d.status,
                d.budget.epsilon_spent,
                d.budget.epsilon_total,
                d.budget.delta_spent,
                d.budget.delta_total,
            ]
            for d in items
        ],
    )


def entry_note(e: LedgerEntry, names: Mapping[str, str] | None = None) -> str:
    """What a budget or grant entry set, from its details (a charge's are its mechanism)."""
    try:
        details = json.loads(e.details_json or "{}")
    except ValueError:
        return ""
    if not isinstance(details, dict):
        return ""
    if e.entry_type == "grant" and "grantee" in details:
        who = _who(str(details["grantee"]), names)
        if details.get("revoked"):
            return f"revoke {who}"
        caps = [
            f"{name} cap {details[key]}"
            for name, key in (("eps", "epsilon_cap"), ("delta", "delta_cap"))
            if details.get(key) is not None
        ]
        return f"grant {who}" + (f" ({', '.join(caps)})" if caps else "")
    if e.entry_type == "budget" and "epsilon_total" in details:
        return f"set eps {details['epsilon_total']}, delta {details.get('delta_total')}"
    if e.entry_type == "settings" and "allow_paper_mode" in details:
        return "paper mode " + ("allowed" if details["allow_paper_mode"] else "not allowed")
    return ""


def _who(principal_id: str, names: Mapping[str, str] | None) -> str:
    """A principal as the owner knows it: its name (and id prefix) where known, else the id."""
    name = (names or {}).get(principal_id)
    return f"{name} ({principal_id[:8]})" if name else principal_id[:12]


def ledger(entries: Sequence[LedgerEntry], names: Mapping[str, str] | None = None) -> str:
    """``names``: principal ids to names (an owner's principal listing), shown beside the ids."""
    return table(
        [
            "seq",
            "time",
            "type",
            "principal",
            "guarantee",
            "epsilon",
            "delta",
            "eps spent",
            "eps total",
            "delta spent",
            "delta total",
            "note",
        ],
        [
            [
                e.seq,
                e.created_at[:19].replace("T", " "),
                e.entry_type,
                _who(e.principal_id, names),
                e.guarantee,
                e.epsilon,
                e.delta,
                e.epsilon_spent,
                e.epsilon_total,
                e.delta_spent,
                e.delta_total,
                entry_note(e, names),
            ]
            for e in entries
        ],
    )


def quote(q: Quote) -> str:
    items: list[tuple[str, Any]] = [
        ("kind", q.kind),
        ("guarantee", q.guarantee),
        ("epsilon", q.epsilon),
        ("delta", q.delta),
        ("fits budget", q.fits_budget),
        *((("why not", q.budget_note),) if q.budget_note else ()),
        ("epsilon remaining", q.epsilon_remaining),
        ("delta remaining", q.delta_remaining),
    ]
    if q.cap_epsilon_remaining is not None:
        items.append(("epsilon left under your cap", q.cap_epsilon_remaining))
    if q.cap_delta_remaining is not None:
        items.append(("delta left under your cap", q.cap_delta_remaining))
    for key in _QUOTE_ACCURACY_KEYS:
        if key in q.accuracy:
            value = q.accuracy[key]
            if value is None and key in _QUOTE_SKIP_NULL:
                continue
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                value = "; ".join(value) if value else "none"
            label = _QUOTE_LABELS.get(key, key.replace("_", " "))
            if key == "min_half_width":
                if "expected_clip" in q.accuracy:
                    # at the smallest clip an adaptive release can draw: a bound no release
                    # comes near (a walkthrough read 9.57e-05 as the interval to expect)
                    continue
                label = "min half width (privacy noise alone)"
            items.append((label, value))
    coverage = q.accuracy.get("coverage")
    if isinstance(coverage, dict) and coverage.get("message"):
        items.append(("interval covers", coverage["message"]))
    alternative = q.accuracy.get("chunks_alternative")
    if isinstance(alternative, dict) and alternative.get("message"):
        items.append(("narrower with chunks", alternative["message"]))
    versus = q.accuracy.get("versus_ate")
    if isinstance(versus, dict) and versus.get("verdict"):
        items.append(("versus the ATE", versus["verdict"]))
        if versus.get("message"):
            items.append(("why", versus["message"]))
    return pairs(items)


# The accuracy fields a quote view shows, per kind where present (``--json`` shows all):
# ate; cate_vector; ebm_cate; uplift_table.
_QUOTE_ACCURACY_KEYS = (
    "basis",
    "estimator",
    "estimator_note",
    "ci_level",
    "chunks",
    "chunk_size",
    "expected_half_width",
    "min_half_width",
    "max_noise_half_width",
    "target_half_width",
    "epsilon_for_target_half_width",
    "target_message",
    "noise_sd_upper_bound",
    "noise_sd_lower_bound",
    "pointwise_noise_sd",
    "prediction_noise_sd",
    "learner",
    "fold_sizes",
    "pseudo_outcome_clip",
    "bound",
    "expected_clip",
    "approx_shape_noise_sd",
    "bins",
    "cells",
    "expected_records_per_cell",
    "approx_uplift_sd_per_cell",
    "suggested_bins",
    "warnings",
)

# Labels where the field name alone misreads; fields shown only when set.
_QUOTE_LABELS = {
    "max_noise_half_width": "noise half width at the declared bound (the worst case)",
    "pseudo_outcome_clip": "pseudo-outcome clip",
    "bound": (
        "pseudo-outcome bound (R_Y / c or your pseudo_outcome_clip; an adaptive clip's outer guard)"
    ),
    "expected_clip": "expected adaptive clip (at the assumed scale)",
    "approx_shape_noise_sd": "shape noise sd (one bin of one shape function, approx.)",
    "prediction_noise_sd": "prediction noise sd (one prediction, approx.)",
}
_QUOTE_SKIP_NULL = frozenset({"pseudo_outcome_clip", "expected_clip"})


def release(r: Release) -> str:
    items: list[tuple[str, Any]] = [
        ("id", r.id),
        ("dataset", r.dataset_id),
        ("kind", r.kind),
        ("status", r.status),
        ("guarantee", r.guarantee),
        ("epsilon", r.epsilon),
        ("delta", r.delta),
        ("cached", r.cached),
        ("created", r.created_at),
    ]
    if r.error is not None:
        items.append(("error", f"{r.error.title}: {r.error.detail}"))
    return pairs(items)


def releases(items: Sequence[Release]) -> str:
    return table(
        ["id", "kind", "status", "guarantee", "epsilon", "delta", "created"],
        [[r.id, r.kind, r.status, r.guarantee, r.epsilon, r.delta, r.created_at] for r in items],
    )


# Rows a long table shows before a one-line summary of the rest (``--all`` shows every row):
# an uplift table read off an ebm model can have 10,000+ cells.
MAX_ROWS = 40


def _capped(headers: Sequence[str], rows: Sequence[Sequence[Any]], max_rows: int | None) -> str:
    if max_rows is None or len(rows) <= max_rows:
        return table(headers, rows)
    hidden = len(rows) - max_rows
    return (
        table(headers, rows[:max_rows])
        + f"\n... {hidden} more rows of {len(rows)} (--all shows every row, --json the result)"
    )


def cell_ranges(
    partition: dict[str, Any], cells: int, names: Sequence[str] | None = None
) -> list[str] | None:
    """Each cell of a grid (row-major over the covariates) as the ranges of the covariates the
    grid cuts (``age [18, 54)``), from the public grid: its ``edges`` where it has them (cut
    points, the ebm estimator's bins), else its regular ``bins`` on the box; None for another
    partition or a grid whose shape does not match ``cells``."""
    if partition.get("type") != "grid":
        return None
    try:
        bins = [int(b) for b in partition["bins"]]
        lower = [float(v) for v in partition["lower"]]
        upper = [float(v) for v in partition["upper"]]
        if not bins or min(bins) < 1 or len(lower) != len(bins) or len(upper) != len(bins):
            return None
        regular = [
            [lo + (hi - lo) * k / b for k in range(b + 1)]
            for lo, hi, b in zip(lower, upper, bins, strict=True)
        ]
        edges = [[float(v) for v in edge] for edge in partition.get("edges") or regular]
    except (KeyError, TypeError, ValueError):
        return None
    if len(edges) != len(bins) or any(
        len(edge) != b + 1 for edge, b in zip(edges, bins, strict=True)
    ):
        return None
    total = 1
    for b in bins:
        total *= b
    if total != cells:
        return None
    codes = partition.get("codes")
    if not isinstance(codes, list) or len(codes) != len(bins):
        codes = [None] * len(bins)
    cut = [j for j, b in enumerate(bins) if b > 1]
    out = []
    for cell in range(cells):
        index, rest = [0] * len(bins), cell
        for j in reversed(range(len(bins))):
            rest, index[j] = divmod(rest, bins[j])
        parts = []
        for j in cut:
            low, high = edges[j][index[j]], edges[j][index[j] + 1]
            last = index[j] == bins[j] - 1
            name = names[j] if names and j < len(names) else f"x{j}"
            parts.append(_cell_range(name, low, high, last, codes[j]))
        out.append(", ".join(parts) or "all")
    return out


def _cell_range(name: str, low: float, high: float, last: bool, codes: Any) -> str:
    """One covariate's part of a cell's label: its range (``age [18, 54)``), or for a
    categorical covariate the declared codes inside it (``diabetes = 1``, ``stage in {2, 3}``)."""
    if isinstance(codes, list) and codes:
        inside = [c for c in codes if low <= float(c) and (float(c) < high or last)]
        if len(inside) == 1:
            return f"{name} = {inside[0]}"
        if inside:
            return f"{name} in {{{', '.join(str(c) for c in inside)}}}"
        return f"{name}: no code"
    return f"{name} [{low:.4g}, {high:.4g}{']' if last else ')'}"


def result(
    parsed: TypedResult, max_rows: int | None = MAX_ROWS, names: Sequence[str] | None = None
) -> str:
    """The human view of a result; tables longer than ``max_rows`` are cut (None: no cut).
    ``names``: the dataset's covariate names in schema order, to label EBM features."""
    if isinstance(parsed, AteResult):
        return pairs(
            [
                ("estimate", parsed.estimate),
                (_ci_label(parsed), f"[{parsed.ci_lower:.6g}, {parsed.ci_upper:.6g}]"),
                ("half width", parsed.half_width),
                *([("estimator", parsed.estimator)] if parsed.estimator else []),
                *([("nuisance models", parsed.nuisance)] if parsed.nuisance else []),
                *([("chunks", _chunks(parsed.raw))] if parsed.raw.get("chunks") else []),
                ("guarantee", parsed.guarantee),
                ("design", parsed.design),
                ("epsilon", parsed.epsilon),
                ("delta", parsed.delta),
                *([("interval covers", parsed.coverage_note)] if parsed.coverage_note else []),
            ]
        )
    if isinstance(parsed, UpliftTable):
        head = pairs(
            [
                ("cells", parsed.cells),
                ("estimator", parsed.raw.get("estimator")),
                ("guarantee", parsed.guarantee),
                ("epsilon", parsed.epsilon),
            ]
        )
        shrinkage = _shrinkage(parsed.raw)
        if shrinkage:
            head += "\n" + shrinkage
        adjusted = parsed.raw.get("adjusted_ate")
        covers = adjusted.get("coverage") if isinstance(adjusted, dict) else None
        if isinstance(covers, dict) and covers.get("message"):
            head += "\n" + pairs([("interval covers", covers["message"])])
        where = cell_ranges(parsed.partition, parsed.cells, names)
        columns = list(parsed.columns)
        rows = [[row.get(c) for c in parsed.columns] for row in parsed.rows]
        if where is not None:
            columns.insert(1, "where")
            for row, text in zip(rows, where, strict=True):
                row.insert(1, text)
        if any(c.startswith("counts") for c in parsed.columns):
            head += "\nnote: counts are DP noisy counts (one can be negative); not row counts"
        if "released_noise_sd" in parsed.columns:
            head += (
                "\nnote: uplift is the released value (shrunk towards the anchor) and "
                "released_noise_sd its privacy-noise sd; uplift_unshrunk and uplift_noise_sd "
                "are the raw table's"
            )
        return head + "\n\n" + _capped(columns, rows, max_rows)
    if isinstance(parsed, CateVectorResult):
        points = parsed.points or [[] for _ in parsed.estimates]
        body = _capped(
            ["point", "estimate"],
            [[fmt(p), e] for p, e in zip(points, parsed.estimates, strict=True)],
            max_rows,
        )
        head = _shrinkage(parsed.raw)
        return head + "\n\n" + body if head else body
    if isinstance(parsed, EbmShapeResult):
        return pairs(
            [
                ("ate", parsed.ate),
                ("learner", parsed.learner),
                ("guarantee", parsed.guarantee),
                ("epsilon", parsed.epsilon),
                ("delta", parsed.delta),
                (
                    "shape functions",
                    ", ".join(feature_label(f.feature, names) for f in parsed.shape_functions),
                ),
            ]
        ) + ("\n" + _shrinkage(parsed.raw) if _shrinkage(parsed.raw) else "")
    if isinstance(parsed, FunctionHandle):
        raw_fn: dict[str, Any] = parsed.raw
        items = [(k, v) for k, v in raw_fn.items() if not isinstance(v, dict | list)]
        return pairs([("function id", parsed.function_id), *items])
    raw: dict[str, Any] = parsed.raw
    return pairs([(k, v) for k, v in raw.items() if not isinstance(v, dict | list)])


NO_ANCHOR_INTERVAL = (
    "none given (this anchor is the release's own DP ATE of one fold, without an interval); "
    "an `ate` release gives the ATE with its interval"
)
# An epsilon-ADUM table's anchor (``anchor: "table"``): its cells' count-weighted mean over all
# rows (a walkthrough read the fold sentence above beside a table, where it is not true).
NO_TABLE_ANCHOR_INTERVAL = (
    "none given (this anchor is the table's own DP mean of its cells, count-weighted over all "
    "rows, without an interval); an `ate` release gives the ATE with its interval"
)


def _no_interval(raw: dict[str, Any]) -> str:
    return NO_TABLE_ANCHOR_INTERVAL if raw.get("anchor") == "table" else NO_ANCHOR_INTERVAL


def anchor_interval(raw: dict[str, Any]) -> tuple[float, float, float] | None:
    """(level, lower, upper) of an anchored CATE's anchor, where the result gives one: an
    anchor release's ``ate_anchor_interval``, or a one-cell uplift table's ``adjusted_ate``."""
    interval = raw.get("ate_anchor_interval")
    if isinstance(interval, dict) and "lower" in interval and "upper" in interval:
        level = float(interval.get("level", 0.95))
        return level, float(interval["lower"]), float(interval["upper"])
    adjusted = raw.get("adjusted_ate")
    if isinstance(adjusted, dict) and "ci_lower" in adjusted and "ci_upper" in adjusted:
        level = float(adjusted.get("ci_level", 0.95))
        return level, float(adjusted["ci_lower"]), float(adjusted["ci_upper"])
    return None


def _shrinkage(raw: dict[str, Any]) -> str:
    """An anchored CATE's anchor and factor: at factor 0 every estimate is the anchor."""
    if raw.get("shrinkage_factor") is None:
        return ""
    items: list[tuple[str, Any]] = [("ate anchor", raw.get("ate_anchor"))]
    interval = anchor_interval(raw)
    if interval is not None:
        level, lower, upper = interval
        items.append((f"ate anchor {level:.0%} CI", f"[{lower:.6g}, {upper:.6g}]"))
    else:
        items.append(("ate anchor CI", _no_interval(raw)))
    items.append(("shrinkage factor", raw.get("shrinkage_factor")))
    if raw.get("shrinkage_factor") == 0:
        items.append(
            ("note", "factor 0: no heterogeneity above the noise; every estimate is the anchor")
        )
    return pairs(items)


def function_info(info: FunctionInfo) -> str:
    box = info.box
    return pairs(
        [
            ("id", info.id),
            ("dataset", info.dataset_id),
            ("status", info.status),
            ("guarantee", info.public.get("guarantee")),
            ("basis", info.basis),
            ("q", info.q),
            ("outcome", f"{info.outcome['name']} {_box(info.outcome)}" if info.outcome else None),
            ("effect", _contrast(info.treatment)),
            ("covariates", _function_covariates(info)),
            ("t max", info.t_max),
            ("points per principal", info.points_per_principal),
            ("batch max", info.batch_max),
            ("bandwidth", info.public.get("bandwidth")),
            ("lambda0", info.public.get("lambda0")),
            ("pointwise noise sd", info.pointwise_noise_sd),
            ("shrinkage factor", info.shrinkage_factor),
            ("ate anchor", info.ate_anchor),
            ("anchor interval", _anchor_interval_text(info.public)),
            ("box lower", box[0] if box else None),
            ("box upper", box[1] if box else None),
        ]
    ) + _function_reading(info)


def _function_covariates(info: FunctionInfo) -> str | None:
    """The point's coordinates in order: names, with their bounds or codes and units where the
    server sends them."""
    if info.covariate_info:
        return "; ".join(f"{c.get('name')} {_box(c)}" for c in info.covariate_info)
    return ", ".join(info.covariates) if info.covariates else None


def _anchor_interval_text(public: dict[str, Any]) -> str | None:
    interval = anchor_interval(public)
    if interval is None:
        return None if public.get("ate_anchor") is None else "none given"
    level, lower, upper = interval
    return f"[{lower:.4g}, {upper:.4g}] ({level:.0%})"


def _function_reading(info: FunctionInfo) -> str:
    """How to read the answers, where the figures above alone would mislead."""
    notes = []
    given = anchor_interval(info.public) is not None
    if info.answers_the_ate_everywhere:
        notes.append(
            "shrinkage factor 0: no heterogeneity was detectable above the noise, so every "
            "answer is the DP ATE anchor, the same for every patient"
            + ("" if given else f"; its interval: {_no_interval(info.public)}")
        )
    if info.pointwise_noise_sd is None:
        notes.append(
            "no pointwise noise band: the ebm basis (and paper mode) has no public per-point "
            "noise sd" + ("; the anchor interval is the error bar of the ATE" if given else "")
        )
    return "".join(f"\nnote: {n}" for n in notes)


def evaluation(
    ev: FunctionEvaluation, level: float = 0.95, ids: Sequence[str] | None = None
) -> str:
    bands = ev.bands(level)
    headers = (["id"] if ids is not None else []) + ["point", "value"]
    if bands is not None:
        headers += [f"{level:.0%} noise band"]
    rows: list[list[Any]] = []
    for i, (p, v) in enumerate(zip(ev.points, ev.values, strict=True)):
        row: list[Any] = ([ids[i]] if ids is not None else []) + [fmt(p), v]
        if bands is not None:
            row.append(f"[{bands[i][0]:.4g}, {bands[i][1]:.4g}]")
        rows.append(row)
    footer = f"\n(guarantee {ev.guarantee}; free: no budget charged)"
    if ev.answers_the_ate_everywhere:
        interval = ev.ate_anchor_interval
        said = (
            f"its {interval['level']:.0%} interval as an ATE is "
            f"[{interval['lower']:.4g}, {interval['upper']:.4g}], the answers' error bar (at its "
            "own level), not a range for one patient's effect"
            if interval is not None
            else "this anchor has no interval (`dpcurator function show` says why)"
        )
        footer += (
            "\n(shrinkage factor 0: every answer is the DP ATE anchor, the same for every "
            f"patient; {said})"
        )
    elif bands is None:
        footer += (
            "\n(no noise band: this function has no public pointwise noise sd; "
            "`dpcurator function show` says how to read it)"
        )
    return table(headers, rows) + footer


def prediction(pr: Prediction, ids: Sequence[str] | None = None) -> str:
    rows = [
        ([ids[i]] if ids is not None else []) + [fmt(p), v]
        for i, (p, v) in enumerate(zip(pr.points, pr.predictions, strict=True))
    ]
    footer = f"\n({pr.kind}, guarantee {pr.guarantee}; free: no budget charged)"
    if pr.answers_the_ate_everywhere:
        footer += (
            "\n(shrinkage factor 0: every prediction is the DP ATE anchor, the same for every "
            "patient; `dpcurator release show` gives its interval where there is one)"
        )
    headers = (["id"] if ids is not None else []) + ["point", "cate"]
    return table(headers, rows) + footer
