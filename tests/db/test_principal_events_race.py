"""A principal's record checked while its key is being replaced: every check sees the chain and
the head of one moment (one snapshot on PostgreSQL), never a false "removed"."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.auth import events
from service.auth.service import Role, create_principal, rotate_key
from service.db.engine import make_engine
from tests.db.ledger_helpers import checks_during


def test_verify_during_concurrent_key_replacements_sees_a_consistent_chain(db_url: str) -> None:
    engine = make_engine(db_url)
    with Session(engine) as s:
        pid = create_principal(s, name="a", role=Role.ANALYST, created_by="admin")[0].id
        s.commit()
    engine.dispose()

    def replacements() -> None:
        engine = make_engine(db_url)
        try:
            for _ in range(40):
                with Session(engine) as s:
                    principal = events.locked(s, pid)
                    rotate_key(principal)
                    events.record(s, principal, "key_replaced", actor_id=pid)
                    s.commit()
        finally:
            engine.dispose()

    def check(s: Session) -> events.Verification:
        principal = events.locked(s, pid)  # any read of the row; verify re-reads it
        s.rollback()
        return events.verify(s, principal)

    results = checks_during(db_url, replacements, check)
    assert [v for v in results if not v.valid] == []
