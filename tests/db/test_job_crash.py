"""A job killed after its charge never releases twice and never refunds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from service.db.models import Release
from tests.conftest import RCT_SCHEMA, Api

pytestmark = pytest.mark.slow

WORKER = """
import sys, time
from service.db.engine import get_sessionmaker
from service.jobs.runner import JobRunner
runner = JobRunner(get_sessionmaker(), workers=1, latency_buckets=(0.01,))
release_id = runner.claim_next()
print(release_id, flush=True)
runner.execute(release_id, run_hook=lambda: time.sleep(3600))
"""


def _status(db_url: str, release_id: str) -> str:
    eng = create_engine(db_url)
    with Session(eng) as s:
        status = s.execute(select(Release.status).where(Release.id == release_id)).scalar_one()
    eng.dispose()
    return str(status)


def _queued_release(
    api: Api, client: TestClient, kind: str
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], Any]:
    """Owner, analyst, dataset and the response of one queued release (no runner running)."""
    client.app.state.runner.stop()  # type: ignore[attr-defined]
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"], n=500, schema=RCT_SCHEMA, epsilon_total=2.0)
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    r = client.post(
        f"/v1/datasets/{ds['id']}/releases",
        json={"kind": kind, "params": {"epsilon": 1.0, "nuisance": "none"}},
        headers=api.auth(analyst["api_key"]) | {"Idempotency-Key": uuid.uuid4().hex},
    )
    assert r.status_code == 202, r.text
    return owner, analyst, ds, r


def test_killed_job_fails_keeps_charge_and_never_reruns(
    api: Api, client: TestClient, db_url: str
) -> None:
    owner, analyst, ds, r = _queued_release(api, client, "ate")
    release_id = r.json()["id"]
    env = {**os.environ, "DATABASE_URL": db_url}
    proc = subprocess.Popen([sys.executable, "-c", WORKER], env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline().decode().strip() == release_id
    time.sleep(1.0)  # inside run_hook: the rows were read
    assert _status(db_url, release_id) == "running"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()

    from service.db.engine import get_sessionmaker
    from service.jobs.runner import JobRunner

    sweeper = JobRunner(get_sessionmaker(), workers=1, latency_buckets=(0.01,), stale_after=0.0)
    assert sweeper.recover_stale() == ([], [release_id])  # it had read the rows: failed
    assert sweeper.claim_next() is None  # never re-run
    time.sleep(0.05)  # past its padded visibility (buckets of 0.01 s from its start)
    body = client.get(f"/v1/releases/{release_id}", headers=api.auth(analyst["api_key"])).json()
    assert body["status"] == "failed"
    assert body["result"] is None
    h = api.auth(owner["api_key"])
    assert client.get(f"/v1/datasets/{ds['id']}/budget", headers=h).json()["epsilon_spent"] == 1.0
    assert client.get(f"/v1/datasets/{ds['id']}/ledger/verify", headers=h).json()["valid"]
    # A retry with the same key returns the failed release, it does not charge again.
    again = client.post(
        f"/v1/datasets/{ds['id']}/releases",
        json={"kind": "ate", "params": {"epsilon": 1.0, "nuisance": "none"}},
        headers=api.auth(analyst["api_key"])
        | {"Idempotency-Key": r.request.headers["idempotency-key"]},
    )
    assert again.status_code == 200
    assert again.json()["id"] == release_id
    assert client.get(f"/v1/datasets/{ds['id']}/budget", headers=h).json()["epsilon_spent"] == 1.0


def test_a_lost_workers_failure_shows_only_its_bucket(api: Api, client: TestClient) -> None:
    """A worker that died after reading the rows is found by its stale heartbeat; the failure
    becomes visible at the latency bucket after the job's start its detection falls in, not at
    the moment of detection (which follows the moment it died)."""
    from datetime import UTC, datetime

    from sqlalchemy import update

    from service.db.engine import get_sessionmaker
    from service.jobs import execute

    owner, analyst, ds, r = _queued_release(api, client, "ate")
    release_id = r.json()["id"]
    factory = get_sessionmaker()
    started = time.time() - 2.0
    with factory() as s:  # as a worker leaves it when killed inside the fit
        s.execute(
            update(Release)
            .where(Release.id == release_id)
            .values(
                status="running",
                stage="estimation",
                started_at=datetime.fromtimestamp(started, UTC).isoformat(),
                data_read_at=started + 0.1,
                heartbeat_at=started + 0.5,
                claimed_by="dead-worker",
            )
        )
        s.commit()
    assert execute.recover_stale(factory, stale_after=0.0, buckets=(1.0, 600.0)) == (
        [],
        [release_id],
    )
    with factory() as s:
        stored = s.get(Release, release_id)
        assert stored is not None
        assert stored.status == "failed"
        assert stored.visible_at == pytest.approx(started + 600.0, abs=1e-3)
    body = client.get(f"/v1/releases/{release_id}", headers=api.auth(analyst["api_key"])).json()
    assert (body["status"], body["stage"], body["error"]) == ("running", "running", None)


def test_job_cut_off_before_reading_rows_is_requeued_and_released_once(
    api: Api, client: TestClient, db_url: str
) -> None:
    """Issue 13 item 10: a job whose worker died after the claim but before the durable
    'rows read' marker touched no private data, so it is re-queued and its one charge answers
    the re-run; the dead worker's claim is void (it could not write anything any more)."""
    owner, analyst, ds, r = _queued_release(api, client, "ate")
    release_id = r.json()["id"]

    from service.db.engine import get_sessionmaker
    from service.jobs.runner import JobRunner

    dead = JobRunner(get_sessionmaker(), workers=1, latency_buckets=(0.01,), stale_after=0.0)
    assert dead.claim_next() == release_id  # ... and the worker dies here
    dead.heartbeats.discard(release_id)
    assert _status(db_url, release_id) == "running"
    assert dead.recover_stale() == ([release_id], [])
    assert _status(db_url, release_id) == "queued"
    assert dead.execute(release_id) == "skipped"  # a stale claim reads nothing, writes nothing
    other = JobRunner(get_sessionmaker(), workers=1, latency_buckets=(0.01,))
    assert other.claim_next() == release_id
    assert other.execute(release_id) == "done"
    assert other.claim_next() is None
    time.sleep(0.05)
    body = client.get(f"/v1/releases/{release_id}", headers=api.auth(analyst["api_key"])).json()
    assert body["status"] == "done"
    assert body["result"] is not None
    h = api.auth(owner["api_key"])
    assert client.get(f"/v1/datasets/{ds['id']}/budget", headers=h).json()["epsilon_spent"] == 1.0
    assert client.get(f"/v1/datasets/{ds['id']}/ledger/verify", headers=h).json()["valid"]


