"""Identical release requests fired at once from several processes: one charge, one release.

Without ``fresh`` an identical request is answered from the stored release. The check for a
stored release and the charge are not one statement, so reuse is made atomic by the partial
unique index on ``release.reuse_key``: of a burst of identical requests (distinct
Idempotency-Keys) exactly one is charged and every other one is answered with its release.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import time
import uuid
from typing import Any

import httpx2 as httpx
import pytest

from tests.conftest import ADMIN_KEY, RCT_SCHEMA, synthetic_csv
from tests.live import live_server, post_burst

pytestmark = pytest.mark.slow
logger = logging.getLogger(__name__)

PROCESSES = 4
PER_PROCESS = 60  # 240 requests in all
THREADS = 16  # per process: up to 64 requests in flight
PARAMS = {"epsilon": 0.5, "nuisance": "none"}


def _setup(base: str, epsilon_total: float) -> tuple[dict[str, str], str, dict[str, str]]:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    owner = httpx.post(
        f"{base}/v1/principals", json={"name": "o", "role": "owner"}, headers=admin
    ).json()
    owner_h = {"Authorization": f"Bearer {owner['api_key']}"}
    ds = httpx.post(
        f"{base}/v1/datasets",
        data={"name": "d", "schema": json.dumps(RCT_SCHEMA)},
        files={"file": ("r.csv", synthetic_csv(500).encode(), "text/csv")},
        headers=owner_h,
    ).json()
    r = httpx.put(
        f"{base}/v1/datasets/{ds['id']}/budget",
        json={"epsilon_total": epsilon_total, "delta_total": 1e-3},
        headers=owner_h,
    )
    assert r.status_code == 200, r.text
    analyst = httpx.post(
        f"{base}/v1/principals", json={"name": "a", "role": "analyst"}, headers=admin
    ).json()
    r = httpx.put(f"{base}/v1/datasets/{ds['id']}/grants/{analyst['id']}", json={}, headers=owner_h)
    assert r.status_code == 200, r.text
    return owner_h, ds["id"], {"Authorization": f"Bearer {analyst['api_key']}"}


def _burst(
    bases: list[str], dataset: str, analyst: dict[str, str]
) -> tuple[list[tuple[int, dict[str, Any]]], float]:
    """PROCESSES x PER_PROCESS identical requests, each with its own Idempotency-Key."""
    start_at = time.time() + 3.0  # the pool's processes are up and warm by then
    jobs = [
        (
            bases,
            f"/v1/datasets/{dataset}/releases",
            {"kind": "ate", "params": PARAMS},
            [analyst | {"Idempotency-Key": uuid.uuid4().hex} for _ in range(PER_PROCESS)],
            start_at,
            THREADS,
        )
        for _ in range(PROCESSES)
    ]
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        replies = [r for chunk in pool.starmap(post_burst, jobs) for r in chunk]
    return replies, time.time() - start_at


def _check(
    base: str,
    owner_h: dict[str, str],
    dataset: str,
    replies: list[tuple[int, dict[str, Any]]],
    *,
    spent: float,
) -> str:
    assert len(replies) == PROCESSES * PER_PROCESS
    codes = [code for code, _ in replies]
    assert all(code in (200, 202) for code in codes), [b for c, b in replies if c >= 300][:3]
    assert codes.count(202) == 1, codes  # the one charged request
    ids = {body["id"] for _, body in replies}
    assert len(ids) == 1, ids
    assert all(body["cached"] == (code == 200) for code, body in replies)
    (release_id,) = ids
    entries = httpx.get(f"{base}/v1/datasets/{dataset}/ledger", headers=owner_h).json()["entries"]
    charges = [e for e in entries if e["entry_type"] == "charge"]
    assert [e["release_id"] for e in charges] == [release_id]
    budget = httpx.get(f"{base}/v1/datasets/{dataset}/budget", headers=owner_h).json()
    assert budget["epsilon_spent"] == pytest.approx(spent)
    verify = httpx.get(f"{base}/v1/datasets/{dataset}/ledger/verify", headers=owner_h).json()
    assert verify["valid"] is True, verify
    return release_id


@pytest.mark.parametrize(
    "epsilon_total",
    [
        pytest.param(5.0, id="roomy"),  # losers lose on the reuse key
        pytest.param(0.5, id="exact"),  # losers mostly find the budget spent by the winner
    ],
)
def test_identical_requests_from_many_processes_charge_once(
    db_url: str, epsilon_total: float
) -> None:
    env = {"CURATOR_START_JOB_RUNNER": "false"}  # releases stay queued: reusable, never run
    with (
        live_server(db_url, admin_key=ADMIN_KEY, extra_env=env) as one,
        live_server(
            db_url,
            admin_key=ADMIN_KEY,
            extra_env=env | {"CURATOR_RUN_MIGRATIONS_ON_START": "false"},
        ) as two,
    ):
        owner_h, dataset, analyst = _setup(one, epsilon_total)
        replies, seconds = _burst([one, two], dataset, analyst)
        release_id = _check(one, owner_h, dataset, replies, spent=0.5)
        logger.info(
            "reuse burst (budget %s): %d requests from %d processes to 2 servers, 1 charge, %.1f s",
            epsilon_total,
            len(replies),
            PROCESSES,
            seconds,
        )

        # A fresh request is still charged anew, and never reused by the burst's key.
        if epsilon_total > 0.5:
            r = httpx.post(
                f"{two}/v1/datasets/{dataset}/releases",
                json={"kind": "ate", "params": PARAMS, "fresh": True},
                headers=analyst | {"Idempotency-Key": uuid.uuid4().hex},
            )
            assert r.status_code == 202, r.text
            assert r.json()["id"] != release_id
