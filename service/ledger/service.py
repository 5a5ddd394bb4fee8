"""THE ONLY CODE THAT CHANGES PRIVACY BUDGET.

Every budget event (dataset creation, cap change, grant change, charge, row deletion) appends
one hash-chained entry, in the caller's transaction, after an atomic conditional ``UPDATE`` of
the dataset's budget row. That update is the charge itself: ``spent + cost <= total`` is checked
by the database in the same statement that adds the cost, so concurrent requests can never
overspend, and the row it locks (PostgreSQL) or the write lock (SQLite, ``BEGIN IMMEDIATE``)
serialises the chain. Costs are never refunded.

A release's charge on PostgreSQL is one statement, ``curator_charge_v1`` (a PL/pgSQL function
created by the migration ``ledger_charge_function``): the conditional update, the grant's cap,
the entry (hashed in SQL from ``chain.body_parts``, the same bytes ``chain.row_hash`` hashes),
the release row and its job, committed as the statement ends, so the budget row's lock is held
for that statement and its commit only. SQLite writes the same rows statement by statement
under its database-wide write lock. ``in_one_statement`` is the one place that chooses.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

from sqlalchemy import select, text, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from service.db.engine import snapshot
from service.db.models import Budget, Dataset, Grant, LedgerEntry, Principal, Release
from service.jobs import queue
from service.ledger import amounts
from service.ledger.chain import HASHED_FIELDS, Replay, body_parts, genesis_hash, row_hash
from service.mechanisms.records import MechanismRecord
from service.problems import (
    BudgetBelowSpent,
    BudgetExhausted,
    BudgetNotSet,
    NotFound,
    PrincipalCapExceeded,
)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def iso_seconds(text: str) -> float:
    """Seconds since the epoch of a time written by ``now_iso``."""
    return datetime.fromisoformat(text).timestamp()


def seconds_iso(seconds: float) -> str:
    """A time in seconds since the epoch, written as ``now_iso`` writes one."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class Charged:
    seq: int
    epsilon: int
    delta: int


# What an append needs of the budget row, returned by the statement that locks it.
_CHAIN_STATE = (
    Budget.entries,
    Budget.last_hash,
    Budget.epsilon_spent,
    Budget.delta_spent,
    Budget.epsilon_total,
    Budget.delta_total,
)


def _append(
    session: Session,
    *,
    dataset_id: str,
    entry_type: str,
    principal_id: str,
    epsilon: int = 0,
    delta: int = 0,
    release_id: str | None = None,
    guarantee: str | None = None,
    details: dict[str, Any] | None = None,
    request_hash: str | None = None,
    idempotency_key: str | None = None,
    state: Any = None,
) -> LedgerEntry:
    """Append one entry. The caller has already locked the budget row in this transaction.

    ``state``: the budget row as the caller's own locking update returned it, with ``entries``
    already advanced (``charge`` does this in its one conditional statement); else it is read
    and advanced here.
    """
    if state is None:
        state = session.execute(
            update(Budget)
            .where(Budget.dataset_id == dataset_id)
            .values(entries=Budget.entries + 1)
            .returning(*_CHAIN_STATE)
        ).one()
    seq, prev_hash, budget = state.entries, state.last_hash, state
    fields: dict[str, Any] = {
        "dataset_id": dataset_id,
        "seq": seq,
        "entry_type": entry_type,
        "principal_id": principal_id,
        "release_id": release_id,
        "epsilon": epsilon,
        "delta": delta,
        "epsilon_spent": budget.epsilon_spent,
        "delta_spent": budget.delta_spent,
        "epsilon_total": budget.epsilon_total,
        "delta_total": budget.delta_total,
        "guarantee": guarantee,
        "details_json": json.dumps(details or {}, sort_keys=True, separators=(",", ":")),
        "request_hash": request_hash,
        "idempotency_key": idempotency_key,
        "created_at": now_iso(),
    }
    digest = row_hash(prev_hash, fields)
    entry = LedgerEntry(**fields, prev_hash=prev_hash, row_hash=digest)
    session.add(entry)
    session.execute(update(Budget).where(Budget.dataset_id == dataset_id).values(last_hash=digest))
    session.flush()
    return entry


