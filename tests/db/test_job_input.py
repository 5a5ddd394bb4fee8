"""Bad input to the job layer: invalid payloads fail cleanly; an unreachable database at
start-up is one clear line, not a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from service.config import get_settings
from service.jobs.workers import jobs_in_process
from tests.conftest import RCT_SCHEMA, Api
from tests.live import ROOT

pytestmark = pytest.mark.slow


def _sql(db_url: str, sql: str, **params: Any) -> list[Any]:
    eng = create_engine(db_url)
    with eng.begin() as conn:
        result = conn.execute(text(sql), params)
        rows = list(result) if result.returns_rows else []
    eng.dispose()
    return rows


def _wait_status(client: TestClient, release_id: str, headers: dict[str, str]) -> dict[str, Any]:
    deadline = time.time() + 30
    while time.time() < deadline:
        body: dict[str, Any] = client.get(f"/v1/releases/{release_id}", headers=headers).json()
        if body["status"] in ("done", "failed"):
            return body
        time.sleep(0.05)
    raise AssertionError("release did not finish")


BODY = {"kind": "ate", "params": {"epsilon": 1.0, "nuisance": "none"}, "fresh": True}


def _queued_with_stored_params(
    api: Api, client: TestClient, db_url: str, stored: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, str], dict[str, Any]]:
    """With the runner stopped: an owner, a granted analyst, an RCT dataset (epsilon 3) and one
    queued ``ate`` release (epsilon 1) whose stored request is then replaced by ``stored``.
    Returns (owner, dataset, the analyst's headers, the release)."""
    client.app.state.runner.stop()  # type: ignore[attr-defined]
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"], n=300, schema=RCT_SCHEMA, epsilon_total=3.0)
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    ah = api.auth(analyst["api_key"])
    release = client.post(
        f"/v1/datasets/{ds['id']}/releases", json=BODY, headers=ah | {"Idempotency-Key": "q"}
    ).json()
    _sql(
        db_url,
        "UPDATE release SET params_json = :p WHERE id = :id",
        p=json.dumps({"params": stored, "fresh": True}),
        id=release["id"],
    )
    return owner, ds, ah, release


def test_invalid_job_payload_fails_the_release_keeps_charge_and_queue_moves_on(
    api: Api, client: TestClient, db_url: str
) -> None:
    # The stored request no longer validates inside the worker (as after an incompatible
    # upgrade of the kind's parameters).
    owner, ds, ah, bad = _queued_with_stored_params(
        api, client, db_url, {"epsilon": "lots", "bogus": 1}
    )
    postgres = db_url.startswith("postgresql")
    if postgres:
        # Payloads that are not a release job at all: one naming no release, one naming a
        # release with an extra field. Neither may be retried forever or block the others.
        for args in ({"nope": 1}, {"release_id": 42}):
            _sql(
                db_url,
                "SELECT procrastinate_defer_jobs_v1(ARRAY[ROW('releases', 'release', 0, "
                "NULL::text, NULL::text, CAST(:a AS jsonb), NULL::timestamptz)]"
                "::procrastinate_job_to_defer_v1[])",
                a=json.dumps(args),
            )

    runner = jobs_in_process(get_settings())
    runner.start()
    try:
        good = client.post(
            f"/v1/datasets/{ds['id']}/releases",
            json=BODY,
            headers=ah | {"Idempotency-Key": "good"},
        ).json()
        failed = _wait_status(client, bad["id"], ah)
        done = _wait_status(client, good["id"], ah)
    finally:
        runner.stop()
    assert failed["status"] == "failed"
    assert failed["result"] is None
    assert failed["error"]["type"].endswith("/release-failed")
    assert "did not validate" in failed["error"]["detail"]
    assert done["status"] == "done"
    oh = api.auth(owner["api_key"])
    budget = client.get(f"/v1/datasets/{ds['id']}/budget", headers=oh).json()
    assert budget["epsilon_spent"] == 2.0  # the failed release keeps its charge
    assert client.get(f"/v1/datasets/{ds['id']}/ledger/verify", headers=oh).json()["valid"]
    if postgres:
        left = _sql(
            db_url,
            "SELECT args, status FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
        )
        assert left == []


def test_job_whose_plan_changed_since_the_charge_fails_before_reading_rows(
    api: Api, client: TestClient, db_url: str
) -> None:
    """A stored request that still validates but resolves to another mechanism record than the
    one charged (as after an upgrade changes a default rule) is not run: invalid-job, no rows
    read, the charge kept."""
    # valid, but its plan (epsilon 1.5) is not the record the ledger charged (epsilon 1.0)
    owner, ds, ah, moved = _queued_with_stored_params(
        api, client, db_url, {"epsilon": 1.5, "nuisance": "none"}
    )
    runner = jobs_in_process(get_settings())
    runner.start()
    try:
        failed = _wait_status(client, moved["id"], ah)
    finally:
        runner.stop()
    assert failed["status"] == "failed"
    assert failed["result"] is None
    assert "another mechanism plan" in failed["error"]["detail"]
    read = _sql(db_url, "SELECT data_read_at FROM release WHERE id = :id", id=moved["id"])
    assert read == [(None,)]
    oh = api.auth(owner["api_key"])
    budget = client.get(f"/v1/datasets/{ds['id']}/budget", headers=oh).json()
    assert budget["epsilon_spent"] == 1.0  # the charge stays as it was made


@pytest.mark.parametrize("module", ["service", "service.worker"])
def test_unreachable_database_at_start_up_is_one_line(module: str) -> None:
    port = 1  # nothing listens there
    url = f"postgresql+psycopg://curator:secret@127.0.0.1:{port}/curator"
    proc = subprocess.run(
        [sys.executable, "-m", module],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "DATABASE_URL": url, "CURATOR_ADMIN_KEY": uuid.uuid4().hex},
        capture_output=True,
        timeout=60,
    )
    err = proc.stderr.decode().strip()
    assert proc.returncode == 1
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: cannot reach the database postgresql+psycopg://curator:***@")
    assert "secret" not in err


