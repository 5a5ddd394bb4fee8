"""Scale-out benchmark (issue 14): the accept path, overspend, worker scaling, kill -9 trials.

SQLite and PostgreSQL side by side, real processes on loopback:

* ``accept``: accepted charges/s and accept latency (POST .../releases until its 202), 4 API
  processes (``CURATOR_WORKERS=4``), every request admitted, from 4 client processes; one
  dataset, then requests spread over 100 datasets. No job runs during this phase (API processes
  with jobs off, no workers): it measures validate -> charge -> enqueue alone.
* ``overspend``: 1,000 concurrent requests from 4 client processes against a budget for 100.
* ``scaling``: small ATE jobs (n = 2,000, no nuisances) per second with 1, 2, 4 worker
  processes (``python -m service.worker --concurrency 1``) draining a queue of ready releases.
* ``kill``: trials of kill -9 of a worker while it holds a job; jobs are held 0.3 s before and
  0.3 s after reading the rows (``CURATOR_TEST_JOB_PAUSE``, test environment) so kills land
  mid-job on both sides of the marker; a replacement starts after each kill. Counts double
  charges, lost or stuck jobs, releases resumed and charges a crash cost.

    python -m bench.scale              # full sizes (about 10 minutes on 2 cores)
    python -m bench.scale --quick      # CI smoke
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx2 as httpx
import numpy as np
from sqlalchemy import create_engine, text

from bench.common import ROOT, fresh_postgres_database, write_result
from tests.conftest import RCT_SCHEMA, synthetic_csv
from tests.live import live_server

ADMIN = "bench-admin-key"
COST = 0.01
BODY = {"kind": "ate", "params": {"epsilon": COST, "nuisance": "none"}, "fresh": True}


# -- plumbing ------------------------------------------------------------------------------
def _owner(base: str) -> dict[str, str]:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    owner = httpx.post(
        f"{base}/v1/principals", json={"name": "o", "role": "owner"}, headers=admin
    ).json()
    return {"Authorization": f"Bearer {owner['api_key']}"}


def _datasets(base: str, oh: dict[str, str], count: int, epsilon_total: float, n: int) -> list[str]:
    csv = synthetic_csv(n).encode()
    ids = []
    for i in range(count):
        ds = httpx.post(
            f"{base}/v1/datasets",
            data={"name": f"d{i}", "schema": json.dumps(RCT_SCHEMA)},
            files={"file": ("r.csv", csv, "text/csv")},
            headers=oh,
            timeout=60,
        ).json()
        r = httpx.put(
            f"{base}/v1/datasets/{ds['id']}/budget",
            json={"epsilon_total": epsilon_total, "delta_total": 0.5},
            headers=oh,
        )
        assert r.status_code == 200, r.text
        ids.append(ds["id"])
    return ids


def client_burst(
    base: str, key: str, dataset_ids: list[str], start_at: float, threads: int
) -> list[tuple[int, float]]:
    """One client process: POST one release per dataset id, ``threads`` at a time."""
    headers = {"Authorization": key}
    limits = httpx.Limits(max_connections=threads, max_keepalive_connections=threads)
    with httpx.Client(limits=limits, timeout=120) as client:
        client.get(f"{base}/readyz")

        def one(dataset_id: str) -> tuple[int, float]:
            t0 = time.perf_counter()
            r = client.post(
                f"{base}/v1/datasets/{dataset_id}/releases",
                json=BODY,
                headers=headers | {"Idempotency-Key": uuid.uuid4().hex},
            )
            return r.status_code, time.perf_counter() - t0

        time.sleep(max(0.0, start_at - time.time()))
        with ThreadPoolExecutor(max_workers=threads) as pool:
            return list(pool.map(one, dataset_ids))


def _burst(
    base: str, oh: dict[str, str], targets: list[str], clients: int, threads: int
) -> tuple[list[tuple[int, float]], float]:
    chunks = [targets[i::clients] for i in range(clients)]
    start_at = time.time() + 2.0
    with ProcessPoolExecutor(max_workers=clients) as pool:
        futures = [
            pool.submit(client_burst, base, oh["Authorization"], chunk, start_at, threads)
            for chunk in chunks
        ]
        out = [r for f in futures for r in f.result()]
    return out, time.time() - start_at


def _summary(out: list[tuple[int, float]], wall: float) -> dict[str, Any]:
    codes = [c for c, _ in out]
    lat = np.array([t for c, t in out if c == 202]) * 1000
    return {
        "requests": len(out),
        "wall_seconds": round(wall, 3),
        "accepted_202": codes.count(202),
        "refused_409": codes.count(409),
        "other_status": sorted({c for c in codes if c not in (202, 409)}),
        "requests_per_second": round(len(out) / wall, 1),
        "accepted_per_second": round(codes.count(202) / wall, 1),
        "accept_ms_p50": round(float(np.percentile(lat, 50)), 1) if len(lat) else None,
        "accept_ms_p99": round(float(np.percentile(lat, 99)), 1) if len(lat) else None,
    }


def _env(**extra: str) -> dict[str, str]:
    # 4 API processes x (4 + 2 write, 2 + 1 read): PostgreSQL (100) is shared with other users.
    return {
        "CURATOR_LATENCY_BUCKETS": "[0.05]",
        "CURATOR_DB_POOL_SIZE": "4",
        "CURATOR_DB_MAX_OVERFLOW": "2",
        **extra,
    }


def _sql(db_url: str, sql: str) -> list[Any]:
    eng = create_engine(db_url)
    with eng.connect() as conn:
        rows = list(conn.execute(text(sql)))
    eng.dispose()
    return rows


# -- CPU accounting (Linux /proc) ------------------------------------------------------------
def _cpu_seconds(match: Callable[[int], bool]) -> float:
    """User + system CPU seconds of the live processes ``match`` accepts (exited ones are lost:
    the API processes and their pooled PostgreSQL backends live through a phase)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if not match(pid):
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _serves_port(port: str) -> Callable[[int], bool]:
    needle = f"CURATOR_PORT={port}".encode()
    return lambda pid: needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def _is_postgres(pid: int) -> bool:
    return Path(f"/proc/{pid}/comm").read_text().strip() == "postgres"