def open_ledger(
    session: Session, *, dataset_id: str, principal_id: str, allow_paper_mode: bool = False
) -> None:
    """Create the dataset's budget row (no budget yet) and the genesis entry, which records
    whether paper mode is allowed (a paper-mode charge must find it on: ``Replay``)."""
    session.add(Budget(dataset_id=dataset_id, last_hash=genesis_hash(dataset_id)))
    session.flush()
    _append(
        session,
        dataset_id=dataset_id,
        entry_type="create",
        principal_id=principal_id,
        details={"allow_paper_mode": allow_paper_mode},
    )


def set_paper_mode(session: Session, *, dataset_id: str, principal_id: str, allowed: bool) -> None:
    """Record the owner's change of the dataset's paper-mode setting (the caller changes the
    dataset row in the same transaction): a ``settings`` entry, so that the setting a
    paper-mode charge relied on is in the chain (a security audit turned it on in the database
    for one paper release and off again, and no check saw it)."""
    session.execute(
        update(Budget).where(Budget.dataset_id == dataset_id).values(entries=Budget.entries)
    )
    _append(
        session,
        dataset_id=dataset_id,
        entry_type="settings",
        principal_id=principal_id,
        details={"allow_paper_mode": allowed},
    )


def set_budget(
    session: Session,
    *,
    dataset_id: str,
    principal_id: str,
    epsilon_total: float,
    delta_total: float,
) -> None:
    """Set the dataset's global cap. It can never drop below what is already spent."""
    eps = amounts.epsilon_total_units(epsilon_total)
    dlt = amounts.delta_total_units(delta_total)
    result = session.execute(
        update(Budget)
        .where(
            Budget.dataset_id == dataset_id,
            Budget.epsilon_spent <= eps,
            Budget.delta_spent <= dlt,
        )
        .values(epsilon_total=eps, delta_total=dlt, is_set=True)
        .returning(Budget.dataset_id)
    ).first()
    if result is None:
        budget = session.execute(select(Budget).where(Budget.dataset_id == dataset_id)).scalar_one()
        raise BudgetBelowSpent(
            "the new total is below the budget already spent: "
            + _below_spent(eps, dlt, budget.epsilon_spent, budget.delta_spent)
        )
    _append(
        session,
        dataset_id=dataset_id,
        entry_type="budget",
        principal_id=principal_id,
        details={"epsilon_total": amounts.epsilon_str(eps), "delta_total": amounts.delta_str(dlt)},
    )


def _below_spent(eps: int | None, dlt: int | None, eps_spent: int, dlt_spent: int) -> str:
    """Which amount a refused total or cap falls below, and what is spent (ledger units)."""
    parts = []
    if eps is not None and eps_spent > eps:
        parts.append(f"epsilon {amounts.epsilon_str(eps)} < {amounts.epsilon_str(eps_spent)} spent")
    if dlt is not None and dlt_spent > dlt:
        parts.append(f"delta {amounts.delta_str(dlt)} < {amounts.delta_str(dlt_spent)} spent")
    return "; ".join(parts) or "it changed while this request ran; try again"


