"""Strict ATE at n = 10^6 end to end THROUGH THE SERVICE, SQLite and PostgreSQL side by side.

A real server on loopback: the owner uploads PrivATE Dataset 2 (p = 24, benchmarks.md §4.1; 26
columns), sets a budget and grants an analyst; the analyst asks a quote, requests a release
(epsilon = 1, default delta) and polls it, recording when each job stage (``progress``,
``stage``) is first seen. Reported: wall seconds per stage, total, the server's peak RSS, and the
release's estimate / CI against the true ATE (1.0).

Completion is padded to public latency buckets by the job layer; this bench sets
``CURATOR_LATENCY_BUCKETS=[1]`` (padding to the next whole second) so the stage times are the
computation's. Polling every 0.2 s bounds the stage-time resolution.

    python -m bench.ate_service            # n = 10^6
    python -m bench.ate_service --quick    # n = 10^4 (CI smoke)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx2 as httpx
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from bench.common import PeakRss, elapsed_since, fresh_postgres_database, write_result
from bench.dgp import TAU, make_dgp, schema
from bench.upload import _server_pid
from tests.live import live_server

ADMIN = "bench-admin-key"
DGP = "dataset2"
EPSILON = 1.0
# Release requests, each its own charged release; a 422 (unsupported option) is recorded.
REQUESTS: tuple[dict[str, Any], ...] = (
    {"epsilon": EPSILON},  # defaults: strict AIPW, DP-EBM nuisances, 25/25/50 split
    {"epsilon": EPSILON, "nuisance": "dp_linear"},
    {"epsilon": EPSILON, "nuisance": "dp_linear", "cross_fit": True},
    {"epsilon": EPSILON, "estimator": "ipw"},
)


def make_csv(path: Path, rows: int) -> None:
    dgp = make_dgp(DGP)
    arrays = dgp.sample(rows, np.random.default_rng(7))
    cols: dict[str, Any] = {f"x{j}": np.round(arrays.x[:, j], 6) for j in range(dgp.p)}
    cols["a"] = arrays.a.astype(np.int64)
    cols["y"] = np.round(arrays.y, 6)
    pacsv.write_csv(pa.table(cols), path)


def _get_json(client: httpx.Client, url: str, headers: dict[str, str]) -> dict[str, Any]:
    """GET with a few retries: under load, a pooled keep-alive connection can be reset."""
    for attempt in range(5):
        try:
            response = client.get(url, headers=headers)
            return dict(response.json())
        except httpx.TransportError:
            if attempt == 4:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def _release(
    client: httpx.Client, base: str, dataset_id: str, key: str, params: dict[str, Any]
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    t0 = time.perf_counter()
    quote = client.post(
        f"{base}/v1/datasets/{dataset_id}/quotes",
        json={"kind": "ate", "params": params},
        headers=headers,
    )
    out: dict[str, Any] = {"params": params, "quote_status": quote.status_code}
    if quote.status_code != 200:
        out["quote_error"] = quote.json().get("type")
        return out
    out["quote_seconds"] = elapsed_since(t0)
    out["quote_min_half_width"] = quote.json()["accuracy"].get("min_half_width")
    t0 = time.perf_counter()
    created = client.post(
        f"{base}/v1/datasets/{dataset_id}/releases",
        json={"kind": "ate", "params": params},
        headers={**headers, "Idempotency-Key": uuid.uuid4().hex},
    )
    out["accept_seconds"] = elapsed_since(t0)
    out["accept_status"] = created.status_code
    if created.status_code != 202:
        out["accept_error"] = created.json().get("type")
        return out
    release_id = created.json()["id"]
    stages: dict[str, float] = {}
    body: dict[str, Any] = {}
    while True:
        body = _get_json(client, f"{base}/v1/releases/{release_id}", headers)
        stages.setdefault(f"{body['status']}:{body['stage']}", elapsed_since(t0))
        if body["status"] in ("done", "failed"):
            break
        if time.perf_counter() - t0 > 1800:
            out["timeout"] = True
            break
        time.sleep(0.2)
    out["status"] = body["status"]
    out["total_seconds"] = elapsed_since(t0)
    out["stages_first_seen_seconds"] = stages
    if body.get("result"):
        r = body["result"]
        out["result"] = {
            k: r.get(k)
            for k in ("estimate", "ci_lower", "ci_upper", "half_width", "nuisance", "fold_sizes")
        }
        out["covers_true_ate"] = r["ci_lower"] <= TAU <= r["ci_upper"]
    if body.get("error"):
        out["error"] = body["error"].get("type")
    return out


def measure(db_url: str, csv_path: Path) -> dict[str, Any]:
    env = {
        "CURATOR_LATENCY_BUCKETS": "[1]",
        "CURATOR_MAX_UPLOAD_BYTES": str(2 * 1024**3),
    }
    timings: dict[str, Any] = {"load_average_before": [round(v, 2) for v in os.getloadavg()]}
    with live_server(db_url, admin_key=ADMIN, extra_env=env) as base:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        with httpx.Client(timeout=1800) as client, PeakRss(_server_pid(base)) as rss:
            owner = client.post(
                f"{base}/v1/principals", json={"name": "o", "role": "owner"}, headers=admin
            ).json()
            analyst = client.post(
                f"{base}/v1/principals", json={"name": "a", "role": "analyst"}, headers=admin
            ).json()
            oh = {"Authorization": f"Bearer {owner['api_key']}"}
            t0 = time.perf_counter()
            with csv_path.open("rb") as f:
                ds = client.post(
                    f"{base}/v1/datasets",
                    data={"name": "ate-bench", "schema": json.dumps(schema(make_dgp(DGP)))},
                    files={"file": ("d.csv", f, "text/csv")},
                    headers=oh,
                )
            timings["upload_seconds"] = elapsed_since(t0)
            if ds.status_code != 201:
                raise RuntimeError(f"upload failed: {ds.status_code} {ds.text[:500]}")
            dataset_id = ds.json()["id"]
            timings["n"] = ds.json()["n"]
            t0 = time.perf_counter()
            client.put(
                f"{base}/v1/datasets/{dataset_id}/budget",
                json={"epsilon_total": 10.0, "delta_total": 1e-4},
                headers=oh,
            ).raise_for_status()
            client.put(
                f"{base}/v1/datasets/{dataset_id}/grants/{analyst['id']}", json={}, headers=oh
            ).raise_for_status()
            timings["budget_and_grant_seconds"] = elapsed_since(t0)
            timings["releases"] = [
                _release(client, base, dataset_id, analyst["api_key"], params)
                for params in REQUESTS
            ]
            verify = client.get(f"{base}/v1/datasets/{dataset_id}/ledger/verify", headers=oh)
            timings["ledger_valid"] = verify.json().get("valid")
            timings["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
        timings["server_peak_rss_mib"] = round(rss.peak_kib / 1024, 1)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--backends", default="sqlite,postgres", help="comma-separated subset")
    args = parser.parse_args()
    backends = set(args.backends.split(","))
    rows = args.rows or (10_000 if args.quick else 1_000_000)
    results: dict[str, Any] = {"rows": rows, "dgp": DGP, "true_ate": TAU, "epsilon": EPSILON}
    with tempfile.TemporaryDirectory() as tmp:
        csv_path = Path(tmp) / "d.csv"
        make_csv(csv_path, rows)
        results["csv_mib"] = round(csv_path.stat().st_size / 1024**2, 1)
        print(f"CSV: {rows} rows, {results['csv_mib']} MiB", flush=True)  # noqa: T201
        if "sqlite" in backends:
            results["sqlite"] = measure(f"sqlite:///{tmp}/bench.sqlite3", csv_path)
            print("sqlite", json.dumps(results["sqlite"]), flush=True)  # noqa: T201
        if "postgres" in backends:
            pg_url, drop = fresh_postgres_database()
            try:
                results["postgres"] = measure(pg_url, csv_path)
            finally:
                drop()
            print("postgres", json.dumps(results["postgres"]), flush=True)  # noqa: T201
    out = write_result("ate_service", results, quick=args.quick)
    print(f"wrote {out}")  # noqa: T201


if __name__ == "__main__":
    main()
