"""The release job: the ONE implementation, whichever queue delivers it.

``execute_release_job`` is what a procrastinate worker runs on PostgreSQL and what the embedded
runner (``service.jobs.runner``) runs on SQLite:

    claim (queued -> running, a fresh token) -> check the stored request still resolves to the
    charged mechanism record -> mark ``data_read_at`` (durable, conditional on the token) ->
    load rows -> kind.run -> store result + status in one transaction -> pad.

The release row is the state machine; the queue only delivers its id, at least once. So a job
delivered twice, retried by the engine, or re-deferred by the recovery sweep runs at most once:

* the claim is one conditional update of a ``queued`` row, so one delivery wins;
* every later write of the job is conditional on its claim token, so a worker whose release was
  recovered behind its back (it stopped beating) writes nothing more, and never reads the rows
  if the recovery came first;
* ``recover_stale`` re-queues a release whose worker died before ``data_read_at`` (no private
  data read, no noise drawn: the charge answers the re-run) and fails, keeping the charge, one
  whose worker died after it (noise may have been drawn). Never refunded, never released twice.

Kinds are looked up in ``REGISTRY`` by the release row's ``kind``; the queue layer knows none.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from service.datasets import service as datasets
from service.datasets import storage
from service.db.models import Dataset, Release
from service.functions import service as functions
from service.functions.payload import SECRET_KEY, FunctionSecret
from service.ledger.chain import canonical_json
from service.ledger.service import iso_seconds, now_iso
from service.mechanisms.domain import Arrays
from service.mechanisms.noise import OpenDPSampler, secure_rng
from service.releases.kinds import REGISTRY

logger = logging.getLogger("service.jobs")

HEARTBEAT_SECONDS = 2.0
STALE_AFTER_SECONDS = 30.0


def beat_interval(stale_after: float) -> float:
    """Heartbeats come at least four times per stale period (at most every 2 s)."""
    return max(0.05, min(HEARTBEAT_SECONDS, stale_after / 4))


class InvalidJob(Exception):
    """The stored request does not validate (unknown kind or parameters): fail, do not retry."""


class RowsDeleted(Exception):
    """The dataset's rows were deleted after the charge."""


def padded(elapsed: float, buckets: tuple[float, ...]) -> float:
    """The first public bucket at or above ``elapsed`` (or a multiple of the last one)."""
    for bucket in buckets:
        if elapsed <= bucket:
            return bucket
    last = buckets[-1]
    return last * (int(elapsed // last) + 1)


def visible_time(started: float, now: float, buckets: tuple[float, ...]) -> float:
    """When a job started at ``started`` and settled at ``now`` becomes visible: the first public
    bucket after its start that covers its run."""
    return started + padded(max(0.0, now - started), buckets)


class Heartbeats:
    """One thread per process that keeps ``heartbeat_at`` fresh for the releases it runs."""

    def __init__(self, factory: sessionmaker[Session], every: float = HEARTBEAT_SECONDS) -> None:
        self.factory = factory
        self.every = every
        self._running: dict[str, str] = {}  # release id -> claim token
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, release_id: str, token: str) -> None:
        with self._lock:
            self._running[release_id] = token
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._loop, name="release-heartbeat", daemon=True
                )
                self._thread.start()

    def discard(self, release_id: str) -> None:
        with self._lock:
            self._running.pop(release_id, None)

    def stop(self) -> None:
        self._stop.set()

    def beat(self) -> None:
        with self._lock:
            running = dict(self._running)
        if not running:
            return
        now = time.time()
        with self.factory() as session:
            for release_id, token in running.items():
                session.execute(
                    update(Release)
                    .where(
                        Release.id == release_id,
                        Release.status == "running",
                        Release.claimed_by == token,
                    )
                    .values(heartbeat_at=now)
                )
            session.commit()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.beat()
            except Exception:  # a database hiccup must not stop the beats
                logger.warning("heartbeat failed", exc_info=True)


def claim(session: Session, release_id: str, worker: str) -> str | None:
    """Move a queued release to running with a fresh claim token; None if another has it."""
    token = f"{worker}:{uuid.uuid4().hex[:8]}"[:64]
    claimed = session.execute(
        update(Release)
        .where(Release.id == release_id, Release.status == "queued")
        .values(
            status="running",
            stage="started",
            started_at=now_iso(),
            heartbeat_at=time.time(),
            claimed_by=token,
        )
        .returning(Release.id)
    ).first()
    return token if claimed is not None else None