def set_grant(
    session: Session,
    *,
    dataset_id: str,
    owner_id: str,
    principal_id: str,
    epsilon_cap: float | None,
    delta_cap: float | None,
) -> Grant:
    """Create or change a principal's grant on a dataset (its per-principal cap included)."""
    eps = None if epsilon_cap is None else amounts.epsilon_total_units(epsilon_cap)
    dlt = None if delta_cap is None else amounts.delta_total_units(delta_cap)
    # Lock the budget row first, as every ledger write does, so the chain stays serial.
    session.execute(
        update(Budget).where(Budget.dataset_id == dataset_id).values(entries=Budget.entries)
    )
    grant = session.execute(
        select(Grant).where(Grant.dataset_id == dataset_id, Grant.principal_id == principal_id)
    ).scalar_one_or_none()
    if grant is None:
        grant = Grant(
            dataset_id=dataset_id,
            principal_id=principal_id,
            epsilon_cap=eps,
            delta_cap=dlt,
            epsilon_spent=0,
            delta_spent=0,
            created_at=now_iso(),
            revoked=False,
        )
        session.add(grant)
    else:
        if (eps is not None and grant.epsilon_spent > eps) or (
            dlt is not None and grant.delta_spent > dlt
        ):
            raise BudgetBelowSpent(
                "the new cap is below what this principal already spent: "
                + _below_spent(eps, dlt, grant.epsilon_spent, grant.delta_spent)
            )
        grant.epsilon_cap, grant.delta_cap, grant.revoked = eps, dlt, False
    session.flush()
    _append(
        session,
        dataset_id=dataset_id,
        entry_type="grant",
        principal_id=owner_id,
        details={
            "grantee": principal_id,
            "epsilon_cap": None if eps is None else amounts.epsilon_str(eps),
            "delta_cap": None if dlt is None else amounts.delta_str(dlt),
            "revoked": False,
        },
    )
    return grant


def cap_remaining(
    session: Session, *, dataset_id: str, principal_id: str
) -> tuple[int | None, int | None]:
    """(epsilon, delta) units left under the principal's grant caps; None where no cap is set.

    A missing or revoked grant leaves nothing (0, 0): ``charge`` would refuse it.
    """
    grant = session.execute(
        select(Grant).where(Grant.dataset_id == dataset_id, Grant.principal_id == principal_id)
    ).scalar_one_or_none()
    if grant is None or grant.revoked:
        return 0, 0
    eps = None if grant.epsilon_cap is None else max(0, grant.epsilon_cap - grant.epsilon_spent)
    dlt = None if grant.delta_cap is None else max(0, grant.delta_cap - grant.delta_spent)
    return eps, dlt


def revoke_grant(session: Session, *, dataset_id: str, owner_id: str, principal_id: str) -> None:
    """Revoke a grant; what the principal spent stays spent. Revoking a revoked grant changes
    nothing and appends no ledger entry."""
    session.execute(
        update(Budget).where(Budget.dataset_id == dataset_id).values(entries=Budget.entries)
    )
    done = session.execute(
        update(Grant)
        .where(
            Grant.dataset_id == dataset_id,
            Grant.principal_id == principal_id,
            Grant.revoked.is_(False),
        )
        .values(revoked=True)
        .returning(Grant.id)
    ).first()
    if done is None:
        exists = session.execute(
            select(Grant.id).where(
                Grant.dataset_id == dataset_id, Grant.principal_id == principal_id
            )
        ).first()
        if exists is None:
            raise NotFound("no such grant")
        return  # already revoked: nothing changes, so nothing is recorded
    _append(
        session,
        dataset_id=dataset_id,
        entry_type="grant",
        principal_id=owner_id,
        details={"grantee": principal_id, "revoked": True},
    )