def test_function_state_that_cannot_be_stored_fails_the_release_at_once(
    api: Api, client: TestClient, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the released function's state cannot be written, the release fails in the same job
    (not 60 s later by the stale sweep), serves nothing, and keeps its charge."""
    owner, analyst, ds, r = _queued_release(api, client, "cate_function")
    release_id = r.json()["id"]

    from service.db.engine import get_sessionmaker
    from service.functions import service as functions
    from service.jobs.runner import JobRunner

    def broken_store(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(functions, "store", broken_store)
    runner = JobRunner(get_sessionmaker(), workers=1, latency_buckets=(0.01,))
    assert runner.claim_next() == release_id
    runner.execute(release_id)
    assert _status(db_url, release_id) == "failed"
    time.sleep(0.05)  # past the padded completion time
    body = client.get(f"/v1/releases/{release_id}", headers=api.auth(analyst["api_key"])).json()
    assert body["status"] == "failed"
    assert body["result"] is None
    fn = client.get(f"/v1/functions/{release_id}", headers=api.auth(analyst["api_key"]))
    assert fn.status_code == 404
    h = api.auth(owner["api_key"])
    assert client.get(f"/v1/datasets/{ds['id']}/budget", headers=h).json()["epsilon_spent"] == 1.0


def test_a_worker_takes_its_next_job_only_at_the_last_ones_bucket(
    api: Api, client: TestClient
) -> None:
    """The next job's start (shown to its own readers) must not reveal when the previous job on
    the same worker really finished: the worker holds its slot until the padded completion."""
    from datetime import datetime

    from service.db.engine import get_sessionmaker
    from service.jobs.runner import JobRunner

    owner, analyst, ds, first = _queued_release(api, client, "ate")
    second = client.post(
        f"/v1/datasets/{ds['id']}/releases",
        json={"kind": "ate", "params": {"epsilon": 0.5, "nuisance": "none"}},
        headers=api.auth(analyst["api_key"]) | {"Idempotency-Key": uuid.uuid4().hex},
    )
    assert second.status_code == 202, second.text
    factory = get_sessionmaker()
    runner = JobRunner(factory, workers=1, latency_buckets=(1.5,), poll_seconds=0.02)
    runner.start()
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            with factory() as s:
                rows = {r.id: r for r in s.execute(select(Release)).scalars()}
                ids = (first.json()["id"], second.json()["id"])
                if all(rows[i].status in ("done", "failed") for i in ids):
                    break
            time.sleep(0.05)
    finally:
        runner.stop()
    a, b = (rows[i] for i in ids)
    assert a.status == b.status == "done"
    assert a.visible_at is not None
    assert a.finished_at is not None
    assert b.started_at is not None
    first_finish = datetime.fromisoformat(a.finished_at).timestamp()
    second_start = datetime.fromisoformat(b.started_at).timestamp()
    assert first_finish < a.visible_at - 0.5  # the first job took well under its bucket
    assert second_start >= a.visible_at - 0.01  # the worker waited for it
