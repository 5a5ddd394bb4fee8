"""Upload of 10^6 rows x 20 columns: wall time and peak server memory, SQLite and PostgreSQL.

Targets (issue 2): <= 60 s and <= 1.5 GB peak server memory.
    python -m bench.upload            # 10^6 rows
    python -m bench.upload --quick    # 10^4 rows (CI smoke)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from bench.common import PeakRss, elapsed_since, fresh_postgres_database, write_result
from tests.live import live_server

ADMIN = "bench-admin-key"
Q = 18  # 18 covariates + treatment + outcome = 20 columns


def make_csv(path: Path, rows: int) -> None:
    rng = np.random.default_rng(1)
    cols: dict[str, Any] = {f"x{j}": np.round(rng.uniform(0, 1, rows), 5) for j in range(Q)}
    cols["t"] = rng.integers(0, 2, rows)
    cols["y"] = np.round(rng.normal(0, 1, rows), 5)
    pacsv.write_csv(pa.table(cols), path)


SCHEMA = {
    "covariates": [{"name": f"x{j}", "lower": 0, "upper": 1} for j in range(Q)],
    "treatment": {"name": "t"},
    "outcome": {"name": "y", "lower": -5, "upper": 5},
}


def measure(db_url: str, csv_path: Path) -> dict[str, Any]:
    env = {"CURATOR_START_JOB_RUNNER": "false", "CURATOR_MAX_UPLOAD_BYTES": str(2 * 1024**3)}
    with live_server(db_url, admin_key=ADMIN, extra_env=env) as base:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        owner = httpx.post(
            f"{base}/v1/principals", json={"name": "o", "role": "owner"}, headers=admin
        ).json()
        server_pid = _server_pid(base)
        with PeakRss(server_pid) as rss, csv_path.open("rb") as f:
            start = time.perf_counter()
            r = httpx.post(
                f"{base}/v1/datasets",
                data={"name": "big", "schema": json.dumps(SCHEMA)},
                files={"file": ("big.csv", f, "text/csv")},
                headers={"Authorization": f"Bearer {owner['api_key']}"},
                timeout=600,
            )
            seconds = elapsed_since(start)
        assert r.status_code == 201, r.text[:500]
        return {
            "seconds": seconds,
            "server_peak_rss_mib": round(rss.peak_kib / 1024, 1),
            "server_rss_before_mib": round(rss.baseline_kib / 1024, 1),
            "n": r.json()["n"],
        }


def _server_pid(base: str) -> int:
    # The live server is our child: find it by its listening port through /proc.
    import os

    port = base.rsplit(":", 1)[1]
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"CURATOR_PORT={port}".encode() in env:
            return int(pid)
    raise RuntimeError("server process not found")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", type=int, default=None)
    args = parser.parse_args()
    rows = args.rows or (10_000 if args.quick else 1_000_000)
    results: dict[str, Any] = {
        "rows": rows,
        "columns": Q + 2,
        "targets": {"seconds": 60, "peak_mib": 1536},
    }
    with tempfile.TemporaryDirectory() as tmp:
        csv_path = Path(tmp) / "big.csv"
        make_csv(csv_path, rows)
        results["csv_mib"] = round(csv_path.stat().st_size / 1024**2, 1)
        print(f"CSV: {rows} rows, {results['csv_mib']} MiB", flush=True)  # noqa: T201
        results["sqlite"] = measure(f"sqlite:///{tmp}/bench.sqlite3", csv_path)
        print("sqlite", results["sqlite"], flush=True)  # noqa: T201
        pg_url, drop = fresh_postgres_database()
        try:
            results["postgres"] = measure(pg_url, csv_path)
        finally:
            drop()
        print("postgres", results["postgres"], flush=True)  # noqa: T201
    for backend in ("sqlite", "postgres"):
        r = results[backend]
        r["meets_targets"] = r["seconds"] <= 60 and r["server_peak_rss_mib"] <= 1536
    out = write_result("upload", results, quick=args.quick)
    print(f"wrote {out}")  # noqa: T201


if __name__ == "__main__":
    main()
