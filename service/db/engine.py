"""Engine and sessions. Routes get a session through ``SessionDep``; it commits at the edge."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import Depends
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from service.config import get_settings

# The largest OFFSET a listing accepts: far beyond any real list, and inside every backend's
# integer (a larger query value would overflow the driver: a 500 instead of a 422).
MAX_OFFSET = 2**31 - 1


def make_engine(
    url: str,
    *,
    connect_timeout: float | None = None,
    pool_size: int = 10,
    max_overflow: int = 20,
) -> Engine:
    """Create an engine. SQLite gets WAL, a busy timeout and write-locking transactions.

    On SQLite every transaction starts with ``BEGIN IMMEDIATE``: it takes the database's write
    lock up front, so a transaction that reads and then writes (the budget charge) can never
    fail with a lock upgrade error, and charges are serialised exactly as a row lock would
    serialise them on PostgreSQL.
    """
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 60},
            pool_pre_ping=True,
        )

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we emit BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=60000")
            # deleted rows' pages are overwritten, whatever this SQLite build's default
            cur.execute("PRAGMA secure_delete=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    args = {} if connect_timeout is None else {"connect_timeout": max(1, int(connect_timeout))}
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=pool_size,
        max_overflow=max_overflow,
        connect_args=args,
    )


def make_read_engine(url: str, *, pool_size: int = 5, max_overflow: int = 10) -> Engine:
    """An autocommit engine for single-statement reads on latency-critical paths.

    One round trip per read: no ``BEGIN``/``COMMIT`` (a single statement is consistent on its
    own), no pre-ping (``read`` retries once on a connection the database dropped), and on
    SQLite no write lock (WAL readers run beside the writer). Never used to write.
    """
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 60},
            isolation_level="AUTOCOMMIT",
        )

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout=60000")
            cur.execute("PRAGMA query_only=ON")
            cur.close()

        return engine
    return create_engine(
        url,
        isolation_level="AUTOCOMMIT",
        pool_size=pool_size,
        max_overflow=max_overflow,
        connect_args={"options": "-c default_transaction_read_only=on"},
    )


T = TypeVar("T")


def read(query: Callable[[Connection], T]) -> T:
    """Run ``query`` on a pooled read connection; once more if the connection was dropped."""
    for attempt in (1, 2):
        try:
            with get_read_engine().connect() as conn:
                return query(conn)
        except DBAPIError as exc:
            if attempt == 1 and exc.connection_invalidated:
                continue
            raise
    raise AssertionError("unreachable")


@lru_cache
def get_read_engine() -> Engine:
    s = get_settings()
    return make_read_engine(
        s.database_url, pool_size=max(1, s.db_pool_size // 2), max_overflow=s.db_max_overflow // 2
    )


@lru_cache
def get_engine() -> Engine:
    s = get_settings()
    return make_engine(s.database_url, pool_size=s.db_pool_size, max_overflow=s.db_max_overflow)


@lru_cache
def get_sessionmaker() -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(), expire_on_commit=False)


def get_session() -> Iterator[Session]:
    """Yield a session; commit if the request succeeded, roll back otherwise."""
    session = get_sessionmaker()()
    try:
        yield session
    except BaseException:
        session.rollback()
        raise
    else:
        session.commit()
    finally:
        session.close()


SessionDep = Annotated[Session, Depends(get_session)]


def snapshot(session: Session) -> bool:
    """Start ``session``'s transaction as one whose reads all see one state of the database
    without locking anything, if none is in progress: ``REPEATABLE READ`` on PostgreSQL (a
    check that reads a head and then the rows it heads cannot see a write committed between the
    two, and writers never wait for it); SQLite's transactions (``BEGIN IMMEDIATE``) are
    exclusive anyway. Returns False, changing nothing, inside a transaction already begun:
    the caller then reads its head ``FOR SHARE`` (consistent, and its own uncommitted writes
    stay visible, but writers wait). Routes commit their reads before a check for the first."""
    if session.in_transaction():
        return False
    if session.get_bind().dialect.name == "postgresql":
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
    return True


def reset_caches() -> None:
    """Forget the cached engine (tests and process forks)."""
    if get_engine.cache_info().currsize:
        get_engine().dispose()
    get_engine.cache_clear()
    get_sessionmaker.cache_clear()
    if get_read_engine.cache_info().currsize:
        get_read_engine().dispose()
    get_read_engine.cache_clear()