def execute_release_job(
    factory: sessionmaker[Session],
    release_id: str,
    *,
    worker: str,
    buckets: tuple[float, ...],
    heartbeats: Heartbeats | None = None,
    token: str | None = None,
    run_hook: Callable[[], None] | None = None,
) -> str:
    """Claim (unless ``token`` says it is claimed already) and run one release. Never raises.

    Returns the outcome: ``done``, ``failed``, ``requeued`` is never returned here (only
    ``recover_stale`` re-queues), or ``skipped`` when the release was not ours to run (already
    claimed, finished or recovered): the delivery was a duplicate, which is normal.
    """
    if token is None:
        with factory() as session:
            token = claim(session, release_id, worker)
            session.commit()
        if token is None:
            return "skipped"
    if heartbeats is not None:
        heartbeats.add(release_id, token)
    try:
        return _run_claimed(factory, release_id, token, buckets, run_hook)
    finally:
        if heartbeats is not None:
            heartbeats.discard(release_id)


def hold_until_visible(
    factory: sessionmaker[Session],
    release_id: str,
    wait: Callable[[float], object] = time.sleep,
) -> None:
    """Keep the calling worker's slot until the release's padded completion time.

    The next job a worker takes starts (and shows its readers ``running``) when the slot is
    free; were it freed at the real finish, the next job's start would tell its readers, on any
    dataset, when this one really finished. Held, the slot frees at the public bucket only.
    ``wait(seconds)`` sleeps (a stop event's ``wait`` ends early on shutdown)."""
    with factory() as session:
        visible_at = session.execute(
            select(Release.visible_at).where(Release.id == release_id)
        ).scalar_one_or_none()
    if visible_at is not None and visible_at > time.time():
        wait(visible_at - time.time())


def _run_claimed(
    factory: sessionmaker[Session],
    release_id: str,
    token: str,
    buckets: tuple[float, ...],
    run_hook: Callable[[], None] | None,
) -> str:
    started = time.time()
    outcome: dict[str, Any] = {}
    secret: FunctionSecret | None = None
    dataset_id = ""
    progress = _progress_writer(factory, release_id, token)
    try:
        with factory() as session:
            release = session.get(Release, release_id)
            if release is None or release.claimed_by != token or release.status != "running":
                return "skipped"
            dataset = session.get(Dataset, release.dataset_id)
            assert dataset is not None
            dataset_id = dataset.id
            kind = REGISTRY.get(release.kind)
            try:
                if kind is None:
                    raise InvalidJob
                params = kind.Params.model_validate(json.loads(release.params_json)["params"])
            except (ValidationError, ValueError, KeyError, TypeError):
                raise InvalidJob from None
            if dataset.status != "ready":
                raise RowsDeleted
            domain = datasets.domain_of(dataset)
            # The plan the charge paid for is the plan that runs: where a newer version's
            # default rules resolve the stored request to another mechanism record (other
            # folds, another delta), the job fails here, before any row is read, keeping its
            # charge, rather than run a release it was not charged for.
            try:
                planned = canonical_json(kind.record(params, domain).to_dict())
            except Exception:
                raise InvalidJob from None
            if planned != release.record_json:
                raise InvalidJob
            # The durable marker, before the rows are read: from here on a crash keeps the
            # charge. Conditional on our claim: if the release was recovered, we stop here.
            marked = session.execute(
                update(Release)
                .where(
                    Release.id == release_id,
                    Release.status == "running",
                    Release.claimed_by == token,
                )
                .values(data_read_at=time.time(), stage="loading rows", heartbeat_at=time.time())
                .returning(Release.id)
            ).first()
            session.commit()
            if marked is None:
                return "skipped"
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
    except InvalidJob:
        logger.warning("release %s failed: its stored request does not validate", release_id)
        outcome = {"status": "failed", "failure": "invalid-job"}
    except RowsDeleted:
        outcome = {"status": "failed", "failure": "rows-deleted"}
    except Exception as exc:
        # Operators see the exception type only: its text may contain data.
        logger.warning("release %s failed (%s)", release_id, type(exc).__name__)
        outcome = {"status": "failed", "failure": "run-failed"}
    visible_at = visible_time(started, time.time(), buckets)
    try:
        _finish(factory, release_id, token, dataset_id, outcome, secret, visible_at)
    except Exception as exc:
        # The result (or a released function's state) could not be stored. Nothing of it may
        # be served, so the release fails now, in a fresh transaction; its charge stays (the
        # noise was drawn). If even that fails, the recovery sweep fails it.
        logger.warning(
            "storing the outcome of release %s failed (%s)", release_id, type(exc).__name__
        )
        outcome = {"status": "failed", "failure": "store-failed"}
        try:
            _finish(factory, release_id, token, dataset_id, outcome, None, visible_at)
        except Exception:
            logger.exception("marking release %s failed did not work", release_id)
    return str(outcome["status"])


