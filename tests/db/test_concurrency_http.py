"""N concurrent release requests over HTTP, against two server processes on one database."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2 as httpx
import pytest

from tests.conftest import ADMIN_KEY, RCT_SCHEMA, synthetic_csv
from tests.live import live_server

pytestmark = pytest.mark.slow

PARAMS = {"epsilon": 0.5, "nuisance": "none"}


def _setup(base: str) -> tuple[str, str, str]:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    owner = httpx.post(
        f"{base}/v1/principals", json={"name": "o", "role": "owner"}, headers=admin
    ).json()
    ok = {"Authorization": f"Bearer {owner['api_key']}"}
    ds = httpx.post(
        f"{base}/v1/datasets",
        data={"name": "d", "schema": __import__("json").dumps(RCT_SCHEMA)},
        files={"file": ("r.csv", synthetic_csv(1000).encode(), "text/csv")},
        headers=ok,
    ).json()
    # 2.5 admits exactly k = 5 releases of 0.5 (0.5 is exact in binary).
    httpx.put(
        f"{base}/v1/datasets/{ds['id']}/budget",
        json={"epsilon_total": 2.5, "delta_total": 1e-3},
        headers=ok,
    )
    analysts = []
    for i in range(3):
        a = httpx.post(
            f"{base}/v1/principals", json={"name": f"a{i}", "role": "analyst"}, headers=admin
        ).json()
        httpx.put(f"{base}/v1/datasets/{ds['id']}/grants/{a['id']}", json={}, headers=ok)
        analysts.append(a["api_key"])
    return owner["api_key"], ds["id"], ",".join(analysts)


def test_concurrent_requests_across_processes_charge_exactly_k(db_url: str) -> None:
    env = {"CURATOR_START_JOB_RUNNER": "false"}
    with (
        live_server(db_url, admin_key=ADMIN_KEY, extra_env=env) as one,
        live_server(
            db_url,
            admin_key=ADMIN_KEY,
            extra_env=env | {"CURATOR_RUN_MIGRATIONS_ON_START": "false"},
        ) as two,
    ):
        owner, dataset, keys = _setup(one)
        analysts = keys.split(",")

        def request(i: int) -> int:
            base = (one, two)[i % 2]
            r = httpx.post(
                f"{base}/v1/datasets/{dataset}/releases",
                json={"kind": "ate", "params": PARAMS, "fresh": True},
                headers={
                    "Authorization": f"Bearer {analysts[i % 3]}",
                    "Idempotency-Key": uuid.uuid4().hex,
                },
                timeout=60,
            )
            return r.status_code

        with ThreadPoolExecutor(max_workers=24) as pool:
            codes = list(pool.map(request, range(24)))
        assert codes.count(202) == 5, codes
        assert codes.count(409) == 19, codes

        # Eight concurrent retries of one request with one key: one release, one charge.
        owner_h = {"Authorization": f"Bearer {owner}"}
        httpx.put(
            f"{one}/v1/datasets/{dataset}/budget",
            json={"epsilon_total": 5.0, "delta_total": 1e-3},
            headers=owner_h,
        )
        key = uuid.uuid4().hex

        def retry(i: int) -> dict[str, Any]:
            r = httpx.post(
                f"{(one, two)[i % 2]}/v1/datasets/{dataset}/releases",
                json={"kind": "ate", "params": PARAMS, "fresh": True},
                headers={"Authorization": f"Bearer {analysts[0]}", "Idempotency-Key": key},
                timeout=60,
            )
            assert r.status_code in (200, 202), r.text
            body: dict[str, Any] = r.json()
            return body

        with ThreadPoolExecutor(max_workers=8) as pool:
            ids = {b["id"] for b in pool.map(retry, range(8))}
        assert len(ids) == 1
        budget = httpx.get(f"{one}/v1/datasets/{dataset}/budget", headers=owner_h).json()
        assert budget["epsilon_spent"] == pytest.approx(3.0)
        verify = httpx.get(f"{two}/v1/datasets/{dataset}/ledger/verify", headers=owner_h).json()
        assert verify["valid"] is True
        charges = [
            e
            for e in httpx.get(f"{one}/v1/datasets/{dataset}/ledger", headers=owner_h).json()[
                "entries"
            ]
            if e["entry_type"] == "charge"
        ]
        assert len(charges) == 6