def charge(
    session: Session,
    *,
    dataset_id: str,
    principal_id: str,
    release_id: str,
    record: MechanismRecord,
    request_hash: str,
    idempotency_key: str,
    via_grant: bool,
    release: Release | None = None,
) -> Charged:
    """Charge a release's cost atomically, before any data is touched.

    ``release``: the release row the charge pays for (its ``epsilon``, ``delta``,
    ``created_at`` and ``ledger_seq`` are set here); it is inserted, and its job deferred, in
    the charge's transaction. On PostgreSQL all of it is one statement (``curator_charge_v1``):
    the budget row's lock is held for the rest of that statement and the commit. Elsewhere
    (SQLite, whose write lock is held for the whole transaction anyway) the same writes are
    made statement by statement in a savepoint. The object is not added to the session on the
    one-statement path (it is a transient copy of the row written).

    Raises ``BudgetExhausted`` / ``BudgetNotSet`` / ``PrincipalCapExceeded`` / ``NotFound``;
    the caller's transaction must then be rolled back (the session dependency does this).
    """
    eps = amounts.epsilon_cost_units(record.epsilon)
    dlt = amounts.delta_cost_units(record.delta)
    if eps == 0 and dlt == 0:
        raise ValueError("a release must have a positive cost")
    if release is not None:
        release.epsilon, release.delta = eps, dlt
    details = record.to_dict()
    if in_one_statement(session):
        seq, created_at = _charge_in_one_statement(
            session,
            dataset_id=dataset_id,
            principal_id=principal_id,
            release_id=release_id,
            record=record,
            eps=eps,
            dlt=dlt,
            via_grant=via_grant,
            guarantee=str(record.guarantee),
            details=details,
            request_hash=request_hash,
            idempotency_key=idempotency_key,
            release=release,
        )
        if release is not None:
            release.ledger_seq, release.created_at = seq, created_at
        return Charged(seq=seq, epsilon=eps, delta=dlt)
    with session.begin_nested():
        if release is not None:
            # Runs only after the commit (on PostgreSQL the job row and its NOTIFY are not
            # visible before it; on SQLite the queued release row is the queue entry).
            queue.enqueue(session, release_id)
        entry = _charge_in_statements(
            session,
            dataset_id=dataset_id,
            principal_id=principal_id,
            release_id=release_id,
            record=record,
            eps=eps,
            dlt=dlt,
            via_grant=via_grant,
            details=details,
            request_hash=request_hash,
            idempotency_key=idempotency_key,
        )
        if release is not None:
            release.ledger_seq, release.created_at = entry.seq, entry.created_at
            session.add(release)
            session.flush()
    return Charged(seq=entry.seq, epsilon=eps, delta=dlt)


def charge_release(
    session: Session,
    *,
    dataset_id: str,
    principal_id: str,
    record: MechanismRecord,
    via_grant: bool,
    release: Release,
) -> Charged:
    """Charge ``release``'s cost, insert its row and defer its job, and commit: all or nothing.

    The session's transaction must not have written anything (the caller has only read): on
    PostgreSQL it is ended first and the charge is one statement run outside any transaction
    block, so the server commits it as the statement ends (synchronously, like any commit) and
    the budget row's lock is released there, with no round trip and no Python in between. On
    SQLite the charge is written in the caller's transaction, which is then committed.
    """
    if in_one_statement(session):
        session.commit()  # the caller's reads: nothing to write, no lock held
        session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
    charged = charge(
        session,
        dataset_id=dataset_id,
        principal_id=principal_id,
        release_id=release.id,
        record=record,
        request_hash=release.request_hash,
        idempotency_key=release.idempotency_key,
        via_grant=via_grant,
        release=release,
    )
    session.commit()
    return charged


def in_one_statement(session: Session) -> bool:
    """The one place that chooses how a charge is written: one SQL call on PostgreSQL."""
    return session.get_bind().dialect.name == "postgresql"


_CHARGE_SQL = text(
    "SELECT entry_seq, entry_created_at FROM curator_charge_v1("
    ":dataset_id, :principal_id, :epsilon, :delta, :via_grant, :body, :release_id, :guarantee, "
    ":details_json, :request_hash, :idempotency_key, CAST(:release AS jsonb), :job_queue, "
    ":job_task, CAST(:job_args AS jsonb))"
)

# SQLSTATEs raised by curator_charge_v1 for a refused charge (nothing is written).
_REFUSALS = {"CU001": "not_found", "CU002": "not_set", "CU003": "exhausted", "CU004": "cap"}


