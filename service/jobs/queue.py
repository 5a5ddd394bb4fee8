"""Enqueueing a release's job, in the transaction that charged it.

On PostgreSQL a release's job is a procrastinate job (task ``release``, queue ``releases``,
args ``{"release_id": ...}``) inserted by procrastinate's own SQL function in the caller's
transaction: the charge, the release row and its job commit together or not at all, so a
charged release can never be left without a job (and its NOTIFY wakes a worker at commit). On
SQLite the ``queued`` release row is itself the queue entry (``service.jobs.runner``), so
nothing more is written. The queue layer knows no release kind: the job carries only the id.
A release's charge defers its job through ``job_of`` inside the ledger's one-statement charge
(``curator_charge_v1``, PostgreSQL), or through ``enqueue`` on the statement-by-statement path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

QUEUE = "releases"
TASK = "release"

_DEFER = text(
    "SELECT procrastinate_defer_jobs_v1(ARRAY[ROW(:queue, :task, 0, NULL::text, NULL::text, "
    "CAST(:args AS jsonb), NULL::timestamptz)]::procrastinate_job_to_defer_v1[])"
)

# Queued releases with no pending job: only possible for releases queued before the queue
# existed (an upgrade) or by a process that skipped ``enqueue``; the recovery task defers them.
_ORPHANS = text(
    "SELECT r.id FROM release r WHERE r.status = 'queued' AND NOT EXISTS ("
    "SELECT 1 FROM procrastinate_jobs j WHERE j.task_name = :task "
    "AND j.status IN ('todo', 'doing') AND j.args ->> 'release_id' = r.id) LIMIT 100"
)


@dataclass(frozen=True)
class Job:
    """A release's job as procrastinate's ``procrastinate_defer_jobs_v1`` takes it."""

    queue: str
    task: str
    args_json: str


def job_of(release_id: str) -> Job:
    return Job(QUEUE, TASK, json.dumps({"release_id": release_id}))


def uses_engine(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def enqueue(session: Session, release_id: str) -> None:
    """Defer the job of ``release_id`` in the session's transaction (PostgreSQL only)."""
    if not uses_engine(session):
        return
    job = job_of(release_id)
    session.execute(_DEFER, {"queue": job.queue, "task": job.task, "args": job.args_json})


def enqueue_orphans(factory: sessionmaker[Session]) -> list[str]:
    with factory() as session:
        if not uses_engine(session):
            return []
        ids = [row[0] for row in session.execute(_ORPHANS, {"task": TASK})]
        for release_id in ids:
            enqueue(session, release_id)
        session.commit()
    return ids
