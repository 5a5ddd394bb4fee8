"""Who runs jobs in this process: the embedded runner (SQLite) or a procrastinate worker."""

from __future__ import annotations

from typing import Protocol

from service.config import Settings
from service.db.engine import get_sessionmaker


class Runner(Protocol):
    def start(self) -> None: ...

    def stop(self, timeout: float = ...) -> None: ...


def jobs_in_process(settings: Settings, *, concurrency: int | None = None) -> Runner:
    """The job runner for this process's database: procrastinate on PostgreSQL, else the
    embedded runner. Both run ``service.jobs.execute.execute_release_job``."""
    n = concurrency or settings.job_workers
    if settings.is_postgres:
        from service.jobs.engine import InProcessWorker, make_app

        app = make_app(
            settings.database_url,
            get_sessionmaker(),
            buckets=settings.latency_buckets,
            stale_after=settings.job_stale_seconds,
            recovery_seconds=settings.job_recovery_seconds,
            pause=settings.job_pause,
        )
        return InProcessWorker(app, concurrency=n, stale_after=settings.job_stale_seconds)
    from service.jobs.runner import JobRunner

    return JobRunner(
        get_sessionmaker(),
        workers=n,
        latency_buckets=settings.latency_buckets,
        poll_seconds=settings.job_poll_seconds,
        stale_after=settings.job_stale_seconds,
        pause=settings.job_pause,
    )