def _charge_in_one_statement(
    session: Session,
    *,
    dataset_id: str,
    principal_id: str,
    release_id: str,
    record: MechanismRecord,
    eps: int,
    dlt: int,
    via_grant: bool,
    guarantee: str,
    details: dict[str, Any],
    request_hash: str,
    idempotency_key: str,
    release: Release | None,
) -> tuple[int, str]:
    details_json = json.dumps(details, sort_keys=True, separators=(",", ":"))
    fields = {
        "dataset_id": dataset_id,
        "entry_type": "charge",
        "principal_id": principal_id,
        "release_id": release_id,
        "epsilon": eps,
        "delta": dlt,
        "guarantee": guarantee,
        "details_json": details_json,
        "request_hash": request_hash,
        "idempotency_key": idempotency_key,
    }
    row = None
    if release is not None:
        row = {c.name: getattr(release, c.key) for c in Release.__table__.columns}
    job = queue.job_of(release_id) if release is not None else None
    try:
        seq, created_at = session.execute(
            _CHARGE_SQL,
            {
                **fields,
                "via_grant": via_grant,
                "body": body_parts(fields),
                "release": None if row is None else json.dumps(row),
                "job_queue": None if job is None else job.queue,
                "job_task": None if job is None else job.task,
                "job_args": None if job is None else job.args_json,
            },
        ).one()
    except DBAPIError as exc:
        refusal = _REFUSALS.get(getattr(exc.orig, "sqlstate", None) or "")
        if refusal is None:
            raise
        _refuse(refusal, record)
    return int(seq), str(created_at)


def _refuse(reason: str, record: MechanismRecord) -> NoReturn:
    if reason == "not_found":
        raise NotFound("dataset not found")
    if reason == "not_set":
        raise BudgetNotSet("the dataset's owner has not set a privacy budget")
    cost = f"epsilon {record.epsilon:g}, delta {record.delta:g}"
    if reason == "cap":
        raise PrincipalCapExceeded(
            f"this release ({cost}) would exceed your per-principal cap on this dataset; a "
            "quote of the same request shows what is left of it (cap_epsilon_remaining, "
            "cap_delta_remaining)",
            epsilon_requested=record.epsilon,
            delta_requested=record.delta,
        )
    raise BudgetExhausted(
        f"this release ({cost}) would exceed the dataset's privacy budget; a quote of the "
        "same request shows what is left (epsilon_remaining, delta_remaining)",
        epsilon_requested=record.epsilon,
        delta_requested=record.delta,
    )


def _charge_in_statements(
    session: Session,
    *,
    dataset_id: str,
    principal_id: str,
    release_id: str,
    record: MechanismRecord,
    eps: int,
    dlt: int,
    via_grant: bool,
    details: dict[str, Any],
    request_hash: str,
    idempotency_key: str,
) -> LedgerEntry:
    # The charge: one conditional statement, checked and applied by the database. It also
    # takes the ledger's next sequence number and returns the chain state for the entry.
    charged = session.execute(
        update(Budget)
        .where(
            Budget.dataset_id == dataset_id,
            Budget.is_set.is_(True),
            Budget.epsilon_spent + eps <= Budget.epsilon_total,
            Budget.delta_spent + dlt <= Budget.delta_total,
        )
        .values(
            epsilon_spent=Budget.epsilon_spent + eps,
            delta_spent=Budget.delta_spent + dlt,
            entries=Budget.entries + 1,
        )
        .returning(*_CHAIN_STATE)
    ).first()
    if charged is None:
        is_set = session.execute(
            select(Budget.is_set).where(Budget.dataset_id == dataset_id)
        ).scalar_one_or_none()
        _refuse("not_found" if is_set is None else "exhausted" if is_set else "not_set", record)
    if via_grant:
        capped = session.execute(
            update(Grant)
            .where(
                Grant.dataset_id == dataset_id,
                Grant.principal_id == principal_id,
                Grant.revoked.is_(False),
                (Grant.epsilon_cap.is_(None)) | (Grant.epsilon_spent + eps <= Grant.epsilon_cap),
                (Grant.delta_cap.is_(None)) | (Grant.delta_spent + dlt <= Grant.delta_cap),
            )
            .values(epsilon_spent=Grant.epsilon_spent + eps, delta_spent=Grant.delta_spent + dlt)
            .returning(Grant.id)
        ).first()
        if capped is None:
            _refuse("cap", record)
    return _append(
        session,
        dataset_id=dataset_id,
        entry_type="charge",
        principal_id=principal_id,
        epsilon=eps,
        delta=dlt,
        release_id=release_id,
        guarantee=str(record.guarantee),
        details=details,
        request_hash=request_hash,
        idempotency_key=idempotency_key,
        state=charged,
    )


