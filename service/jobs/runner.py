"""The embedded queue: threads that claim ``queued`` release rows and run them.

This is how jobs are delivered on the SQLite default (``bash scripts/serve``: one process, no
other server), inside the API process or in ``python -m service.worker``. On PostgreSQL the
queue is procrastinate (``service.jobs.engine``) and the API processes run no jobs. Either way
the job body is ``service.jobs.execute.execute_release_job``; this module only finds work:

* the release row is the queue entry (``status = 'queued'``, indexed), claimed by one atomic
  conditional update, so several processes can poll one database safely;
* ``recover_stale`` (every heartbeat) re-queues releases whose worker died before reading the
  rows and fails, keeping the charge, those whose worker died after.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.db.models import Release
from service.jobs import execute, queue
from service.jobs.execute import STALE_AFTER_SECONDS, padded

logger = logging.getLogger("service.jobs")

__all__ = ["JobRunner", "padded"]


class JobRunner:
    """Worker threads of one process, polling the release table."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        *,
        workers: int,
        latency_buckets: tuple[float, ...],
        poll_seconds: float = 0.5,
        stale_after: float = STALE_AFTER_SECONDS,
        pause: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        self.factory = factory
        self.workers = workers
        self.buckets = latency_buckets
        self.poll = poll_seconds
        self.stale_after = stale_after
        self.pause = pause  # tests only: hold before / after reading the rows
        self.worker_id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.heartbeats = execute.Heartbeats(factory, every=execute.beat_interval(stale_after))
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._claims: dict[str, str] = {}  # claimed by claim_next, not yet executed
        self._lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        for i in range(self.workers):
            t = threading.Thread(target=self._loop, name=f"release-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        sweep = threading.Thread(target=self._sweep_loop, name="release-recovery", daemon=True)
        sweep.start()
        self._threads.append(sweep)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self.heartbeats.stop()
        for t in self._threads:
            t.join(timeout)

    def wait(self) -> None:
        """Block until ``stop`` (the worker command's main thread)."""
        self._stop.wait()

    # -- loops -----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                release_id = self.claim_next()
            except Exception:  # a database hiccup must not kill the worker
                logger.exception("claiming a job failed")
                release_id = None
            if release_id is None:
                self._stop.wait(self.poll)
                continue
            if self.pause[0] > 0:
                threading.Event().wait(self.pause[0])
            outcome = self.execute(release_id, run_hook=self._after_read_pause())
            if outcome in ("done", "failed"):
                execute.hold_until_visible(self.factory, release_id, self._stop.wait)

    def _sweep_loop(self) -> None:
        while not self._stop.wait(execute.beat_interval(self.stale_after)):
            try:
                self.recover_stale()
            except Exception:
                logger.exception("recovering stale jobs failed")

    def _after_read_pause(self) -> Callable[[], None] | None:
        after = self.pause[1]
        if after <= 0:
            return None
        return lambda: _hold(after)

    # -- steps -----------------------------------------------------------------------------
    def claim_next(self) -> str | None:
        """Atomically move one queued release to running; durable before any data is read."""
        with self.factory() as session:
            candidates = (
                session.execute(
                    select(Release.id)
                    .where(Release.status == "queued")
                    .order_by(Release.created_at)
                    .limit(5)
                )
                .scalars()
                .all()
            )
            for release_id in candidates:
                token = execute.claim(session, release_id, self.worker_id)
                if token is not None:
                    session.commit()
                    with self._lock:
                        self._claims[release_id] = token
                    self.heartbeats.add(release_id, token)
                    return release_id
            session.commit()
        return None

    def execute(self, release_id: str, *, run_hook: Callable[[], None] | None = None) -> str:
        """Run a release claimed by ``claim_next`` to done or failed. Never raises."""
        with self._lock:
            token = self._claims.pop(release_id, None)
        if token is None:
            return "skipped"
        return execute.execute_release_job(
            self.factory,
            release_id,
            worker=self.worker_id,
            buckets=self.buckets,
            heartbeats=self.heartbeats,
            token=token,
            run_hook=run_hook,
        )

    def recover_stale(self) -> tuple[list[str], list[str]]:
        """Re-queue or fail (charge kept) releases whose worker stopped beating."""
        return execute.recover_stale(
            self.factory, stale_after=self.stale_after, enqueue=queue.enqueue, buckets=self.buckets
        )


def _hold(seconds: float) -> None:
    threading.Event().wait(seconds)
