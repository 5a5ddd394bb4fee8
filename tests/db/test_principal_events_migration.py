"""The principal-events revisions give every principal created before them one ``created`` event,
and one disabled then its ``disabled`` event, which ``service.auth.events.verify`` accepts, on
both databases."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from service.auth import events
from service.db import migrate
from service.db.models import Principal, PrincipalEvent
from tests.conftest import PG_DEFAULT

BEFORE = "c5e9a1d7f3b2"  # the revision before principal events


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.sqlite3'}"
        return
    request.getfixturevalue("postgres_database")  # skips (or fails in CI) without a server
    base = os.environ.get("CURATOR_TEST_POSTGRES_URL", PG_DEFAULT)
    name = f"curator_mig_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield make_url(base).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def test_existing_principals_get_a_verifiable_created_event(empty_url: str) -> None:
    cfg = migrate.alembic_config(empty_url)
    command.upgrade(cfg, BEFORE)
    engine = create_engine(empty_url)
    with engine.begin() as conn:
        for pid, by, disabled in (("p1", "admin", False), ("p2", None, False), ("p3", "a", True)):
            conn.execute(
                text(
                    "INSERT INTO principal (id, name, role, key_hash, key_prefix, created_at, "
                    "created_by, disabled) VALUES (:id, 'n', 'analyst', :h, 'dpc_Ab3xYz', "
                    "'2026-11-20T10:00:00.000000+00:00', :by, :disabled)"
                ),
                {"id": pid, "h": pid * 32, "by": by, "disabled": disabled},
            )
    command.upgrade(cfg, "head")
    with Session(engine) as session:
        # disabled before the record: created, then disabled by the admin at the upgrade
        disabled = session.get(Principal, "p3")
        assert disabled is not None
        assert disabled.event_count == 2
        rows = session.query(PrincipalEvent).filter_by(principal_id="p3").order_by("seq").all()
        assert [(r.event, r.actor_id) for r in rows] == [("created", "a"), ("disabled", "admin")]
        assert events.verify(session, disabled).valid
        # re-enabled through the service, the record still verifies
        disabled.disabled = False
        events.record(session, disabled, "enabled", actor_id="admin")
        session.flush()
        assert events.verify(session, disabled).valid
        for pid in ("p1", "p2"):
            principal = session.get(Principal, pid)
            assert principal is not None
            assert principal.event_count == 1
            (row,) = session.query(PrincipalEvent).filter_by(principal_id=pid).all()
            assert (row.seq, row.event, row.actor_id) == (1, "created", "admin")
            assert row.created_at == "2026-11-20T10:00:00.000000+00:00"
            assert events.verify(session, principal).valid
            assert row.key_prefix == "dpc_Ab3x"  # the 8 shown characters, not the stored 10
            # and the chain continues from the backfilled head
            principal.disabled = True
            events.record(session, principal, "disabled", actor_id="admin")
            session.flush()
            assert events.verify(session, principal) == events.Verification(
                True, 2, principal.last_event_hash or ""
            )
        session.rollback()
    # and back: the events table first, the columns dropped in place (datasets point at it)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO dataset (id, owner_id, name, description, schema_json, "
                "schema_hash, n, q, version, status, allow_paper_mode, created_at) VALUES "
                "('d1', 'p1', 'd', '', '{}', 'h', 0, 0, 1, 'ready', false, 'now')"
            )
        )
    engine.dispose()
    command.downgrade(cfg, BEFORE)
    command.upgrade(cfg, "head")