# -- accept path ---------------------------------------------------------------------------
def commit_ms(db_url: str, commits: int = 50) -> float:
    """Median time of a one-row durable commit on this database (one statement, autocommit).

    Charges of one dataset are serialised by its budget row (or SQLite's write lock) held to
    the end of their commit, so one dataset cannot take more than about 1000 / this per second.
    """
    eng = create_engine(db_url, isolation_level="AUTOCOMMIT")
    times = []
    with eng.connect() as conn:
        conn.execute(text("CREATE TABLE bench_commit_probe (x INTEGER)"))
        for i in range(commits):
            t0 = time.perf_counter()
            conn.execute(text("INSERT INTO bench_commit_probe VALUES (:x)"), {"x": i})
            times.append(time.perf_counter() - t0)
        conn.execute(text("DROP TABLE bench_commit_probe"))
    eng.dispose()
    return round(float(np.median(times)) * 1000, 2)


def accept(db_url: str, requests: int, datasets: int, clients: int, threads: int) -> dict[str, Any]:
    env = _env(CURATOR_WORKERS="4", CURATOR_START_JOB_RUNNER="false")
    load_before = round(os.getloadavg()[0], 2)
    with live_server(db_url, admin_key=ADMIN, extra_env=env, workers=0) as base:
        oh = _owner(base)
        per = requests // datasets
        ids = _datasets(base, oh, datasets, epsilon_total=COST * per * 2, n=200)
        targets = [ids[i % datasets] for i in range(requests)]
        api = _serves_port(base.rsplit(":", 1)[1])
        cpu_before = (_cpu_seconds(api), _cpu_seconds(_is_postgres))
        out, wall = _burst(base, oh, targets, clients, threads)
        cpu_after = (_cpu_seconds(api), _cpu_seconds(_is_postgres))
        valid = all(
            httpx.get(f"{base}/v1/datasets/{d}/ledger/verify", headers=oh).json()["valid"]
            for d in ids[:5]
        )
    return {
        "api_processes": 4,
        "client_processes": clients,
        "threads_per_client": threads,
        "datasets": datasets,
        **_summary(out, wall),
        "ledger_valid": valid,
        # 1-minute load average of this (shared) machine before and at the end of the phase.
        "load_1min_before": load_before,
        "load_1min_after": round(os.getloadavg()[0], 2),
        "commit_ms_median": commit_ms(db_url),
        # CPU per accepted request: the 4 API processes, and every PostgreSQL process of the
        # machine (shared with other users: an upper bound); so the cores that 500 accepts/s
        # would need at this cost, before the load generator's own share.
        **_cpu_figures(cpu_before, cpu_after, len(targets)),
    }


