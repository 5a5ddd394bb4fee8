"""A principal's account events: append-only and hash-chained, like a dataset's ledger.

Every change to who can act as a principal is recorded in the transaction that makes it: its
creation, each disable and enable, each key replacement, with the caller who did it and the
first characters of the key in force afterwards (the listing's ``key_prefix``; never the key or
its digest). ``row_hash = SHA-256(prev_hash ‖ canonical JSON of the hashed fields)``, from a
genesis hash of the principal's id; the principal row holds the head (count and last hash), so
an altered, reordered or removed event shows in ``verify``.

The caller locks the principal row (``locked``) before recording: on PostgreSQL ``FOR UPDATE``,
on SQLite every write transaction is ``BEGIN IMMEDIATE`` already, so two changes of one
principal cannot both take the same sequence number.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.db.engine import snapshot
from service.db.models import Principal, PrincipalEvent
from service.ledger.chain import canonical_json
from service.ledger.service import Verification, now_iso
from service.problems import NotFound

# The characters of a key a listing shows (service.auth.service.KEY_PREFIX_SHOWN).
KEY_PREFIX_SHOWN = 8

EventType = Literal["created", "disabled", "enabled", "key_replaced"]

HASHED_FIELDS = ("principal_id", "seq", "event", "actor_id", "key_prefix", "created_at")


def genesis_hash(principal_id: str) -> str:
    return hashlib.sha256(f"dp-curator-principal:{principal_id}".encode()).hexdigest()


def row_hash(prev_hash: str, fields: dict[str, Any]) -> str:
    body = canonical_json({k: fields[k] for k in HASHED_FIELDS})
    return hashlib.sha256((prev_hash + "\n" + body).encode()).hexdigest()


def locked(session: Session, principal_id: str) -> Principal:
    """The principal row, locked for an update that records an event; 404 if there is none."""
    principal = session.get(Principal, principal_id, with_for_update=True, populate_existing=True)
    if principal is None:
        raise NotFound("no such principal")
    return principal


def record(
    session: Session,
    principal: Principal,
    event: EventType,
    *,
    actor_id: str,
    at: str | None = None,
) -> None:
    """Append ``event`` to ``principal``'s chain (same transaction; the row must be locked);
    ``at``: its time (default now; the creation event takes the principal's ``created_at``)."""
    prev = principal.last_event_hash or genesis_hash(principal.id)
    fields: dict[str, Any] = {
        "principal_id": principal.id,
        "seq": (principal.event_count or 0) + 1,
        "event": event,
        "actor_id": actor_id,
        # only what a listing shows: older rows store 2 more characters, which the hash would
        # let anyone recover by trying 64^2 values
        "key_prefix": principal.key_prefix[:KEY_PREFIX_SHOWN],
        "created_at": at or now_iso(),
    }
    digest = row_hash(prev, fields)
    session.add(PrincipalEvent(**fields, prev_hash=prev, row_hash=digest))
    principal.event_count = fields["seq"]
    principal.last_event_hash = digest


def page(
    session: Session, *, principal_id: str, limit: int | None, offset: int
) -> tuple[int, list[PrincipalEvent]]:
    """The principal's events oldest first (``limit``/``offset``) and how many there are."""
    where = PrincipalEvent.principal_id == principal_id
    total = session.execute(
        select(func.count()).select_from(PrincipalEvent).where(where)
    ).scalar_one()
    query = select(PrincipalEvent).where(where).order_by(PrincipalEvent.seq).offset(offset)
    if limit is not None:
        query = query.limit(limit)
    return total, list(session.execute(query).scalars())


def verify(session: Session, principal: Principal) -> Verification:
    """Recompute the principal's chain and replay it against the principal row; report the
    first inconsistency.

    The chain must open with the ``created`` event (and hold no other), change the key only in
    ``key_replaced`` events, and end in the row's state: its ``disabled`` flag is the last
    ``disabled`` or ``enabled`` event's (enabled if there is none) and its key's shown prefix
    the last event's. A row changed without its event (``UPDATE principal SET disabled =
    false``), or a chain emptied or cut back together with its head, therefore fails too.
    (Principals disabled before the record existed got their ``disabled`` event from the
    migration that followed it.)

    The row and its events are read in one snapshot (``db.engine.snapshot``) where the session
    has no transaction in progress, else with the row read ``FOR SHARE``: a change committed
    during the check (it moves the head and appends an event in one transaction) cannot make
    the rows and the head disagree. In a snapshot it never waits for the check (the route
    commits its reads first)."""
    if snapshot(session):
        session.refresh(principal)
    else:
        session.refresh(principal, with_for_update={"read": True})
    _, rows = page(session, principal_id=principal.id, limit=None, offset=0)
    head = principal.last_event_hash or genesis_hash(principal.id)

    def bad(seq: int | None, reason: str) -> Verification:
        return Verification(False, len(rows), head, seq, reason)

    prev = genesis_hash(principal.id)
    disabled, key_prefix = False, ""
    for expected_seq, row in enumerate(rows, start=1):
        fields = {k: getattr(row, k) for k in HASHED_FIELDS}
        if row.seq != expected_seq:
            return bad(expected_seq, "an event is missing or out of order")
        if row.prev_hash != prev or row_hash(prev, fields) != row.row_hash:
            return bad(expected_seq, "hash mismatch: the event was altered")
        if (row.event == "created") != (expected_seq == 1):
            return bad(expected_seq, "the record does not open with the principal's creation")
        if expected_seq > 1 and row.event != "key_replaced" and row.key_prefix != key_prefix:
            return bad(expected_seq, "the key changed without a key replacement event")
        disabled = {"disabled": True, "enabled": False}.get(row.event, disabled)
        key_prefix = row.key_prefix
        prev = row.row_hash
    if len(rows) != (principal.event_count or 0) or prev != head:
        return bad(len(rows) + 1, "events were removed from the end")
    if not rows:
        return bad(1, "the principal's creation is not recorded")
    if bool(principal.disabled) != disabled:
        return bad(None, "the disabled flag is not the last recorded disable or enable")
    if principal.key_prefix[:KEY_PREFIX_SHOWN] != key_prefix:
        return bad(None, "the principal's key does not match its last recorded key")
    return Verification(True, len(rows), head)