@pytest.mark.parametrize("module", ["service", "service.worker"])
@pytest.mark.parametrize(
    ("settings", "rule"),
    [
        ({"CURATOR_ADMIN_KEY": "Hospital-Admin-2026!"}, "CURATOR_STATE_KEY must be set"),
        (
            {"CURATOR_ADMIN_KEY": "Hospital-Admin-2026!", "CURATOR_STATE_KEY": "x" * 40},
            "must be base64 of 32 bytes",
        ),
        (
            {"CURATOR_ADMIN_KEY": "change-me", "CURATOR_STATE_KEY": "QWxs" * 11},
            "CURATOR_ADMIN_KEY must be set",
        ),
    ],
)
def test_a_refused_setting_is_one_line_without_its_value(
    module: str, settings: dict[str, str], rule: str
) -> None:
    """A refused configuration used to print pydantic's traceback with the input: the whole
    admin key, or the tail of the state key or the metrics token. Now one line naming the
    rule, exit status 1, no value."""
    env = {"PATH": "/usr/bin:/bin", "CURATOR_ENVIRONMENT": "production", **settings}
    proc = subprocess.run(
        [sys.executable, "-m", module], cwd=ROOT, env=env, capture_output=True, timeout=60
    )
    err = proc.stderr.decode().strip()
    assert proc.returncode == 1
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("configuration refused: ")
    assert rule in err
    for value in settings.values():
        assert value not in err
        assert value[-12:] not in err


def test_migrating_by_hand_needs_only_the_database_url(tmp_path: Path) -> None:
    """alembic upgrade head in production shape: the secrets are not asked for."""
    url = f"sqlite:///{tmp_path / 'by-hand.sqlite3'}"
    env = {"PATH": "/usr/bin:/bin", "CURATOR_ENVIRONMENT": "production", "DATABASE_URL": url}
    proc = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert (tmp_path / "by-hand.sqlite3").exists()
