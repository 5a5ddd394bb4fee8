"""Start-up check: is the database reachable? One clear line if not, never a traceback."""

from __future__ import annotations

import time

from sqlalchemy import text
from sqlalchemy.engine import make_url

from service.db import migrate
from service.db.engine import make_engine

# Query parameters whose values are hidden like the password (libpq takes ?password=...).
_SECRET_QUERY_WORDS = ("password", "passwd", "secret", "token", "key")


def safe_url(url: str) -> str:
    """The URL for messages and logs: its password hidden, in the user part or the query."""
    try:
        parsed = make_url(url)
        query = {
            name: ("***" if any(word in name.lower() for word in _SECRET_QUERY_WORDS) else value)
            for name, value in parsed.query.items()
        }
        return parsed.set(query=query).render_as_string(hide_password=True)
    except Exception:
        return "(unparseable DATABASE_URL)"


def _reason(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(orig).splitlines() if line.strip()]
    return (lines[0] if lines else type(orig).__name__)[:300]


def unreachable(url: str, timeout: float = 5.0) -> str | None:
    """None if ``SELECT 1`` works on ``url``; else the one line to print before exiting."""
    try:
        engine = make_engine(url, connect_timeout=timeout)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        finally:
            engine.dispose()
    except Exception as exc:
        return f"error: cannot reach the database {safe_url(url)}: {_reason(exc)}"
    return None


def _schema_state(url: str) -> str:
    """``migrate.schema_state`` of the database at ``url`` on a short-lived engine (raises
    what connecting raises)."""
    engine = make_engine(url, connect_timeout=5.0)
    try:
        return migrate.schema_state(engine, url)
    finally:
        engine.dispose()


def newer_schema(url: str) -> str | None:
    """The line to exit with where the database's schema is newer than this version's (a
    migration would fail with a traceback), else None."""
    try:
        state = _schema_state(url)
    except Exception:
        return None  # the migration itself reports what else is wrong
    if state == "newer":
        return f"error: database {safe_url(url)}: {migrate.NEWER_SCHEMA}"
    return None


def wait_for_schema(url: str, seconds: float) -> str | None:
    """Wait until the database's migrations are at head (the API migrates at start-up)."""
    deadline = time.time() + seconds
    while True:
        try:
            state = _schema_state(url)
        except Exception as exc:
            last = _reason(exc)
        else:
            if state == "current":
                return None
            if state == "newer":
                return f"error: database {safe_url(url)} not ready: {migrate.NEWER_SCHEMA}"
            last = (
                "its schema is not at the current migration (an API process migrates it at "
                "start, or run `python -m service.db.migrate` where "
                "CURATOR_RUN_MIGRATIONS_ON_START is false)"
            )
        if time.time() > deadline:
            return f"error: database {safe_url(url)} not ready: {last}"
        time.sleep(1.0)
