"""procrastinate, the job queue on PostgreSQL: the app, its tasks and an in-process worker.

Tasks (queue ``releases``):

* ``release(release_id)``: validates its payload, then runs
  ``service.jobs.execute.execute_release_job``, the same code the embedded SQLite runner runs.
  A payload that does not validate fails its release (if it names one) with the public reason
  ``invalid-job``, keeping the charge; the job itself ends without retry, so it cannot poison
  the queue.
* ``recover`` (periodic, every ``recovery_seconds``; one run per tick across all workers):
  ``recover_stale`` re-queues releases whose worker died before reading the rows and fails the
  others keeping their charge; procrastinate's stalled jobs (their worker stopped beating) are
  retried by the engine, and their re-run finds the release already settled or re-queued; any
  queued release without a pending job (an upgrade) is deferred; finished queue rows older than
  a week are deleted (the release row keeps the outcome).

Workers run sync tasks in threads (``concurrency`` per process); fits release the GIL in BLAS.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import procrastinate
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from service.jobs import execute, queue

logger = logging.getLogger("service.jobs")


class ReleaseJob(BaseModel):
    """The payload of a ``release`` job."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    release_id: str = Field(pattern=r"^[0-9a-f]{32}$")


def conninfo(database_url: str) -> str:
    """libpq connection string of a SQLAlchemy ``postgresql+psycopg://`` URL."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


def make_app(
    database_url: str,
    factory: sessionmaker[Session],
    *,
    buckets: tuple[float, ...],
    stale_after: float,
    recovery_seconds: int = 5,
    pause: tuple[float, float] = (0.0, 0.0),
) -> procrastinate.App:
    """The procrastinate app with the release and recovery tasks bound to ``factory``.

    ``pause`` (before, after reading the rows; tests only) holds a job so a test can kill its
    worker at a known point.
    """
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=conninfo(database_url))
    )
    worker = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    heartbeats = execute.Heartbeats(factory, every=execute.beat_interval(stale_after))

    def hook(when: float) -> Any:
        return (lambda: _sleep(when)) if when > 0 else None

    @app.task(name=queue.TASK, queue=queue.QUEUE)
    def release(**payload: Any) -> str:
        try:
            job = ReleaseJob.model_validate(payload)
        except ValidationError:
            named = payload.get("release_id")
            if isinstance(named, str) and len(named) <= 64:
                execute.fail_invalid(factory, named)
            logger.warning("a release job with an invalid payload was dropped")
            return "invalid"
        before, after = pause
        if before > 0:
            outcome = _paused_run(factory, job.release_id, worker, buckets, heartbeats, pause)
        else:
            outcome = execute.execute_release_job(
                factory,
                job.release_id,
                worker=worker,
                buckets=buckets,
                heartbeats=heartbeats,
                run_hook=hook(after),
            )
        if outcome in ("done", "failed"):
            # the worker's slot frees at the padded completion time (execute.hold_until_visible)
            execute.hold_until_visible(factory, job.release_id, _sleep)
        return outcome

    @app.periodic(cron=f"* * * * * */{max(1, int(recovery_seconds))}", periodic_id="recover")
    @app.task(name="recover", queue=queue.QUEUE, queueing_lock="recover", pass_context=True)
    async def recover(context: procrastinate.JobContext, timestamp: int) -> None:
        await asyncio.to_thread(
            execute.recover_stale,
            factory,
            stale_after=stale_after,
            enqueue=queue.enqueue,
            buckets=buckets,
        )
        await asyncio.to_thread(queue.enqueue_orphans, factory)
        manager = context.app.job_manager
        for job in await manager.get_stalled_jobs(seconds_since_heartbeat=stale_after):
            if job.id is not None and job.id != context.job.id:
                try:
                    await manager.retry_job_by_id_async(job.id, retry_at=datetime.now(UTC))
                except Exception:  # another worker's recovery retried it first
                    logger.debug("stalled job %s was retried elsewhere", job.id)
        # The queue's finished rows are delivery records only (the release row holds the
        # outcome): keep a week of them.
        await manager.delete_old_jobs(
            nb_hours=168,
            queue=queue.QUEUE,
            include_failed=True,
            include_cancelled=True,
            include_aborted=True,
        )

    return app


def _sleep(seconds: float) -> None:
    threading.Event().wait(seconds)


def _paused_run(
    factory: sessionmaker[Session],
    release_id: str,
    worker: str,
    buckets: tuple[float, ...],
    heartbeats: execute.Heartbeats,
    pause: tuple[float, float],
) -> str:
    """Tests only: claim, hold before the rows are read, then run (holding after if asked)."""
    with factory() as session:
        token = execute.claim(session, release_id, worker)
        session.commit()
    if token is None:
        return "skipped"
    heartbeats.add(release_id, token)
    _sleep(pause[0])
    return execute.execute_release_job(
        factory,
        release_id,
        worker=worker,
        buckets=buckets,
        heartbeats=heartbeats,
        token=token,
        run_hook=(lambda: _sleep(pause[1])) if pause[1] > 0 else None,
    )


def worker_options(concurrency: int, stale_after: float) -> dict[str, Any]:
    return {
        "queues": [queue.QUEUE],
        "concurrency": concurrency,
        "install_signal_handlers": False,
        "update_heartbeat_interval": max(0.5, min(10.0, stale_after / 4)),
        "stalled_worker_timeout": stale_after,
        "shutdown_graceful_timeout": 5.0,
        "fetch_job_polling_interval": 1.0,
    }


# A worker that stopped on its own is started again after RESTART_DELAYS[i] seconds (the last
# repeats), i counting the restarts since the worker last ran for HEALTHY_SECONDS.
RESTART_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0)
HEALTHY_SECONDS = 60.0


async def supervise(
    app: procrastinate.App,
    options: dict[str, Any],
    stop: asyncio.Event,
    *,
    on_running: Callable[[], None] | None = None,
    delays: tuple[float, ...] = RESTART_DELAYS,
) -> int:
    """Run a procrastinate worker until ``stop`` is set, starting it again whenever it stops on
    its own; returns the number of restarts.

    procrastinate stops its worker, without an error, when a side task fails: its notification
    listener fails on any database error, so a PostgreSQL restart of a few seconds used to stop
    every worker for good (a walkthrough's operator saw the processes exit 0, charged releases
    stay queued and a running one keep its charge only when workers came back). Each attempt
    opens the app afresh (a new connection pool) and, if the database does not answer yet,
    waits the next delay. ``stop`` ends it gracefully: the running jobs finish (procrastinate's
    shutdown on cancellation). ``on_running`` is called once the first attempt is running."""
    restarts = 0
    attempt = 0
    while not stop.is_set():
        started = asyncio.get_running_loop().time()
        reason = "it stopped on its own (a database error stops its listener)"
        try:
            async with app.open_async():
                worker = asyncio.create_task(app.run_worker_async(**options))
                stopping = asyncio.create_task(stop.wait())
                if on_running is not None:
                    on_running()
                    on_running = None
                done, _ = await asyncio.wait(
                    {worker, stopping}, return_when=asyncio.FIRST_COMPLETED
                )
                if stopping in done:
                    worker.cancel()
                    try:
                        await worker
                    except asyncio.CancelledError:
                        pass
                    return restarts
                stopping.cancel()
                worker.result()  # the worker's own error, if it raised one
        except Exception as exc:  # an unreachable database, or the worker's error
            reason = f"{type(exc).__name__}"
        if asyncio.get_running_loop().time() - started >= HEALTHY_SECONDS:
            attempt = 0
        delay = delays[min(attempt, len(delays) - 1)]
        attempt += 1
        restarts += 1
        logger.warning("the job worker stopped: %s; starting it again in %g s", reason, delay)
        try:
            await asyncio.wait_for(stop.wait(), timeout=delay)
        except TimeoutError:
            pass
    return restarts


class InProcessWorker:
    """A procrastinate worker on its own event loop in a thread of this process, supervised
    (``supervise``: started again after a database outage).

    Used by an API process that should run jobs itself on PostgreSQL (``CURATOR_JOB_RUNNER=
    inprocess``; a single-process deployment, and the test suite). Same tasks, same engine.
    """

    def __init__(self, app: procrastinate.App, *, concurrency: int, stale_after: float) -> None:
        self.app = app
        self.options = worker_options(concurrency, stale_after)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="procrastinate", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            await supervise(self.app, self.options, self._stop, on_running=self._ready.set)
        except Exception:
            logger.exception("the in-process worker stopped")
        finally:
            self._ready.set()

    def stop(self, timeout: float = 10.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout)