def record_rows_deleted(session: Session, *, dataset_id: str, principal_id: str) -> None:
    session.execute(
        update(Budget).where(Budget.dataset_id == dataset_id).values(entries=Budget.entries)
    )
    _append(session, dataset_id=dataset_id, entry_type="rows_deleted", principal_id=principal_id)


def entries(session: Session, *, dataset_id: str) -> list[LedgerEntry]:
    return list(
        session.execute(
            select(LedgerEntry)
            .where(LedgerEntry.dataset_id == dataset_id)
            .order_by(LedgerEntry.seq)
        ).scalars()
    )


@dataclass(frozen=True)
class Verification:
    valid: bool
    entries: int
    head_hash: str
    first_invalid_seq: int | None = None
    reason: str | None = None


def verify(session: Session, *, dataset_id: str) -> Verification:
    """Recompute the chain and the totals from the entries; report the first inconsistency.

    The budget row (the chain's head) and the entries are read in one snapshot
    (``db.engine.snapshot``) where the session has no transaction in progress, else with the
    head read ``FOR SHARE``: a charge committed during the check would otherwise add an entry
    the head read before it does not count, and the check would report entries removed. In a
    snapshot charges never wait for the check (the route commits its reads first)."""
    lock = None if snapshot(session) else {"read": True}
    budget = session.get(Budget, dataset_id, with_for_update=lock, populate_existing=True)
    if budget is None:
        raise NotFound("dataset not found")
    prev = genesis_hash(dataset_id)
    eps_sum = dlt_sum = 0
    rows = entries(session, dataset_id=dataset_id)
    replay = Replay()
    for expected_seq, entry in enumerate(rows, start=1):
        fields = {k: getattr(entry, k) for k in HASHED_FIELDS}

        def bad(reason: str, seq: int = expected_seq) -> Verification:
            return Verification(False, len(rows), budget.last_hash, seq, reason)

        if entry.seq != expected_seq:
            return bad("an entry is missing or out of order")
        if entry.prev_hash != prev or row_hash(prev, fields) != entry.row_hash:
            return bad("hash mismatch: the entry was altered")
        if entry.entry_type == "charge":
            eps_sum += entry.epsilon
            dlt_sum += entry.delta
        if (entry.epsilon_spent, entry.delta_spent) != (eps_sum, dlt_sum):
            return bad("running totals do not match the sum of charges")
        if entry.epsilon_spent > entry.epsilon_total or entry.delta_spent > entry.delta_total:
            return bad("spent exceeds total")
        reason = replay.step(fields)
        if reason is not None:
            return bad(reason)
        prev = entry.row_hash
    if len(rows) != budget.entries or prev != budget.last_hash:
        return Verification(
            False, len(rows), budget.last_hash, len(rows) + 1, "entries were removed from the end"
        )
    problem = _state_problem(session, dataset_id, budget, replay, (eps_sum, dlt_sum))
    if problem is not None:
        return Verification(False, len(rows), budget.last_hash, None, problem)
    return Verification(True, len(rows), budget.last_hash)


