"""Are release jobs being run? The PostgreSQL job queue's worker heartbeats, read for the
release view and ``/metrics``.

On PostgreSQL the API processes run no jobs by default: ``python -m service.worker`` processes
do, and each beats in procrastinate's ``procrastinate_workers`` table (every
``job_stale_seconds / 4``, at most 10 s). With none beating, a queued release waits without
end, which a reader could not tell from a long queue. A worker counts as alive when it beat
within ``job_stale_seconds`` (the same horizon after which its jobs are recovered).

On SQLite the embedded runner runs inside the API process (or a ``service.worker`` process on
the same file) and keeps no worker table: the service cannot tell, so ``None``.

Nothing here is about data: worker counts and heartbeat times only.
"""

from __future__ import annotations

from sqlalchemy import Connection, text

from service.config import Settings
from service.db.engine import read

_ALIVE = text(
    "SELECT count(*) FROM procrastinate_workers "
    "WHERE last_heartbeat > now() - make_interval(secs => :seconds)"
)


def workers_alive(settings: Settings) -> int | None:
    """Job workers that beat within ``job_stale_seconds`` (PostgreSQL; on a pooled read
    connection of its own, so a failure cannot touch the caller's transaction); ``None`` where
    the service cannot tell (SQLite) or the queue's table cannot be read."""
    if not settings.is_postgres:
        return None

    def count(conn: Connection) -> int:
        return int(conn.execute(_ALIVE, {"seconds": settings.job_stale_seconds}).scalar_one())

    try:
        return read(count)
    except Exception:
        return None


def waiting_note(settings: Settings) -> str:
    """Why a queued release has not started, when no worker is alive."""
    return (
        f"no job worker has been seen in the last {settings.job_stale_seconds:g} s: this "
        "release starts when one runs (an operator starts them with python -m service.worker); "
        "it is charged and kept until then"
    )
