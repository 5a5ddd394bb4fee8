"""Who runs jobs in this process: the embedded runner (SQLite) or a procrastinate worker."""

from __future__ import annotations

from typing import Any, Protocol

from service.config import Settings
from service.db.engine import get_sessionmaker
from service.jobs.runner import JobRunner


class Runner(Protocol):
    def start(self) -> None: ...

    def stop(self, timeout: float = ...) -> None: ...


def procrastinate_app(settings: Settings) -> Any:
    """The procrastinate app of this database, configured from the settings (PostgreSQL)."""
    from service.jobs.engine import make_app

    return make_app(
        settings.database_url,
        get_sessionmaker(),
        buckets=settings.latency_buckets,
        stale_after=settings.job_stale_seconds,
        recovery_seconds=settings.job_recovery_seconds,
        pause=settings.job_pause,
    )


def embedded_runner(settings: Settings, concurrency: int) -> JobRunner:
    """The embedded row-claim runner (SQLite), configured from the settings."""
    return JobRunner(
        get_sessionmaker(),
        workers=concurrency,
        latency_buckets=settings.latency_buckets,
        poll_seconds=settings.job_poll_seconds,
        stale_after=settings.job_stale_seconds,
        pause=settings.job_pause,
    )


def jobs_in_process(settings: Settings, *, concurrency: int | None = None) -> Runner:
    """The job runner for this process's database: procrastinate on PostgreSQL, else the
    embedded runner. Both run ``service.jobs.execute.execute_release_job``."""
    n = concurrency or settings.job_workers
    if settings.is_postgres:
        from service.jobs.engine import InProcessWorker

        return InProcessWorker(
            procrastinate_app(settings), concurrency=n, stale_after=settings.job_stale_seconds
        )
    return embedded_runner(settings, n)
