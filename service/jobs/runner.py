"""Release jobs: claim -> mark started (durably) -> load rows -> kind.run -> store.

Several server processes may run jobs against one database: a job is claimed by one atomic
conditional update, so it runs at most once. A job whose process died is marked failed by the
stale-job sweep (never re-run, never refunded). Completion is padded to public latency buckets.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from service.datasets import service as datasets
from service.datasets import storage
from service.db.models import Dataset, Release
from service.functions import service as functions
from service.functions.payload import SECRET_KEY, FunctionSecret
from service.ledger.service import now_iso
from service.mechanisms.domain import Arrays
from service.mechanisms.noise import OpenDPSampler, secure_rng
from service.releases.kinds import REGISTRY

logger = logging.getLogger("service.jobs")

HEARTBEAT_SECONDS = 5.0
STALE_AFTER_SECONDS = 60.0


def padded(elapsed: float, buckets: tuple[float, ...]) -> float:
    """The first public bucket at or above ``elapsed`` (or a multiple of the last one)."""
    for bucket in buckets:
        if elapsed <= bucket:
            return bucket
    last = buckets[-1]
    return last * (int(elapsed // last) + 1)


class JobRunner:
    """Worker threads of one server process."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        *,
        workers: int,
        latency_buckets: tuple[float, ...],
        poll_seconds: float = 0.5,
        stale_after: float = STALE_AFTER_SECONDS,
    ) -> None:
        self.factory = factory
        self.workers = workers
        self.buckets = latency_buckets
        self.poll = poll_seconds
        self.stale_after = stale_after
        self.worker_id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._running: set[str] = set()
        self._lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        for i in range(self.workers):
            t = threading.Thread(target=self._loop, name=f"release-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        hb = threading.Thread(target=self._heartbeat_loop, name="release-heartbeat", daemon=True)
        hb.start()
        self._threads.append(hb)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout)

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
            self.execute(release_id)

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self.heartbeat()
                self.fail_stale()
            except Exception:
                logger.exception("heartbeat failed")

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
                now = time.time()
                claimed = session.execute(
                    update(Release)
                    .where(Release.id == release_id, Release.status == "queued")
                    .values(
                        status="running",
                        stage="started",
                        started_at=now_iso(),
                        heartbeat_at=now,
                        claimed_by=self.worker_id,
                    )
                    .returning(Release.id)
                ).first()
                if claimed is not None:
                    session.commit()
                    with self._lock:
                        self._running.add(release_id)
                    return release_id
            session.commit()
        return None

    def execute(self, release_id: str, *, run_hook: Callable[[], None] | None = None) -> None:
        """Run a claimed release to done or failed. Never raises."""
        started = time.time()
        outcome: dict[str, Any] = {}
        secret: FunctionSecret | None = None
        dataset_id = ""
        progress = self._progress_writer(release_id)
        try:
            # Outside the session below: on SQLite a second writer would wait for its lock.
            progress(0.0, "loading rows")
            with self.factory() as session:
                release = session.get(Release, release_id)
                assert release is not None
                assert release.status == "running"
                dataset = session.get(Dataset, release.dataset_id)
                assert dataset is not None
                dataset_id = dataset.id
                if dataset.status != "ready":
                    raise RuntimeError("rows deleted")
                kind = REGISTRY[release.kind]
                params = kind.Params.model_validate(json.loads(release.params_json)["params"])
                domain = datasets.domain_of(dataset)
                matrix = storage.load_matrix(session, dataset_id=dataset.id)
                session.commit()
            q = domain.q
            arrays = Arrays(x=matrix[:, :q], a=matrix[:, q], y=matrix[:, q + 1])
            del matrix
            if run_hook is not None:
                run_hook()
            result = kind.run(
                arrays,
                domain,
                params,
                rng=secure_rng(),
                noise=OpenDPSampler(),
                progress=progress,
            )
            # A released function's secret state is stored with the result, never in it.
            secret = result.pop(SECRET_KEY, None)
            outcome = {"status": "done", "result_json": json.dumps(result, allow_nan=False)}
        except Exception as exc:
            # Operators see the exception type only: its text may contain data.
            logger.warning("release %s failed (%s)", release_id, type(exc).__name__)
            outcome = {"status": "failed", "result_json": None}
        finally:
            elapsed = time.time() - started
            visible_at = started + padded(elapsed, self.buckets)
            try:
                self._finish(release_id, dataset_id, outcome, secret, visible_at)
            except Exception as exc:
                # The result (or a released function's state) could not be stored. Nothing of
                # it may be served, so the release fails now, in a fresh transaction; its charge
                # stays (the noise was drawn). If even that fails, the stale sweep fails it.
                logger.warning(
                    "storing the outcome of release %s failed (%s)", release_id, type(exc).__name__
                )
                try:
                    self._finish(release_id, dataset_id, {"status": "failed"}, None, visible_at)
                except Exception:
                    logger.exception("marking release %s failed did not work", release_id)
            with self._lock:
                self._running.discard(release_id)

    def _finish(
        self,
        release_id: str,
        dataset_id: str,
        outcome: dict[str, Any],
        secret: FunctionSecret | None,
        visible_at: float,
    ) -> None:
        """One transaction: the function's state (if any) and the release's final status."""
        status = outcome.get("status", "failed")
        with self.factory() as session:
            if secret is not None and status == "done":
                functions.store(
                    session, release_id=release_id, dataset_id=dataset_id, secret=secret
                )
            session.execute(
                update(Release)
                .where(Release.id == release_id, Release.status == "running")
                .values(
                    status=status,
                    result_json=outcome.get("result_json") if status == "done" else None,
                    progress=1.0,
                    stage=status,
                    finished_at=now_iso(),
                    visible_at=visible_at,
                )
            )
            session.commit()

    def _progress_writer(self, release_id: str) -> Callable[[float, str], None]:
        """Progress updates: every change of stage is written; within a stage at most 2 per s."""
        last_time = [0.0]
        last_stage = [""]

        def write(fraction: float, stage: str) -> None:
            now = time.time()
            if stage == last_stage[0] and now - last_time[0] < 0.5:
                return
            last_time[0], last_stage[0] = now, stage
            with self.factory() as session:
                session.execute(
                    update(Release)
                    .where(Release.id == release_id, Release.status == "running")
                    .values(
                        progress=max(0.0, min(0.99, float(fraction))),
                        stage=stage[:64],
                        heartbeat_at=now,
                    )
                )
                session.commit()

        return write

    def heartbeat(self) -> None:
        with self._lock:
            running = list(self._running)
        if not running:
            return
        with self.factory() as session:
            session.execute(
                update(Release)
                .where(Release.id.in_(running), Release.status == "running")
                .values(heartbeat_at=time.time())
            )
            session.commit()

    def fail_stale(self) -> int:
        """Mark failed every running release whose worker stopped beating. Charges stay."""
        cutoff = time.time() - self.stale_after
        with self.factory() as session:
            rows = session.execute(
                update(Release)
                .where(Release.status == "running", Release.heartbeat_at < cutoff)
                .values(
                    status="failed",
                    stage="failed",
                    finished_at=now_iso(),
                    progress=1.0,
                    visible_at=time.time(),
                )
                .returning(Release.id)
            ).all()
            session.commit()
        return len(rows)
