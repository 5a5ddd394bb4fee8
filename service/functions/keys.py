"""The state key check: one value in the database sealed under the state key in force.

A process whose ``CURATOR_STATE_KEY`` (and ``CURATOR_STATE_KEY_PREVIOUS``) cannot open it would
read every released function's state as corrupt and close the function for good at its first
evaluation: a mistyped or lost key would destroy functions whose budget is spent. So the API,
the workers and ``python -m service.functions.rotate`` check the keys first and refuse to run
with a message naming the setting (``problem``), and a function found unreadable is closed only
while the check still opens (``opens``). The first process to run on a database seals the check
under its key; the rotation re-seals it last, after every function.
"""

from __future__ import annotations

from sqlalchemy import inspect, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.db.models import CateFunction, CateFunctionSecret, StateKeyCheck
from service.functions.sealing import MAGIC, SealError, UnknownKey, reseal, seal, unseal
from service.ledger.service import now_iso

CONTEXT = "state-key-check"
PLAINTEXT = b"dp-curator state key check v1"
ROW_ID = 1


class StateKeyMismatch(RuntimeError):
    """The configured state keys do not open the state this database holds."""


MISMATCH = (
    "CURATOR_STATE_KEY does not open the released functions' state in this database (it was "
    "sealed under another key). Set CURATOR_STATE_KEY to that key or, while rotating, "
    "CURATOR_STATE_KEY_PREVIOUS to it (docs: README, 'Rotating the state key')."
)


def opens(session: Session) -> bool:
    """Whether a configured key opens the check (True where there is none yet)."""
    row = session.get(StateKeyCheck, ROW_ID)
    if row is None:
        return True
    try:
        return unseal(row.payload, context=CONTEXT) == PLAINTEXT
    except SealError:
        return False


def _open_state_opens(session: Session) -> bool:
    """Before the check exists (a database from before it): whether the configured keys are
    the ones the newest open functions' fitted states were sealed under. One value that opens
    settles it; one that names a key not configured here (``UnknownKey``) too; values that
    name a configured key but do not decrypt are corrupt, not a key problem. Legacy values
    (no key name) that none of the keys opens: a wrong key, far likelier than every one of them
    being corrupt."""
    newest = session.execute(
        select(CateFunctionSecret.function_id, CateFunctionSecret.payload)
        .join(CateFunction, CateFunction.id == CateFunctionSecret.function_id)
        .where(CateFunction.status == "open")
        .order_by(CateFunction.created_at.desc())
        .limit(5)
    ).all()
    named = False
    for row in newest:
        try:
            unseal(row.payload, context=f"{row.function_id}:fitted")
            return True
        except UnknownKey:
            return False
        except SealError:
            named = named or row.payload.startswith(MAGIC)
    return named or not newest


def ensure(session: Session) -> None:
    """Seal the check under the current key if there is none; raise ``StateKeyMismatch`` if a
    check exists that no configured key opens while an open function's state depends on it
    (without one the check is re-sealed under the current key). Commits."""
    if session.get(StateKeyCheck, ROW_ID) is None:
        if not _open_state_opens(session):
            session.rollback()
            raise StateKeyMismatch(MISMATCH)
        session.add(
            StateKeyCheck(id=ROW_ID, payload=seal(PLAINTEXT, context=CONTEXT), sealed_at=now_iso())
        )
        try:
            session.commit()
            return
        except IntegrityError:  # another process sealed it first: check theirs
            session.rollback()
    if not opens(session):
        if _has_open_function(session):
            session.rollback()
            raise StateKeyMismatch(MISMATCH)
        # nothing sealed under the old key is still needed: the new key takes over
        row = session.get(StateKeyCheck, ROW_ID, with_for_update=True)
        if row is not None:
            row.payload = seal(PLAINTEXT, context=CONTEXT)
            row.sealed_at = now_iso()
    session.commit()


def _has_open_function(session: Session) -> bool:
    found = session.execute(
        select(CateFunction.id).where(CateFunction.status == "open").limit(1)
    ).first()
    return found is not None


def state_key_problem(database_url: str) -> str | None:
    """``ensure`` as a start-up check on ``database_url``: None, or the message to exit with.
    A database whose schema has no check table yet (not migrated) is not checked."""
    from service.db.engine import make_engine

    engine = make_engine(database_url)
    try:
        if not inspect(engine).has_table(StateKeyCheck.__tablename__):
            return None
        with Session(engine) as session:
            ensure(session)
    except StateKeyMismatch as exc:
        return str(exc)
    finally:
        engine.dispose()
    return None


def reseal_check(session: Session) -> bool:
    """Re-seal the check under the current key (the rotation's last step); False if no
    configured key opens it. Commits."""
    row = session.get(StateKeyCheck, ROW_ID, with_for_update=True)
    if row is None:
        ensure(session)
        return True
    try:
        new = reseal(row.payload, context=CONTEXT)
    except SealError:
        session.rollback()
        return False
    if new is not None:
        row.payload = new
        row.sealed_at = now_iso()
    session.commit()
    return True