def _cpu_figures(
    before: tuple[float, float], after: tuple[float, float], requests: int
) -> dict[str, Any]:
    api_ms = 1000.0 * (after[0] - before[0]) / requests
    postgres_ms = 1000.0 * (after[1] - before[1]) / requests
    return {
        "cpu_ms_per_accept_api": round(api_ms, 2),
        "cpu_ms_per_accept_postgres": round(postgres_ms, 2),
        "cores_for_500_per_s": round(500.0 * (api_ms + postgres_ms) / 1000.0, 2),
    }


def overspend(db_url: str, requests: int, capacity: int, clients: int) -> dict[str, Any]:
    env = _env(CURATOR_WORKERS="4", CURATOR_START_JOB_RUNNER="false")
    with live_server(db_url, admin_key=ADMIN, extra_env=env, workers=0) as base:
        oh = _owner(base)
        [ds] = _datasets(base, oh, 1, epsilon_total=COST * capacity, n=200)
        out, wall = _burst(base, oh, [ds] * requests, clients, requests // clients)
        budget = httpx.get(f"{base}/v1/datasets/{ds}/budget", headers=oh).json()
        verify = httpx.get(f"{base}/v1/datasets/{ds}/ledger/verify", headers=oh).json()
    return {
        "client_processes": clients,
        "capacity": capacity,
        **_summary(out, wall),
        "epsilon_total": budget["epsilon_total"],
        "epsilon_spent": budget["epsilon_spent"],
        "overspend_epsilon": round(budget["epsilon_spent"] - budget["epsilon_total"], 12),
        "ledger_valid": verify["valid"],
    }


# -- workers -------------------------------------------------------------------------------
@contextmanager
def _workers(db_url: str, env: dict[str, str]) -> Iterator[Callable[[], subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []

    def start() -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.worker", "--concurrency", "1"],
            cwd=ROOT,
            env={**os.environ, **env, "DATABASE_URL": db_url, "CURATOR_ADMIN_KEY": ADMIN},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stderr is not None
        proc.stderr.readline()  # "worker: ..." once it is about to take jobs
        drain = proc.stderr
        threading.Thread(target=lambda: drain.read(), daemon=True).start()
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stderr is not None:
                p.stderr.close()


def _settled(db_url: str, ids: list[str]) -> int:
    quoted = ", ".join(f"'{i}'" for i in ids)
    return int(
        _sql(
            db_url,
            f"SELECT count(*) FROM release WHERE id IN ({quoted}) AND status IN ('done', 'failed')",
        )[0][0]
    )


def _submit(
    base: str, oh: dict[str, str], ds: str, count: int, body: dict[str, Any] = BODY
) -> list[str]:
    with httpx.Client(timeout=60) as client:

        def one(_: int) -> str:
            r = client.post(
                f"{base}/v1/datasets/{ds}/releases",
                json=body,
                headers=oh | {"Idempotency-Key": uuid.uuid4().hex},
            )
            assert r.status_code == 202, r.text
            return str(r.json()["id"])

        with ThreadPoolExecutor(max_workers=8) as pool:
            return list(pool.map(one, range(count)))


BLAS_ONE = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
SMALL_ATE = {"kind": "ate", "params": {"epsilon": COST}, "fresh": True}


def scaling(db_url: str, jobs: int, counts: tuple[int, ...], n: int) -> dict[str, Any]:
    """Start the workers, then queue ``jobs`` small ATE releases (the strict default: dp_linear
    nuisances on this RCT design) as fast as 8 client threads can; jobs/s from the rows'
    finished_at."""
    # One BLAS thread per worker process: workers, not BLAS threads, are what is scaled.
    env = _env(CURATOR_START_JOB_RUNNER="false", **BLAS_ONE)
    rows = []
    with live_server(db_url, admin_key=ADMIN, extra_env=env, workers=0) as base:
        oh = _owner(base)
        [ds] = _datasets(base, oh, 1, epsilon_total=COST * jobs * (len(counts) + 1), n=n)
        for count in counts:
            with _workers(db_url, env) as start:
                for _ in range(count):
                    start()  # all workers up and listening before the first job is queued
                ids = _submit(base, oh, ds, jobs, SMALL_ATE)
                deadline = time.time() + 600
                while _settled(db_url, ids) < jobs and time.time() < deadline:
                    time.sleep(0.1)
            quoted = ", ".join(f"'{i}'" for i in ids)
            done = _sql(
                db_url,
                f"SELECT finished_at FROM release WHERE id IN ({quoted}) AND status = 'done' "
                "ORDER BY finished_at",
            )
            # Warm-up excluded: from the moment every worker finished its first job (imports,
            # first BLAS call) to the last finish, jobs-after-warm-up per second.
            times = [datetime.fromisoformat(r[0]) for r in done]
            wall = (times[-1] - times[count - 1]).total_seconds()
            measured = len(times) - count
            rows.append(
                {
                    "workers": count,
                    "jobs": jobs,
                    "done": len(times),
                    "measured_jobs": measured,
                    "seconds": round(wall, 2),
                    "jobs_per_second": round(measured / wall, 2),
                }
            )
    base_rate = rows[0]["jobs_per_second"]
    for row in rows:
        row["speedup"] = round(row["jobs_per_second"] / base_rate, 2)
    return {
        "kind": f"ate strict default (dp_linear nuisances), n = {n}",
        "worker_concurrency": 1,
        "curve": rows,
    }


def kill_trials(db_url: str, trials: int, stale: float) -> dict[str, Any]:
    env = _env(
        CURATOR_START_JOB_RUNNER="false",
        CURATOR_ENVIRONMENT="test",
        CURATOR_TEST_JOB_PAUSE="0.3,0.3",
        CURATOR_JOB_STALE_SECONDS=str(stale),
        CURATOR_JOB_RECOVERY_SECONDS="1",
    )
    rng = random.Random()  # the kill points, not noise
    kills = []
    with live_server(db_url, admin_key=ADMIN, extra_env=env, workers=0) as base:
        oh = _owner(base)
        [ds] = _datasets(base, oh, 1, epsilon_total=COST * trials * 8, n=500)
        ids: list[str] = []
        with _workers(db_url, env) as start:
            live = [start(), start()]
            for _ in range(trials):
                ids += _submit(base, oh, ds, 4)
                victim = rng.choice(live)
                deadline = time.time() + 30
                held: list[Any] = []
                while time.time() < deadline and not held:
                    held = _sql(
                        db_url,
                        "SELECT id, data_read_at IS NOT NULL FROM release WHERE status = "
                        f"'running' AND claimed_by LIKE '{victim.pid}-%'",
                    )
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 0.7))
                held = _sql(
                    db_url,
                    "SELECT id, data_read_at IS NOT NULL FROM release WHERE status = "
                    f"'running' AND claimed_by LIKE '{victim.pid}-%'",
                )
                os.kill(victim.pid, signal.SIGKILL)
                victim.wait()
                kills.append([(str(r[0]), bool(r[1])) for r in held])
                live.remove(victim)
                live.append(start())
            deadline = time.time() + 120
            while time.time() < deadline and _settled(db_url, ids) < len(ids):
                time.sleep(0.2)
            time.sleep(stale + 3)  # the dead workers' procrastinate jobs are retried and end
            stuck_jobs = 0
            if db_url.startswith("postgresql"):
                stuck_jobs = int(
                    _sql(
                        db_url,
                        "SELECT count(*) FROM procrastinate_jobs WHERE task_name = 'release' "
                        "AND status IN ('todo', 'doing')",
                    )[0][0]
                )
        verify = httpx.get(f"{base}/v1/datasets/{ds}/ledger/verify", headers=oh).json()
    statuses = {r[0]: r[1] for r in _sql(db_url, "SELECT id, status FROM release")}
    failures = {
        r[0]: r[1] for r in _sql(db_url, "SELECT id, failure FROM release WHERE status = 'failed'")
    }
    charge_sql = "SELECT release_id FROM ledger_entry WHERE entry_type = 'charge'"
    charges = [r[0] for r in _sql(db_url, charge_sql)]
    hit = [rid for k in kills for rid, _ in k]
    before = [rid for k in kills for rid, read in k if not read]
    after = [rid for k in kills for rid, read in k if read]
    return {
        "trials": trials,
        "releases": len(ids),
        "kills_with_a_job_held": sum(1 for k in kills if k),
        "jobs_hit": len(hit),
        "hit_before_reading_rows": len(before),
        "resumed_and_done": sum(1 for rid in before if statuses.get(rid) == "done"),
        "hit_after_reading_rows": len(after),
        "failed_charge_kept": sum(1 for rid in after if failures.get(rid) == "worker-lost"),
        "charges_lost_to_crashes": sum(1 for f in failures.values() if f == "worker-lost"),
        "double_charges": len(charges) - len(set(charges)),
        "charges_equal_releases": sorted(charges) == sorted(statuses),
        "not_terminal": sum(1 for rid in ids if statuses.get(rid) not in ("done", "failed")),
        "stuck_queue_jobs": stuck_jobs,
        "ledger_valid": verify["valid"],
    }


# -- main ----------------------------------------------------------------------------------
def run(
    new_db: Callable[[], tuple[str, Callable[[], None]]], quick: bool, only: list[str] | None
) -> dict[str, Any]:
    """Each phase on a fresh database (the accept phases leave thousands of queued jobs)."""
    # quick (the CI smoke): every phase and check at the smallest sizes that still exercise
    # them (the CI run must stay within 30 minutes on two shared cores)
    n = 200 if quick else 2000
    phases: dict[str, Callable[[str], dict[str, Any]]] = {
        "accept_one_dataset": lambda url: accept(url, n, 1, clients=4, threads=16),
        "accept_100_datasets": lambda url: accept(
            url, n, 10 if quick else 100, clients=4, threads=16
        ),
        "overspend": lambda url: overspend(url, 200 if quick else 1000, 100, clients=4),
        "scaling": lambda url: scaling(
            url, 8 if quick else 120, (1, 2) if quick else (1, 2, 4), n=5000
        ),
        "kill": lambda url: kill_trials(url, 2 if quick else 20, stale=2.0),
    }
    out: dict[str, Any] = {}
    for name, phase in phases.items():
        if only and name not in only:
            continue
        url, drop = new_db()
        try:
            out[name] = phase(url)
        finally:
            drop()
        print(" ", name, out[name], flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["sqlite", "postgres"], default=None)
    parser.add_argument(
        "--phases",
        nargs="*",
        default=None,
        help="accept_one_dataset accept_100_datasets overspend scaling kill (default: all)",
    )
    parser.add_argument(
        "--result",
        default="scale",
        help="bench/results/<RESULT>.json (default scale; e.g. a run of some phases only)",
    )
    args = parser.parse_args()
    results: dict[str, Any] = {}
    if args.only != "postgres":
        with tempfile.TemporaryDirectory() as tmp:
            print("sqlite", flush=True)

            def sqlite_db() -> tuple[str, Callable[[], None]]:
                return f"sqlite:///{tmp}/{uuid.uuid4().hex[:8]}.sqlite3", lambda: None

            results["sqlite"] = run(sqlite_db, args.quick, args.phases)
    if args.only != "sqlite":
        print("postgres", flush=True)
        results["postgres"] = run(fresh_postgres_database, args.quick, args.phases)
    ok = True
    for r in results.values():
        if "overspend" in r:
            ok = ok and r["overspend"]["overspend_epsilon"] <= 0
            ok = ok and r["overspend"]["accepted_202"] == 100
        if "kill" in r:
            k = r["kill"]
            ok = ok and k["double_charges"] == 0 and k["not_terminal"] == 0
            ok = ok and k["stuck_queue_jobs"] == 0 and k["ledger_valid"]
    results["pass"] = ok
    out = write_result(args.result, results, quick=args.quick, module="bench.scale")
    print(f"wrote {out}")
    if not ok:
        raise SystemExit("scale check failed: overspend, double charge or stuck job")


if __name__ == "__main__":
    main()
