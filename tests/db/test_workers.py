"""Separate worker processes on PostgreSQL: 2 API processes, 2 (then 3) workers, SIGKILLs.

Every job is held 1 s before and 1 s after it reads the rows (``CURATOR_TEST_JOB_PAUSE``, test
environment only) so that each kill lands at a known point:

* worker A is killed while its job has claimed a release but not read the rows: the release is
  re-queued and completed by another worker (its one charge answers it);
* worker B is killed after its job read the rows (noise may have been drawn): the release fails
  with the public reason ``worker-lost`` and keeps its charge.

Every release reaches a terminal state, every charge is in the ledger once, the ledger
verifies, and no procrastinate job is left to do or doing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import httpx2 as httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.conftest import ADMIN_KEY, RCT_SCHEMA, _truncate, synthetic_csv
from tests.live import ROOT, live_server

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

STALE = "3"
ENV = {
    "CURATOR_LATENCY_BUCKETS": "[0.05]",
    "CURATOR_JOB_STALE_SECONDS": STALE,
    "CURATOR_JOB_RECOVERY_SECONDS": "1",
    "CURATOR_RUN_MIGRATIONS_ON_START": "false",
}


@pytest.fixture
def pg_url(postgres_database: str) -> str:
    _truncate(postgres_database)
    return postgres_database


def _worker(db_url: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        **ENV,
        "DATABASE_URL": db_url,
        "CURATOR_ADMIN_KEY": ADMIN_KEY,
        "CURATOR_ENVIRONMENT": "test",
        "CURATOR_TEST_JOB_PAUSE": "1.0,1.0",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "service.worker", "--concurrency", "1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.fixture
def workers(pg_url: str) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        proc = _worker(pg_url)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
    for proc in started:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _rows(db_url: str, sql: str) -> list[Any]:
    eng = create_engine(db_url)
    with eng.connect() as conn:
        rows = list(conn.execute(text(sql)))
    eng.dispose()
    return rows


def _wait_for(what: Callable[[], Any], seconds: float, message: str) -> Any:
    deadline = time.time() + seconds
    while time.time() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(message)


def _running_of(db_url: str, pid: int, *, read: bool) -> str | None:
    marker = "IS NOT NULL" if read else "IS NULL"
    rows = _rows(
        db_url,
        f"SELECT id FROM release WHERE status = 'running' AND claimed_by LIKE '{pid}-%' "
        f"AND data_read_at {marker}",
    )
    return str(rows[0][0]) if rows else None


def _owner_with_dataset(
    owner_base: str, upload_base: str, *, rows: int
) -> tuple[dict[str, str], dict[str, Any]]:
    """An owner (created through ``owner_base``), a trial of ``rows`` rows uploaded through
    ``upload_base`` and its budget (epsilon 10) set: the owner's headers and the dataset."""
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    owner = httpx.post(
        f"{owner_base}/v1/principals", json={"name": "o", "role": "owner"}, headers=admin
    ).json()
    oh = {"Authorization": f"Bearer {owner['api_key']}"}
    ds: dict[str, Any] = httpx.post(
        f"{upload_base}/v1/datasets",
        data={"name": "d", "schema": json.dumps(RCT_SCHEMA)},
        files={"file": ("r.csv", synthetic_csv(rows).encode(), "text/csv")},
        headers=oh,
    ).json()
    r = httpx.put(
        f"{owner_base}/v1/datasets/{ds['id']}/budget",
        json={"epsilon_total": 10.0, "delta_total": 1e-4},
        headers=oh,
    )
    assert r.status_code == 200, r.text
    return oh, ds


