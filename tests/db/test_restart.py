"""Datasets, budgets and releases survive a server restart (a new process, same database)."""

from __future__ import annotations

import json
import time
import uuid

import httpx2 as httpx
import pytest

from tests.conftest import ADMIN_KEY, RCT_SCHEMA, synthetic_csv
from tests.live import live_server

pytestmark = pytest.mark.slow


def test_state_survives_restart(db_url: str) -> None:
    env = {"CURATOR_LATENCY_BUCKETS": "[0.05]"}
    with live_server(db_url, admin_key=ADMIN_KEY, extra_env=env) as base:
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        owner = httpx.post(
            f"{base}/v1/principals", json={"name": "o", "role": "owner"}, headers=admin
        ).json()
        oh = {"Authorization": f"Bearer {owner['api_key']}"}
        ds = httpx.post(
            f"{base}/v1/datasets",
            data={"name": "d", "schema": json.dumps(RCT_SCHEMA)},
            files={"file": ("r.csv", synthetic_csv(600).encode(), "text/csv")},
            headers=oh,
        ).json()
        httpx.put(
            f"{base}/v1/datasets/{ds['id']}/budget",
            json={"epsilon_total": 2.0, "delta_total": 1e-4},
            headers=oh,
        )
    with live_server(db_url, admin_key=ADMIN_KEY, extra_env=env) as base:
        meta = httpx.get(f"{base}/v1/datasets/{ds['id']}", headers=oh).json()
        assert meta["n"] == 600
        assert meta["budget"]["epsilon_total"] == 2.0
        r = httpx.post(
            f"{base}/v1/datasets/{ds['id']}/releases",
            json={"kind": "ate", "params": {"epsilon": 1.0, "nuisance": "none"}},
            headers=oh | {"Idempotency-Key": uuid.uuid4().hex},
        )
        assert r.status_code == 202, r.text
        deadline = time.time() + 60
        while time.time() < deadline:
            body = httpx.get(f"{base}/v1/releases/{r.json()['id']}", headers=oh).json()
            if body["status"] in ("done", "failed"):
                break
            time.sleep(0.1)
        assert body["status"] == "done"
        assert httpx.get(f"{base}/v1/datasets/{ds['id']}/ledger/verify", headers=oh).json()["valid"]
