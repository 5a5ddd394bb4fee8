"""200 concurrent release requests against a small budget, server on loopback.

Reports throughput, p50/p99 latency of the POST, how many were admitted, and the overspend
(spent - total, must be <= 0; admitted must equal the budget's capacity exactly), for SQLite
and PostgreSQL side by side.
    python -m bench.load            # 200 requests
    python -m bench.load --quick    # 100 requests (CI smoke; more than the 40 worker threads)
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2 as httpx
import numpy as np

from bench.common import fresh_postgres_database, write_result
from tests.conftest import RCT_SCHEMA, synthetic_csv
from tests.live import live_server

ADMIN = "bench-admin-key"
COST = 0.25
CAPACITY = 10  # the budget admits exactly this many releases of COST


def measure(db_url: str, requests: int) -> dict[str, Any]:
    env = {"CURATOR_LATENCY_BUCKETS": "[0.5, 1, 5]"}
    with live_server(db_url, admin_key=ADMIN, extra_env=env) as base:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        owner = httpx.post(
            f"{base}/v1/principals", json={"name": "o", "role": "owner"}, headers=admin
        ).json()
        oh = {"Authorization": f"Bearer {owner['api_key']}"}
        ds = httpx.post(
            f"{base}/v1/datasets",
            data={"name": "load", "schema": json.dumps(RCT_SCHEMA)},
            files={"file": ("r.csv", synthetic_csv(2000).encode(), "text/csv")},
            headers=oh,
        ).json()
        httpx.put(
            f"{base}/v1/datasets/{ds['id']}/budget",
            json={"epsilon_total": COST * CAPACITY, "delta_total": 1e-3},
            headers=oh,
        )
        keys = []
        for i in range(10):
            a = httpx.post(
                f"{base}/v1/principals", json={"name": f"a{i}", "role": "analyst"}, headers=admin
            ).json()
            httpx.put(f"{base}/v1/datasets/{ds['id']}/grants/{a['id']}", json={}, headers=oh)
            keys.append(a["api_key"])

        limits = httpx.Limits(max_connections=requests, max_keepalive_connections=requests)
        with httpx.Client(limits=limits, timeout=120) as client:

            def one(i: int) -> tuple[int, float]:
                t0 = time.perf_counter()
                r = client.post(
                    f"{base}/v1/datasets/{ds['id']}/releases",
                    json={
                        "kind": "ate",
                        "params": {"epsilon": COST, "nuisance": "none"},
                        "fresh": True,
                    },
                    headers={
                        "Authorization": f"Bearer {keys[i % 10]}",
                        "Idempotency-Key": uuid.uuid4().hex,
                    },
                )
                return r.status_code, time.perf_counter() - t0

            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=requests) as pool:
                out = list(pool.map(one, range(requests)))
            wall = time.perf_counter() - start
        budget = httpx.get(f"{base}/v1/datasets/{ds['id']}/budget", headers=oh).json()
        verify = httpx.get(f"{base}/v1/datasets/{ds['id']}/ledger/verify", headers=oh).json()
    codes = [c for c, _ in out]
    lat = np.array([t for _, t in out]) * 1000
    return {
        "requests": requests,
        "wall_seconds": round(wall, 3),
        "throughput_rps": round(requests / wall, 1),
        "latency_ms_p50": round(float(np.percentile(lat, 50)), 1),
        "latency_ms_p99": round(float(np.percentile(lat, 99)), 1),
        "admitted_202": codes.count(202),
        "refused_409": codes.count(409),
        "other_status": sorted({c for c in codes if c not in (202, 409)}),
        "capacity": CAPACITY,
        "epsilon_total": budget["epsilon_total"],
        "epsilon_spent": budget["epsilon_spent"],
        "overspend_epsilon": round(budget["epsilon_spent"] - budget["epsilon_total"], 15),
        "ledger_valid": verify["valid"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    requests = 100 if args.quick else 200
    results: dict[str, Any] = {}
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite"] = measure(f"sqlite:///{tmp}/load.sqlite3", requests)
    print("sqlite", results["sqlite"], flush=True)  # noqa: T201
    url, drop = fresh_postgres_database()
    try:
        results["postgres"] = measure(url, requests)
    finally:
        drop()
    print("postgres", results["postgres"], flush=True)  # noqa: T201
    ok = all(
        r["admitted_202"] == CAPACITY
        and r["overspend_epsilon"] <= 0
        and r["ledger_valid"]
        and not r["other_status"]
        for r in (results["sqlite"], results["postgres"])
    )
    results["pass"] = ok
    out = write_result("load", results, quick=args.quick)
    print(f"wrote {out}")  # noqa: T201
    if not ok:
        raise SystemExit("load check failed: overspend or wrong admission count")


if __name__ == "__main__":
    main()