def _state_problem(
    session: Session,
    dataset_id: str,
    budget: Budget,
    replay: Replay,
    spent: tuple[int, int],
) -> str | None:
    """The first way the unchained rows disagree with the replayed entries: the budget row's
    spend and totals, each grant's caps, revocation and spend, and the role of every grantee
    that charged (a client may never spend budget: an auditor's insider made a client key an
    analyst for one charge and back, and the check said valid). None if they agree."""
    if (budget.epsilon_spent, budget.delta_spent) != spent:
        return "budget does not match the sum of charges"
    if (budget.epsilon_total, budget.delta_total) != (replay.epsilon_total, replay.delta_total):
        return "the budget's totals differ from the last budget entry's"
    if replay.paper_mode is not None:
        dataset = session.get(Dataset, dataset_id)
        if dataset is not None and bool(dataset.allow_paper_mode) != replay.paper_mode:
            return "the dataset's paper-mode setting differs from the ledger's"
    rows = session.execute(select(Grant).where(Grant.dataset_id == dataset_id)).scalars()
    stored = {row.principal_id: row for row in rows}
    if set(stored) != set(replay.grants):
        return "the grants differ from the ledger's grant entries"
    for principal_id, state in replay.grants.items():
        row = stored[principal_id]
        recorded = (state.epsilon_cap, state.delta_cap, state.revoked)
        if (row.epsilon_cap, row.delta_cap, bool(row.revoked)) != recorded:
            return (
                f"principal {principal_id}'s grant: its caps or revocation differ from the "
                "ledger's grant entries"
            )
        if (row.epsilon_spent, row.delta_spent) != (state.epsilon_spent, state.delta_spent):
            return (
                f"principal {principal_id}'s grant: its spend differs from the sum of its charges"
            )
    charged = [p for p, state in replay.grants.items() if state.epsilon_spent or state.delta_spent]
    if charged:
        roles = session.execute(select(Principal.role).where(Principal.id.in_(charged))).scalars()
        if any(role != "analyst" for role in roles):
            return "a grantee that charged is not an analyst"
    return None


CSV_COLUMNS = (
    "seq",
    "entry_type",
    "created_at",
    "principal_id",
    "release_id",
    "guarantee",
    "epsilon",
    "delta",
    "epsilon_spent",
    "delta_spent",
    "epsilon_total",
    "delta_total",
    "idempotency_key",
    "request_hash",
    "details_json",
    "prev_hash",
    "row_hash",
)


def entry_view(entry: LedgerEntry) -> dict[str, Any]:
    """The owner's audit view of one entry, with exact decimal amounts."""
    return {
        "seq": entry.seq,
        "entry_type": entry.entry_type,
        "created_at": entry.created_at,
        "principal_id": entry.principal_id,
        "release_id": entry.release_id,
        "guarantee": entry.guarantee,
        "epsilon": amounts.epsilon_str(entry.epsilon),
        "delta": amounts.delta_str(entry.delta),
        "epsilon_spent": amounts.epsilon_str(entry.epsilon_spent),
        "delta_spent": amounts.delta_str(entry.delta_spent),
        "epsilon_total": amounts.epsilon_str(entry.epsilon_total),
        "delta_total": amounts.delta_str(entry.delta_total),
        "idempotency_key": entry.idempotency_key,
        "request_hash": entry.request_hash,
        "details_json": entry.details_json,
        "prev_hash": entry.prev_hash,
        "row_hash": entry.row_hash,
    }


def export_csv(rows: list[LedgerEntry]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for entry in rows:
        writer.writerow(entry_view(entry))
    return buf.getvalue()


__all__ = [
    "Charged",
    "Verification",
    "charge",
    "charge_release",
    "entries",
    "entry_view",
    "export_csv",
    "open_ledger",
    "record_rows_deleted",
    "revoke_grant",
    "set_budget",
    "set_grant",
    "verify",
]
