"""One shared GP state per function across server processes, restarts and a killed process.

* Concurrent evaluations through two server processes on one database: every point gets exactly
  one value whoever asks and wherever, and no point is ever drawn twice (stored batches hold
  pairwise distinct points; ``version`` and ``t`` match the rows).
* A restart (new processes, cold caches) returns the identical values.
* A server killed (SIGKILL) in the middle of a stream of requests: every answer a client received
  was durable, so a fresh server returns exactly that value again.

Both backends: on PostgreSQL the header row is locked with ``SELECT ... FOR UPDATE``; on SQLite
every transaction is ``BEGIN IMMEDIATE``, which takes the database's write lock across processes.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import numpy as np
import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from service.db.models import CateFunction, CateFunctionBatch
from service.functions.sealing import MAGIC, unseal
from tests.conftest import ADMIN_KEY, RCT_SCHEMA, synthetic_csv
from tests.live import ROOT, free_port, live_server

pytestmark = pytest.mark.slow


def _plain(row: CateFunctionBatch) -> bytes:
    """A batch row's payload, decrypted (the state is sealed at rest)."""
    assert row.payload.startswith(MAGIC)  # never stored in the clear
    return unseal(row.payload, context=f"{row.function_id}:batch:{row.seq}")


# shrinkage "none": no reference draws, so the stored points are exactly the clients'
PARAMS = {"epsilon": 1.0, "nuisance": "none", "t_max": 5000, "batch_max": 50, "shrinkage": "none"}


def _setup(base: str) -> tuple[str, list[str]]:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    owner = httpx.post(
        f"{base}/v1/principals", json={"name": "o", "role": "owner"}, headers=admin
    ).json()
    ok = {"Authorization": f"Bearer {owner['api_key']}"}
    ds = httpx.post(
        f"{base}/v1/datasets",
        data={"name": "d", "schema": json.dumps(RCT_SCHEMA)},
        files={"file": ("r.csv", io.BytesIO(synthetic_csv(1000).encode()), "text/csv")},
        headers=ok,
    ).json()
    httpx.put(
        f"{base}/v1/datasets/{ds['id']}/budget",
        json={"epsilon_total": 2.0, "delta_total": 1e-3},
        headers=ok,
    )
    keys = [owner["api_key"]]
    for role in ("analyst", "client", "client"):
        p = httpx.post(
            f"{base}/v1/principals", json={"name": role, "role": role}, headers=admin
        ).json()
        httpx.put(f"{base}/v1/datasets/{ds['id']}/grants/{p['id']}", json={}, headers=ok)
        keys.append(p["api_key"])
    r = httpx.post(
        f"{base}/v1/datasets/{ds['id']}/releases",
        json={"kind": "cate_function", "params": PARAMS},
        headers={"Authorization": f"Bearer {keys[1]}", "Idempotency-Key": uuid.uuid4().hex},
        timeout=60,
    )
    assert r.status_code == 202, r.text
    fid = r.json()["id"]
    deadline = time.time() + 120
    while time.time() < deadline:
        body = httpx.get(
            f"{base}/v1/releases/{fid}", headers={"Authorization": f"Bearer {keys[1]}"}
        ).json()
        if body["status"] in ("done", "failed"):
            break
        time.sleep(0.1)
    assert body["status"] == "done", body
    return fid, keys


