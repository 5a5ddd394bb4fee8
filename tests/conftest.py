"""Fixtures: a real database per backend (SQLite file and PostgreSQL), an app and API helpers.

PostgreSQL is taken from ``CURATOR_TEST_POSTGRES_URL`` (default: the local ``test`` database).
Locally it is skipped with a message when unreachable; with ``CURATOR_REQUIRE_POSTGRES=1`` (CI)
an unreachable server fails the run.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from service.config import get_settings
from service.db import engine as db_engine
from service.db import migrate
from service.db.models import Base

ADMIN_KEY = "test-admin-key"
PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _require_pg() -> bool:
    return os.environ.get("CURATOR_REQUIRE_POSTGRES", "") == "1"


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite") / "template.sqlite3"
    migrate.upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    base = os.environ.get("CURATOR_TEST_POSTGRES_URL", PG_DEFAULT)
    name = f"curator_test_{uuid.uuid4().hex[:10]}"
    try:
        admin = create_engine(
            base, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5}
        )
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        if _require_pg():
            pytest.fail(f"PostgreSQL is required (CURATOR_REQUIRE_POSTGRES=1) but failed: {exc}")
        pytest.skip(f"PostgreSQL not reachable at {make_url(base).render_as_string()}: skipped")
    url = make_url(base).set(database=name).render_as_string(hide_password=False)
    migrate.upgrade(url)
    yield url
    db_engine.reset_caches()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _truncate(url: str) -> None:
    eng = create_engine(url)
    with eng.begin() as conn:
        names = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
        names += ", procrastinate_jobs, procrastinate_workers, procrastinate_periodic_defers"
        conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
    eng.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database of each backend."""
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "curator.sqlite3"
        shutil.copy(template, path)
        return f"sqlite:///{path}"
    url: str = request.getfixturevalue("postgres_database")
    _truncate(url)
    return url


@pytest.fixture
def configured(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Point the service's settings at ``db_url`` (fast job polling, small latency buckets)."""
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("CURATOR_ADMIN_KEY", ADMIN_KEY)
    monkeypatch.setenv("CURATOR_ENVIRONMENT", "test")
    monkeypatch.setenv("CURATOR_JOB_POLL_SECONDS", "0.02")
    monkeypatch.setenv("CURATOR_LATENCY_BUCKETS", "[0.05, 0.1, 0.5, 1, 5, 30, 120]")
    monkeypatch.setenv("CURATOR_RUN_MIGRATIONS_ON_START", "false")
    # On PostgreSQL too the app runs its jobs (a procrastinate worker in the process).
    monkeypatch.setenv("CURATOR_JOB_RUNNER", "inprocess")
    get_settings.cache_clear()
    db_engine.reset_caches()
    yield db_url
    db_engine.reset_caches()
    get_settings.cache_clear()


@pytest.fixture
def client(configured: str) -> Iterator[TestClient]:
    from service.main import create_app

    with TestClient(create_app(), raise_server_exceptions=False) as c:
        yield c


class Api:
    """Small helpers over the HTTP API for tests."""

    def __init__(self, client: TestClient) -> None:
        self.c = client

    @staticmethod
    def auth(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def principal(self, role: str, name: str | None = None) -> dict[str, Any]:
        r = self.c.post(
            "/v1/principals",
            json={"name": name or f"{role}-{uuid.uuid4().hex[:6]}", "role": role},
            headers=self.auth(ADMIN_KEY),
        )
        assert r.status_code == 201, r.text
        body: dict[str, Any] = r.json()
        return body

    def upload(
        self, owner_key: str, csv_text: str, schema: dict[str, Any], name: str = "ds", **form: Any
    ) -> Any:
        return self.c.post(
            "/v1/datasets",
            data={"name": name, "schema": json.dumps(schema), **form},
            files={"file": ("rows.csv", io.BytesIO(csv_text.encode()), "text/csv")},
            headers=self.auth(owner_key),
        )

    def dataset(
        self,
        owner_key: str,
        *,
        n: int = 400,
        epsilon_total: float | None = 10.0,
        delta_total: float = 1e-4,
        schema: dict[str, Any] | None = None,
        seed: int = 0,
    ) -> dict[str, Any]:
        r = self.upload(owner_key, synthetic_csv(n, seed=seed), schema or SCHEMA)
        assert r.status_code == 201, r.text
        ds: dict[str, Any] = r.json()
        if epsilon_total is not None:
            b = self.c.put(
                f"/v1/datasets/{ds['id']}/budget",
                json={"epsilon_total": epsilon_total, "delta_total": delta_total},
                headers=self.auth(owner_key),
            )
            assert b.status_code == 200, b.text
        return ds

    def grant(self, owner_key: str, dataset_id: str, principal_id: str, **caps: Any) -> None:
        r = self.c.put(
            f"/v1/datasets/{dataset_id}/grants/{principal_id}",
            json=caps,
            headers=self.auth(owner_key),
        )
        assert r.status_code == 200, r.text


SCHEMA: dict[str, Any] = {
    "covariates": [
        {"name": "age", "lower": 18, "upper": 90},
        {"name": "severity", "lower": 0, "upper": 1},
        {"name": "sex", "type": "categorical", "codes": [0, 1]},
    ],
    "treatment": {"name": "treated"},
    "outcome": {"name": "outcome", "lower": -5, "upper": 5},
    "drop_columns": ["patient_id"],
    "out_of_bounds": "clip",
    "missing": "reject_upload",
}

RCT_SCHEMA: dict[str, Any] = {**SCHEMA, "design": "rct", "treatment_probability": 0.5}


def synthetic_csv(n: int, *, seed: int = 0) -> str:
    """A small observational study with a true ATE of 1.0 (test data, not a benchmark DGP)."""
    rng = np.random.default_rng(seed)
    age = rng.uniform(18, 90, n)
    severity = rng.uniform(0, 1, n)
    sex = rng.integers(0, 2, n)
    p = 1 / (1 + np.exp(-(severity - 0.5)))
    t = (rng.uniform(size=n) < p).astype(int)
    y = np.clip(0.02 * (age - 50) + severity + 1.0 * t + rng.normal(0, 0.5, n), -5, 5)
    lines = ["patient_id,age,severity,sex,treated,outcome"]
    lines += [
        f"P{i:06d},{age[i]:.3f},{severity[i]:.4f},{sex[i]},{t[i]},{y[i]:.4f}" for i in range(n)
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def api(client: TestClient) -> Api:
    return Api(client)