def _finish(
    factory: sessionmaker[Session],
    release_id: str,
    token: str,
    dataset_id: str,
    outcome: dict[str, Any],
    secret: FunctionSecret | None,
    visible_at: float,
) -> None:
    """One transaction: the function's state (if any) and the release's final status."""
    status = outcome.get("status", "failed")
    with factory() as session:
        owned = session.execute(
            select(Release.id)
            .where(
                Release.id == release_id,
                Release.status == "running",
                Release.claimed_by == token,
            )
            .with_for_update()
        ).first()
        if owned is None:
            return  # recovered behind our back: the recovery's verdict stands
        if secret is not None and status == "done":
            functions.store(session, release_id=release_id, dataset_id=dataset_id, secret=secret)
        session.execute(
            update(Release)
            .where(Release.id == release_id, Release.claimed_by == token)
            .values(
                status=status,
                result_json=outcome.get("result_json") if status == "done" else None,
                failure=outcome.get("failure") if status == "failed" else None,
                progress=1.0,
                stage=status,
                finished_at=now_iso(),
                visible_at=visible_at,
            )
        )
        session.commit()
    if status == "done":
        # operators only (the real finish time is theirs, docs/privacy.md); failures log above
        logger.info("release %s done", release_id)


def fail_invalid(factory: sessionmaker[Session], release_id: str) -> bool:
    """Fail a release whose job could not even be started (bad payload); the charge stays."""
    with factory() as session:
        failed = session.execute(
            update(Release)
            .where(Release.id == release_id, Release.status.in_(("queued", "running")))
            .values(
                status="failed",
                stage="failed",
                failure="invalid-job",
                progress=1.0,
                finished_at=now_iso(),
                visible_at=time.time(),
            )
            .returning(Release.id)
        ).first()
        session.commit()
    return failed is not None


def _progress_writer(
    factory: sessionmaker[Session], release_id: str, token: str
) -> Callable[[float, str], None]:
    """Progress updates: every change of stage is written; within a stage at most 2 per s."""
    last_time = [0.0]
    last_stage = [""]

    def write(fraction: float, stage: str) -> None:
        now = time.time()
        if stage == last_stage[0] and now - last_time[0] < 0.5:
            return
        last_time[0], last_stage[0] = now, stage
        with factory() as session:
            session.execute(
                update(Release)
                .where(
                    Release.id == release_id,
                    Release.status == "running",
                    Release.claimed_by == token,
                )
                .values(
                    progress=max(0.0, min(0.99, float(fraction))),
                    stage=stage[:64],
                    heartbeat_at=now,
                )
            )
            session.commit()

    return write


def recover_stale(
    factory: sessionmaker[Session],
    *,
    stale_after: float = STALE_AFTER_SECONDS,
    enqueue: Callable[[Session, str], None] | None = None,
    buckets: tuple[float, ...] | None = None,
) -> tuple[list[str], list[str]]:
    """Releases whose worker stopped beating: re-queue those that had not read the rows
    (``enqueue`` defers their job again, in the same transaction), fail the others keeping
    their charge. Returns (requeued, failed) ids. Safe to run from any number of processes:
    each row changes by one conditional update. A failed release becomes visible at the public
    latency bucket (``buckets``) after its start that its detection falls in, as a finished job
    does, so the failure's timing shows no more than the bucket; None: at once."""
    cutoff = time.time() - stale_after
    requeued: list[str] = []
    with factory() as session:
        rows = session.execute(
            update(Release)
            .where(
                Release.status == "running",
                Release.heartbeat_at < cutoff,
                Release.data_read_at.is_(None),
            )
            .values(
                status="queued",
                stage="queued",
                claimed_by=None,
                started_at=None,
                progress=0.0,
                heartbeat_at=None,
            )
            .returning(Release.id)
        ).all()
        requeued = [r[0] for r in rows]
        if enqueue is not None:
            for release_id in requeued:
                enqueue(session, release_id)
        failed_rows = session.execute(
            update(Release)
            .where(
                Release.status == "running",
                Release.heartbeat_at < cutoff,
                Release.data_read_at.is_not(None),
            )
            .values(
                status="failed",
                stage="failed",
                failure="worker-lost",
                finished_at=now_iso(),
                progress=1.0,
                visible_at=time.time(),
            )
            .returning(Release.id, Release.started_at)
        ).all()
        if buckets:
            now = time.time()
            for release_id, started_iso in failed_rows:
                if started_iso is None:
                    continue
                session.execute(
                    update(Release)
                    .where(Release.id == release_id)
                    .values(visible_at=visible_time(iso_seconds(started_iso), now, buckets))
                )
        session.commit()
    for release_id in requeued:
        logger.warning("release %s re-queued: its worker stopped before reading rows", release_id)
    failed = [r[0] for r in failed_rows]
    for release_id in failed:
        logger.warning("release %s failed: its worker stopped (charge kept)", release_id)
    return requeued, failed