def test_two_apis_workers_killed_mid_job(
    pg_url: str, workers: Callable[[], subprocess.Popen[bytes]]
) -> None:
    with ExitStack() as stack:
        bases = [
            stack.enter_context(live_server(pg_url, admin_key=ADMIN_KEY, extra_env=ENV, workers=0))
            for _ in range(2)
        ]
        a, b = workers(), workers()
        oh, ds = _owner_with_dataset(bases[0], bases[1], rows=500)
        ids = []
        for i in range(6):
            r = httpx.post(
                f"{bases[i % 2]}/v1/datasets/{ds['id']}/releases",
                json={"kind": "ate", "params": {"epsilon": 0.5, "nuisance": "none"}, "fresh": True},
                headers=oh | {"Idempotency-Key": uuid.uuid4().hex},
            )
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])

        # A holds a claimed release before reading the rows: kill it there.
        resumed = _wait_for(
            lambda: _running_of(pg_url, a.pid, read=False), 40, "worker A never claimed a job"
        )
        os.kill(a.pid, signal.SIGKILL)
        a.wait()
        c = workers()
        # B is past reading the rows of a release (noise may be drawn): kill it there.
        lost = _wait_for(
            lambda: _running_of(pg_url, b.pid, read=True), 40, "worker B never read rows"
        )
        os.kill(b.pid, signal.SIGKILL)
        b.wait()

        def settled() -> list[dict[str, Any]] | None:
            views = [
                httpx.get(f"{bases[j % 2]}/v1/releases/{rid}", headers=oh).json()
                for j, rid in enumerate(ids)
            ]
            return views if all(v["status"] in ("done", "failed") for v in views) else None

        views = _wait_for(settled, 45, "a release never reached a terminal state")
        by_id = {v["id"]: v for v in views}
        assert by_id[resumed]["status"] == "done"  # re-queued and run by another worker
        assert by_id[lost]["status"] == "failed"
        assert "after it may have drawn noise" in by_id[lost]["error"]["detail"]
        assert by_id[lost]["result"] is None
        assert all(v["status"] == "done" for v in views if v["id"] != lost)
        assert c.poll() is None

        budget = httpx.get(f"{bases[0]}/v1/datasets/{ds['id']}/budget", headers=oh).json()
        assert budget["epsilon_spent"] == pytest.approx(3.0)  # six charges of 0.5, none twice
        verify = httpx.get(f"{bases[1]}/v1/datasets/{ds['id']}/ledger/verify", headers=oh)
        assert verify.json()["valid"]
        charges = _rows(pg_url, "SELECT release_id FROM ledger_entry WHERE entry_type = 'charge'")
        assert sorted(r[0] for r in charges) == sorted(ids)

        # No job of a release is left to do or doing (the dead workers' jobs were retried by
        # the engine and found their releases settled).
        _wait_for(
            lambda: (
                not _rows(
                    pg_url,
                    "SELECT id FROM procrastinate_jobs WHERE task_name = 'release' "
                    "AND status IN ('todo', 'doing')",
                )
            ),
            30,
            "a release job was left in todo/doing",
        )


def _outage(db_url: str, seconds: float) -> None:
    """What a database restart does to its clients: every connection to it is closed and new
    ones are refused for ``seconds``."""
    url = make_url(db_url)
    name = url.database
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
        time.sleep(seconds)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        admin.dispose()


def test_workers_outlive_a_database_restart(
    pg_url: str, workers: Callable[[], subprocess.Popen[bytes]]
) -> None:
    """procrastinate stops its worker (exit 0) when its listener's connection fails, so a
    PostgreSQL restart of a few seconds used to stop every worker for good: releases charged
    afterwards stayed queued. Supervised, the worker starts again and runs them."""
    with live_server(pg_url, admin_key=ADMIN_KEY, extra_env=ENV, workers=0) as base:
        worker = workers()
        oh, ds = _owner_with_dataset(base, base, rows=300)

        def release_done() -> str:
            r = httpx.post(
                f"{base}/v1/datasets/{ds['id']}/releases",
                json={"kind": "ate", "params": {"epsilon": 0.5, "nuisance": "none"}, "fresh": True},
                headers=oh | {"Idempotency-Key": uuid.uuid4().hex},
            )
            assert r.status_code == 202, r.text
            rid = r.json()["id"]

            def status() -> str | None:
                view = httpx.get(f"{base}/v1/releases/{rid}", headers=oh).json()
                return str(view["status"]) if view["status"] in ("done", "failed") else None

            return str(_wait_for(status, 60, "the release never finished"))

        assert release_done() == "done"
        for _ in range(2):  # twice: the restarted worker must survive the next outage too
            _outage(pg_url, 4.0)
            time.sleep(1.0)
            assert worker.poll() is None, "the worker exited"
            assert release_done() == "done"
