"""The autocommit read engine of the hot paths: no pre-ping, so a dropped connection must be
retried transparently, and it must never write."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from service.db import engine as db_engine


def test_read_survives_a_dropped_connection(configured: str) -> None:
    if configured.startswith("sqlite"):
        pytest.skip("SQLite connections are files: nothing to drop")
    backend = db_engine.read(lambda c: c.execute(text("SELECT pg_backend_pid()")).scalar())
    admin = create_engine(configured, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            killed = conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})
            assert killed.scalar() is True
    finally:
        admin.dispose()
    again = db_engine.read(lambda c: c.execute(text("SELECT pg_backend_pid()")).scalar())
    assert again != backend  # a fresh connection answered, no error reached the caller


def test_read_engine_cannot_write(configured: str) -> None:
    with pytest.raises(DBAPIError):
        db_engine.read(lambda c: c.execute(text("UPDATE principal SET name = 'x'")))
