"""Schemathesis against the live OpenAPI with owner, analyst, client and admin keys (issue 13.9).

A real server (``python -m service``, SQLite in a temporary directory) is started with a
dataset, its budget and grants set up through the API, a done ATE release and a released
CATE function, so that generated requests reach real objects as well as missing ones. Then
``schemathesis run`` is pointed at the served ``/openapi.json`` once per key, with the checks
``not_a_server_error`` (no 5xx), ``response_schema_conformance`` and
``content_type_conformance`` (every documented response matches its schema and media type),
over its examples, coverage, fuzzing and stateful phases.

``--quick`` (CI: ``.ci/run``) gives each key a short time budget; the full run a longer one.
Exit status 1 when any check failed for any key. Results (case counts per key, failures)
in ``bench/results/api_fuzz[-quick].json``.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

from bench.common import write_result
from tests.conftest import RCT_SCHEMA, synthetic_csv
from tests.live import live_server

ADMIN_KEY = "fuzz-admin-key"
CHECKS = "not_a_server_error,response_schema_conformance,content_type_conformance"
PHASES = "examples,coverage,fuzzing,stateful"


def _setup(base: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Principals, a dataset with budget and grants, a release and a function; returns the
    keys by role and the real identifiers by path parameter."""
    with httpx.Client(base_url=base, timeout=60) as c:

        def auth(key: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {key}"}

        keys: dict[str, str] = {"admin": ADMIN_KEY}
        ids: dict[str, str] = {}
        for role in ("owner", "analyst", "client"):
            r = c.post(
                "/v1/principals",
                json={"name": f"fuzz-{role}", "role": role},
                headers=auth(ADMIN_KEY),
            )
            r.raise_for_status()
            keys[role], ids[role] = r.json()["api_key"], r.json()["id"]
        r = c.post(
            "/v1/datasets",
            data={"name": "fuzz", "schema": json.dumps(RCT_SCHEMA)},
            files={"file": ("rows.csv", io.BytesIO(synthetic_csv(600).encode()), "text/csv")},
            headers=auth(keys["owner"]),
        )
        r.raise_for_status()
        dataset = r.json()["id"]
        c.put(
            f"/v1/datasets/{dataset}/budget",
            json={"epsilon_total": 1000.0, "delta_total": 0.1},
            headers=auth(keys["owner"]),
        ).raise_for_status()
        for role in ("analyst", "client"):
            c.put(
                f"/v1/datasets/{dataset}/grants/{ids[role]}",
                json={},
                headers=auth(keys["owner"]),
            ).raise_for_status()
        real: dict[str, list[str]] = {
            "dataset_id": [dataset],
            "principal_id": [ids["analyst"], ids["client"]],
            "release_id": [],
            "function_id": [],
        }
        for kind, params in (
            ("ate", {"epsilon": 1.0}),
            ("cate_function", {"epsilon": 1.0, "nuisance": "none", "t_max": 200}),
        ):
            r = c.post(
                f"/v1/datasets/{dataset}/releases",
                json={"kind": kind, "params": params},
                headers={**auth(keys["analyst"]), "Idempotency-Key": f"fuzz-{kind}"},
            )
            r.raise_for_status()
            release = r.json()["id"]
            real["release_id"].append(release)
            if kind == "cate_function":
                real["function_id"].append(release)
            deadline = time.time() + 120
            while c.get(f"/v1/releases/{release}", headers=auth(keys["analyst"])).json()[
                "status"
            ] not in ("done", "failed"):
                if time.time() > deadline:
                    raise RuntimeError("setup release did not finish")
                time.sleep(0.2)
        return keys, real


def _config(real: dict[str, list[str]], folder: Path) -> Path:
    """A schemathesis.toml whose path parameters are real identifiers 70 % of the time (the
    rest generated), so that requests reach stored objects and not only 404s."""
    lines = []
    for name, values in real.items():
        quoted = ", ".join(json.dumps(v) for v in values)
        lines += [f"[dictionaries.{name}]", f"values = [{quoted}]", ""]
    lines.append("[parameters]")
    for name in real:
        lines.append(f'"path.{name}" = {{ dictionary = "{name}", probability = 0.7 }}')
    path = folder / "schemathesis.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


_SUMMARY = re.compile(r"(\d+)\s+(passed|failed|errored|skipped)")


def _run(base: str, role: str, key: str, seconds: int, config: Path) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(config),
        "run",
        f"{base}/openapi.json",
        "--checks",
        CHECKS,
        "--phases",
        PHASES,
        "--max-time",
        str(seconds),
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "-H",
        f"Authorization: Bearer {key}",
        "--no-color",
    ]
    started = time.time()
    # run in the temporary folder: schemathesis keeps a crash cache in its working directory
    proc = subprocess.run(command, capture_output=True, text=True, check=False, cwd=config.parent)
    output = proc.stdout + proc.stderr
    counts: dict[str, int] = {}
    for number, label in _SUMMARY.findall(output.splitlines()[-1] if output else ""):
        counts[label] = int(number)
    cases = re.findall(r"(\d+) generated", output)
    return {
        "role": role,
        "exit_code": proc.returncode,
        "seconds": round(time.time() - started, 1),
        "summary_line": output.strip().splitlines()[-1] if output.strip() else "",
        "operations": counts,
        "test_cases": int(cases[-1]) if cases else None,
        "failures": _failures(output) if proc.returncode else [],
        "warnings": _warnings(output),
    }


def _warnings(output: str) -> list[str]:
    """schemathesis's warning headlines (coverage gaps such as operations never reached)."""
    text = output.split("WARNINGS", 1)[-1].split("SUMMARY", 1)[0] if "WARNINGS" in output else ""
    return [line.strip() for line in text.splitlines() if line[:1].isalpha()]


def _failures(output: str) -> list[str]:
    """The failure headlines of schemathesis's report (no response bodies)."""
    lines = [line.strip() for line in output.splitlines()]
    return [line for line in lines if line.startswith(("_", "- ", "FAILURES", "Server error"))][:40]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short CI run")
    parser.add_argument("--seconds", type=int, default=None, help="time budget per key")
    args = parser.parse_args()
    seconds = args.seconds or (25 if args.quick else 300)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'fuzz.sqlite3'}"
        env = {"CURATOR_MAX_UPLOAD_BYTES": "2000000", "CURATOR_LATENCY_BUCKETS": "[0.1]"}
        with live_server(url, admin_key=ADMIN_KEY, extra_env=env) as base:
            keys, real = _setup(base)
            config = _config(real, Path(tmp))
            runs = [_run(base, role, key, seconds, config) for role, key in keys.items()]
    for run in runs:
        print(f"{run['role']:8s} exit {run['exit_code']}  {run['summary_line']}", flush=True)
        for line in run["failures"]:
            print("   ", line)
    write_result(
        "api_fuzz",
        {
            "schemathesis_checks": CHECKS,
            "phases": PHASES,
            "seconds_per_key": seconds,
            "runs": runs,
            "all_passed": all(run["exit_code"] == 0 for run in runs),
        },
        quick=args.quick,
    )
    if not all(run["exit_code"] == 0 for run in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
