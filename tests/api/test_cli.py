"""``dpcurator`` against a real server process on loopback (SQLite and PostgreSQL).

Commands run in-process through click's runner (the server is a real process); one test runs the
module entry point as a subprocess to check exit codes and that no traceback is ever printed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from dpcurator.cli import cli
from tests.api.test_client import module_server
from tests.conftest import ADMIN_KEY

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "examples" / "data"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def live_url(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from module_server(request)


class Dpcurator:
    def __init__(self, url: str) -> None:
        self.url = url
        self.runner = CliRunner()

    def __call__(self, key: str, *args: str, code: int = 0) -> Result:
        result = self.runner.invoke(
            cli,
            list(args),
            env={"CURATOR_URL": self.url, "CURATOR_KEY": key},
            catch_exceptions=False,
        )
        assert result.exit_code == code, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.output
        return result

    def json(self, key: str, *args: str) -> Any:
        return json.loads(self(key, "--json", *args).stdout)


@pytest.fixture
def run(live_url: str) -> Dpcurator:
    return Dpcurator(live_url)


@pytest.fixture
def study(run: Dpcurator) -> dict[str, str]:
    """Owner and analyst keys; the RCT example uploaded with a budget (via the CLI)."""
    owner = run.json(ADMIN_KEY, "principal", "create", "Data office", "--role", "owner")
    analyst = run.json(ADMIN_KEY, "principal", "create", "Statistician", "--role", "analyst")
    uploaded = run.json(
        owner["api_key"],
        "dataset",
        "upload",
        str(DATA / "trial.csv"),
        "--schema",
        str(DATA / "schema.json"),
        "--name",
        "Trial 2026",
        "--epsilon",
        "3",
        "--delta",
        "1e-4",
    )
    assert uploaded["ingest_report"]["n"] == 4000
    assert uploaded["budget"]["epsilon_total"] == 3.0
    return {
        "owner": owner["api_key"],
        "analyst": analyst["api_key"],
        "analyst_id": analyst["id"],
        "analyst_name": analyst["name"],
        "dataset": uploaded["id"],
    }


def test_owner_and_analyst_workflow(run: Dpcurator, study: dict[str, str], tmp_path: Path) -> None:
    owner, analyst, ds = study["owner"], study["analyst"], study["dataset"]
    granted = run(owner, "grant", "add", ds, study["analyst_id"], "--epsilon-cap", "2")
    assert "granted" in granted.stdout
    # a cap not given stays (the API replaces both: a --delta-cap had removed the epsilon cap)
    kept = run(owner, "grant", "add", ds, study["analyst_id"], "--delta-cap", "1e-5").stdout
    assert "epsilon cap 2" in kept
    assert "delta cap 1e-05" in kept
    cleared = run(owner, "grant", "add", ds, study["analyst_id"], "--no-delta-cap").stdout
    assert "epsilon cap 2" in cleared
    assert "delta cap -" in cleared
    # granting a revoked grant again keeps its caps likewise
    run(owner, "grant", "revoke", ds, study["analyst_id"])
    again = run(owner, "grant", "add", ds, study["analyst_id"], "--delta-cap", "1e-5").stdout
    assert "epsilon cap 2" in again
    listed = run(owner, "grant", "list", ds).stdout
    assert study["analyst_id"] in listed
    assert study["analyst_name"] in listed  # the owner sees whom, not only an id
    run(owner, "dataset", "update", ds, "--description", "phase III")
    assert "phase III" in run(owner, "dataset", "show", ds).stdout
    budget = run(owner, "budget", "set", ds, "--epsilon", "3.5").stdout  # delta total kept
    assert "0.0001" in budget
    assert "Trial 2026" in run(analyst, "dataset", "list").stdout
    shown = run(analyst, "dataset", "show", ds).stdout
    assert "rct" in shown
    assert "epsilon" in shown

    quote = run(analyst, "release", "quote", ds, "-p", "epsilon=1.0", "-p", "nuisance=none")
    assert "fits budget" in quote.stdout
    assert "expected half width" in quote.stdout
    assert "interval covers" in quote.stdout
    assert "Randomised design" in quote.stdout
    uplift = run(analyst, "release", "quote", ds, "--kind", "uplift_table", "-p", "epsilon=1")
    assert "suggested bins" in uplift.stdout  # the kind's own accuracy fields are shown
    assert "min half width" not in uplift.stdout

    req = run(
        analyst, "release", "request", ds, "-p", "epsilon=1", "--params", '{"nuisance": "none"}'
    )
    assert "estimate" in req.stdout
    assert "95% CI" in req.stdout
    assert "interval covers" in req.stdout
    assert "charged epsilon 1" in req.stderr
    releases = run.json(analyst, "release", "list", ds)
    assert [r["status"] for r in releases] == ["done"]
    rid = releases[0]["id"]
    # every id the request printed is the whole id, the one `release show` takes (its
    # progress line used to print a 12-character prefix that show refused)
    printed = re.findall(r"release ([0-9a-f]{6,})", req.stderr)
    assert printed
    assert set(printed) == {rid}
    assert "estimate" in run(analyst, "release", "show", rid).stdout
    assert "estimate" in run(analyst, "release", "wait", rid).stdout
    plot = tmp_path / "ate.png"
    run(analyst, "release", "plot", rid, "-o", str(plot), "--reference", "1.0")
    assert plot.read_bytes()[:8] == PNG_MAGIC

    spend = run(owner, "budget", "show", ds).stdout
    assert "remaining" in spend
    ledger = run(owner, "ledger", "show", ds).stdout
    assert "charge" in ledger
    assert "create" in ledger
    # whom, not only an id: the analyst's charges and grant carry its name
    assert f"grant {study['analyst_name']} (" in ledger
    assert study["analyst_name"] in ledger.split("charge")[1]
    exported = tmp_path / "ledger.csv"
    run(owner, "ledger", "export", ds, "-o", str(exported))
    assert exported.read_text().startswith("seq,entry_type")
    as_json = json.loads(run(owner, "ledger", "export", ds, "--format", "json").stdout)
    assert as_json[-1]["entry_type"] == "charge"
    assert "valid:" in run(owner, "ledger", "verify", ds).stdout
    png = tmp_path / "spend.png"
    run(owner, "ledger", "plot", ds, "-o", str(png))
    assert png.read_bytes()[:8] == PNG_MAGIC
    run(owner, "grant", "revoke", ds, study["analyst_id"])
    run(analyst, "release", "quote", ds, "-p", "epsilon=1", code=1)


def test_no_wait_then_wait(run: Dpcurator, study: dict[str, str]) -> None:
    owner, analyst, ds = study["owner"], study["analyst"], study["dataset"]
    run(owner, "grant", "add", ds, study["analyst_id"])
    created = run.json(
        analyst, "release", "request", ds, "--no-wait", "-p", "epsilon=0.5", "-p", "nuisance=none"
    )
    assert created["status"] in ("queued", "running", "done")
    done = run.json(analyst, "release", "wait", created["id"])
    assert done["status"] == "done"
    assert done["result"]["ci_lower"] < done["result"]["ci_upper"]
    again = run(analyst, "release", "request", ds, "-p", "epsilon=0.5", "-p", "nuisance=none")
    assert "identical release is stored" in again.stderr
    other = run.json(analyst, "release", "request", ds, "-p", "epsilon=0.2", "-p", "nuisance=none")
    listed = run.json(analyst, "release", "list", ds)
    assert [r["id"] for r in listed] == [created["id"], other["id"]]
    newest = run.json(analyst, "release", "list", ds, "--limit", "1", "--newest")
    assert [r["id"] for r in newest] == [other["id"]]
    skipped = run.json(analyst, "release", "list", ds, "--offset", "1")
    assert [r["id"] for r in skipped] == [other["id"]]


def test_principal_key_lifecycle(run: Dpcurator) -> None:
    """The admin disables and enables a principal; a principal replaces its own key."""
    made = run.json(ADMIN_KEY, "principal", "create", "Ward dashboard", "--role", "client")
    key = made["api_key"]
    assert run.json(key, "whoami")["id"] == made["id"]
    assert run.json(ADMIN_KEY, "principal", "disable", made["id"])["disabled"] is True
    refused = run(key, "whoami", code=1)
    assert "API key is not valid" in refused.stderr
    listed = run(ADMIN_KEY, "principal", "list").stdout
    assert made["key_prefix"] in listed
    assert "yes" in listed
    run(ADMIN_KEY, "principal", "enable", made["id"])
    replaced = run.json(key, "principal", "new-key")
    assert replaced["api_key"] != key
    run(key, "whoami", code=1)
    assert run.json(replaced["api_key"], "whoami")["id"] == made["id"]
    # the account record: every change, with who made it
    record = run.json(ADMIN_KEY, "principal", "events", made["id"])
    assert [(e["event"], e["actor_id"]) for e in record] == [
        ("created", "admin"),
        ("disabled", "admin"),
        ("enabled", "admin"),
        ("key_replaced", made["id"]),
    ]
    table = run(replaced["api_key"], "principal", "events").stdout
    assert "key_replaced" in table
    assert replaced["key_prefix"] in table
    assert "valid: 4 entries" in run(replaced["api_key"], "principal", "events", "--verify").stdout


def test_errors_are_one_line_with_exit_status(run: Dpcurator, study: dict[str, str]) -> None:
    owner, analyst, ds = study["owner"], study["analyst"], study["dataset"]
    run(owner, "grant", "add", ds, study["analyst_id"])
    too_much = run(
        analyst, "release", "request", ds, "-p", "epsilon=5", "-p", "nuisance=none", code=1
    )
    assert too_much.stderr.startswith("error: budget-exhausted (409)")
    assert too_much.stderr.count("\n") == 1
    assert run(
        analyst, "budget", "set", ds, "--epsilon", "9", "--delta", "1e-5", code=1
    ).stderr.startswith("error: forbidden (403)")
    invalid = run(analyst, "release", "quote", ds, "-p", "epsilon=-1", code=1)
    assert "validation-failed (422)" in invalid.stderr
    assert "params/epsilon" in invalid.stderr
    assert "unauthenticated (401)" in run("wrong-key", "dataset", "list", code=1).stderr
    assert "not-found (404)" in run(owner, "ledger", "show", "nope", code=1).stderr
    bad_csv = run(
        owner,
        "dataset",
        "upload",
        str(DATA / "observational.csv"),
        "--schema",
        str(DATA / "schema.json"),
        "--name",
        "x",
        code=1,
    )
    assert "invalid-csv (422)" in bad_csv.stderr
    assert "NAME=VALUE" in run(analyst, "release", "quote", ds, "-p", "epsilon", code=2).stderr
    missing = run(owner, "dataset", "upload", "missing.csv", "--schema", "x", "--name", "x", code=2)
    assert "does not exist" in missing.stderr


def test_a_european_excel_export_uploads_with_its_format(
    run: Dpcurator, study: dict[str, str], tmp_path: Path
) -> None:
    owner = study["owner"]
    # the example trial as Excel's 'CSV' on a European Windows: semicolons, decimal commas, cp1252
    european = tmp_path / "trial-eu.csv"
    text = (DATA / "trial.csv").read_text(encoding="utf-8")
    european.write_bytes(text.replace(",", ";").replace(".", ",").encode("cp1252"))
    args = ["dataset", "upload", str(european), "--schema", str(DATA / "schema.json")]
    refused = run(owner, *args, "--name", "EU", code=1)
    assert "not a number" in refused.stderr
    assert "csv_format" in refused.stderr
    checked = run(owner, "dataset", "check", *args[2:], "--decimal-comma", "--encoding", "cp1252")
    assert "an upload would keep 4000 rows (nothing was stored)" in checked.stdout
    options = ["--name", "EU", "--decimal-comma", "--encoding", "cp1252"]
    read = run.json(owner, *args, *options)
    assert read["n"] == 4000
    assert read["ingest_report"]["csv_format"]["delimiter"] == ";"
    shown = run(owner, *args, *options).stdout
    assert "read as" in shown
    assert "delimiter ';', decimal ',', cp1252" in shown
    # the arm as text, read through declared labels
    worded = tmp_path / "trial-words.csv"
    lines = text.splitlines()
    head = lines[0].split(",")
    arm = head.index("treated")
    rows = [line.split(",") for line in lines[1:]]
    for row in rows:
        row[arm] = {"0": "control", "1": "treated"}[row[arm]]
    worded.write_text("\n".join([lines[0], *(",".join(r) for r in rows)]) + "\n")
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"treated": {"control": 0, "treated": 1}}))
    schema = str(DATA / "schema.json")
    checked = run(
        owner, "dataset", "check", str(worded), "--schema", schema, "--labels", str(labels)
    )
    assert "an upload would keep 4000 rows" in checked.stdout
    assert "labels for treated" in checked.stdout


def test_function_show_and_evaluate(run: Dpcurator, study: dict[str, str], tmp_path: Path) -> None:
    owner, analyst, ds = study["owner"], study["analyst"], study["dataset"]
    run(owner, "grant", "add", ds, study["analyst_id"])
    ward = run.json(ADMIN_KEY, "principal", "create", "Ward", "--role", "client")
    run(owner, "grant", "add", ds, ward["id"])
    # unanchored, so the answers carry the pointwise noise and the table draws its band
    params = '{"nuisance": "none", "basis": "nystrom", "n_centres": 32, "shrinkage": "none"}'
    fn = run.json(
        analyst,
        "release",
        "request",
        ds,
        "--kind",
        "cate_function",
        "-p",
        "epsilon=1",
        "--params",
        params,
    )
    assert fn["status"] == "done"
    fid = fn["id"]
    before = run.json(owner, "budget", "show", ds)
    assert before["epsilon_spent"] == 1.0

    shown = run(ward["api_key"], "function", "show", fid).stdout
    assert "nystrom" in shown
    assert "pointwise noise sd" in shown
    info = run.json(ward["api_key"], "function", "show", fid)
    assert (info["id"], info["dataset_id"], info["q"]) == (fid, ds, 3)

    points = "[[50, 0.3, 1], [70, 0.9, 0]]"
    table = run(ward["api_key"], "function", "evaluate", fid, "--points", points).stdout
    assert "95% noise band" in table
    assert "no budget charged" in table
    first = run.json(ward["api_key"], "function", "evaluate", fid, "--points", points)
    assert first["function_id"] == fid
    assert first["guarantee"] == "strict"
    assert first["pointwise_noise_sd"] > 0
    assert first["points"] == [[50.0, 0.3, 1.0], [70.0, 0.9, 0.0]]
    # the same patients from a CSV file: covariate columns by name, in any order, ids ignored
    patients = tmp_path / "patients.csv"
    patients.write_text("patient_id,sex,severity,age\nP1,1,0.3,50\nP2,0,0.9,70\n")
    again = run.json(ward["api_key"], "function", "evaluate", fid, "--csv", str(patients))
    assert again["values"] == first["values"]  # identical answers for repeated points
    # --id-column maps each answer back to its patient by name
    by_csv = ("function", "evaluate", fid, "--csv", str(patients), "--id-column")
    named = run.json(ward["api_key"], *by_csv, "patient_id")
    assert named["ids"] == ["P1", "P2"]
    assert named["values"] == first["values"]
    shown_ids = run(ward["api_key"], *by_csv, "patient_id").stdout
    assert shown_ids.splitlines()[0].split()[0] == "id"
    assert "P2" in shown_ids
    wrong = run(ward["api_key"], *by_csv, "mrn", code=2)
    assert "no column 'mrn'" in wrong.stderr
    bare = tmp_path / "bare.csv"
    bare.write_text("50,0.3,1\n70,0.9,0\n")
    assert (
        run.json(analyst, "function", "evaluate", fid, "--csv", str(bare))["values"]
        == (first["values"])
    )
    assert run.json(owner, "budget", "show", ds) == before  # evaluations are free

    missing = tmp_path / "missing.csv"
    missing.write_text("patient_id,age,sex\nP1,50,1\n")
    err = run(ward["api_key"], "function", "evaluate", fid, "--csv", str(missing), code=2)
    assert "severity" in err.stderr
    run(ward["api_key"], "function", "evaluate", fid, code=2)  # neither --points nor --csv
    out = run(ward["api_key"], "function", "evaluate", fid, "--points", "[[500, 0.3, 1]]", code=1)
    assert out.stderr.startswith("error: validation-failed (422)")
    assert (
        "error: not-found (404)" in run(ward["api_key"], "function", "show", "nope", code=1).stderr
    )


def test_release_predict(run: Dpcurator, study: dict[str, str], tmp_path: Path) -> None:
    owner, analyst, ds = study["owner"], study["analyst"], study["dataset"]
    run(owner, "grant", "add", ds, study["analyst_id"])
    table = run.json(
        analyst,
        "release",
        "request",
        ds,
        "--kind",
        "uplift_table",
        "-p",
        "epsilon=1",
        "-p",
        "bins=[2, 2, 2]",
    )
    assert table["status"] == "done"
    shown = run(analyst, "release", "show", table["id"]).stdout
    assert "uplift_noise_sd" in shown
    spent = run.json(owner, "budget", "show", ds)["epsilon_spent"]
    points = tmp_path / "points.csv"
    points.write_text("age,severity,sex\n30,0.2,0\n80,0.8,1\n")
    text = run(analyst, "release", "predict", table["id"], "--csv", str(points)).stdout
    assert "uplift_table" in text
    pred = run.json(analyst, "release", "predict", table["id"], "--points", "[[30, 0.2, 0]]")
    assert pred["kind"] == "uplift_table"
    assert len(pred["predictions"]) == 1
    assert run.json(owner, "budget", "show", ds)["epsilon_spent"] == spent
    bad = run(analyst, "release", "predict", table["id"], "--points", "[[30, 2, 0]]", code=1)
    assert bad.stderr.startswith("error: validation-failed (422)")
    assert "points/0/1" in bad.stderr
    run(analyst, "release", "predict", table["id"], "--points", "not json", code=2)


def test_entry_point_never_prints_a_traceback(live_url: str) -> None:
    env = {**os.environ, "CURATOR_URL": live_url, "CURATOR_KEY": "wrong-key"}
    cmd = [sys.executable, "-m", "dpcurator.cli"]
    proc = subprocess.run(
        [*cmd, "dataset", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: unauthenticated (401)")
    assert "Traceback" not in proc.stderr
    down = subprocess.run(
        [*cmd, "--url", "http://127.0.0.1:9", "health"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert down.returncode == 1
    assert down.stderr.startswith("error: cannot reach http://127.0.0.1:9")
    assert "Traceback" not in down.stderr
    ok = subprocess.run([*cmd, "health"], env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "ready" in ok.stdout


def _commands_in_guides() -> list[list[str]]:
    found = []
    for guide in sorted((ROOT / "docs").glob("guide-*.md")):
        text = guide.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            line = line.strip().split("  #")[0]
            if line.startswith("dpcurator "):
                found.append(shlex.split(line)[1:])
    return found


def test_guides_use_real_commands_and_options() -> None:
    commands = _commands_in_guides()
    assert len(commands) > 20
    for args in commands:
        command: click.Command = cli
        params = {o for p in cli.params for o in p.opts}
        words = [a for a in args if not a.startswith("-")]
        i = 0
        while isinstance(command, click.Group):
            # skip the global options' values before the subcommand
            while args[i].startswith("-"):
                i += 2 if args[i] in ("--url", "--key", "--timeout") else 1
            sub = command.get_command(click.Context(command), args[i])
            assert sub is not None, args
            command, i = sub, i + 1
        params |= {o for p in command.params for o in p.opts + p.secondary_opts}
        for a in args:
            if a.startswith("-"):
                assert a in params, (args, a)
        assert words