def _evaluate(base: str, key: str, fid: str, points: list[list[float]]) -> list[float]:
    r = httpx.post(
        f"{base}/v1/functions/{fid}/evaluate",
        json={"points": points},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    values: list[float] = r.json()["values"]
    return values


def _stored(db_url: str, fid: str) -> tuple[int, int, int, int]:
    """(version, t, batch rows, distinct stored codes) straight from the database."""
    engine = create_engine(db_url)
    try:
        with Session(engine) as session:
            header = session.get(CateFunction, fid)
            assert header is not None
            rows = (
                session.execute(
                    select(CateFunctionBatch).where(CateFunctionBatch.function_id == fid)
                )
                .scalars()
                .all()
            )
            codes = set()
            total = 0
            for row in rows:
                with np.load(io.BytesIO(_plain(row))) as z:
                    for c in z["codes"]:
                        codes.add(c.tobytes())
                        total += 1
            assert total == len(codes), "a point was drawn twice"
            return header.version, header.t, len(rows), len(codes)
    finally:
        engine.dispose()


def _point(i: int) -> list[float]:
    return [18.0 + (i % 72), (i * 0.137) % 1.0, float(i % 2)]


def test_concurrent_processes_share_one_state_and_restart_keeps_it(db_url: str) -> None:
    env = {"CURATOR_JOB_POLL_SECONDS": "0.05", "CURATOR_LATENCY_BUCKETS": "[0.1, 1, 5, 30]"}
    seen: dict[str, set[float]] = defaultdict(set)
    with (
        live_server(db_url, admin_key=ADMIN_KEY, extra_env=env) as one,
        live_server(
            db_url,
            admin_key=ADMIN_KEY,
            extra_env=env | {"CURATOR_RUN_MIGRATIONS_ON_START": "false"},
        ) as two,
    ):
        fid, keys = _setup(one)
        shared = [_point(i) for i in range(12)]

        def work(k: int) -> list[tuple[list[float], float]]:
            rng = np.random.default_rng(k)
            base = (one, two)[k % 2]
            out: list[tuple[list[float], float]] = []
            for j in range(5):
                picks = [shared[int(i)] for i in rng.choice(12, size=4, replace=False)]
                fresh = [_point(100 + 1000 * k + j)]
                pts = picks + fresh + [picks[0]]
                out.extend(zip(pts, _evaluate(base, keys[k % len(keys)], fid, pts), strict=True))
            return out

        with ThreadPoolExecutor(max_workers=6) as pool:
            for result in pool.map(work, range(6)):
                for point, value in result:
                    seen[json.dumps(point)].add(value)
        assert all(len(values) == 1 for values in seen.values()), "a point got two values"
        version, t, rows, distinct = _stored(db_url, fid)
        assert version == rows
        assert t == distinct == len(seen)

    with live_server(
        db_url, admin_key=ADMIN_KEY, extra_env={"CURATOR_RUN_MIGRATIONS_ON_START": "false"}
    ) as again:
        points = [json.loads(p) for p in seen]
        answers = []
        for start in range(0, len(points), 50):
            answers += _evaluate(again, keys[0], fid, points[start : start + 50])
        for p, value in zip(points, answers, strict=True):
            assert seen[json.dumps(p)] == {value}
    assert _stored(db_url, fid)[1] == len(seen)  # nothing new was drawn


def test_killed_process_never_returned_an_unpersisted_answer(db_url: str) -> None:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "CURATOR_ADMIN_KEY": ADMIN_KEY,
        "CURATOR_PORT": str(port),
        "CURATOR_ENVIRONMENT": "test",
        "CURATOR_RUN_MIGRATIONS_ON_START": "false",
        "CURATOR_JOB_POLL_SECONDS": "0.05",
        "CURATOR_LATENCY_BUCKETS": "[0.1, 1, 5, 30]",
        # One process that also runs the release job (a procrastinate worker inside it on
        # PostgreSQL): the kill below then takes everything down at once.
        "CURATOR_JOB_RUNNER": "inprocess",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "service"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    delivered: dict[str, float] = {}
    try:
        deadline = time.time() + 60
        while True:
            try:
                if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline
            time.sleep(0.1)
        fid, keys = _setup(base)

        def work(k: int) -> list[tuple[list[float], float]]:
            out: list[tuple[list[float], float]] = []
            for j in range(200):
                pts = [_point(5000 + 400 * k + 2 * j), _point(5001 + 400 * k + 2 * j)]
                try:
                    r = httpx.post(
                        f"{base}/v1/functions/{fid}/evaluate",
                        json={"points": pts},
                        headers={"Authorization": f"Bearer {keys[2]}"},
                        timeout=10,
                    )
                except httpx.HTTPError:
                    break
                if r.status_code != 200:
                    break
                out.extend(zip(pts, r.json()["values"], strict=True))
            return out

        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = [pool.submit(work, k) for k in range(4)]
            time.sleep(1.0)
            proc.send_signal(signal.SIGKILL)
            for f in futures:
                for point, value in f.result():
                    delivered[json.dumps(point)] = value
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert delivered, "no answer before the kill"
    t_after_kill = _stored(db_url, fid)[1]
    assert t_after_kill >= len(delivered)
    with live_server(
        db_url, admin_key=ADMIN_KEY, extra_env={"CURATOR_RUN_MIGRATIONS_ON_START": "false"}
    ) as again:
        points = [json.loads(p) for p in delivered]
        for start in range(0, len(points), 50):
            chunk = points[start : start + 50]
            for p, value in zip(chunk, _evaluate(again, keys[3], fid, chunk), strict=True):
                assert delivered[json.dumps(p)] == value
