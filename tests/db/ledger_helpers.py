"""Direct ledger fixtures shared by the database tests (no HTTP)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.orm import Session

from service.db.engine import make_engine
from service.db.models import Dataset, Principal
from service.ledger import service as ledger
from service.mechanisms.records import Composition, Guarantee, MechanismRecord
from service.problems import BudgetExhausted, PrincipalCapExceeded

T = TypeVar("T")


def record(epsilon: float, delta: float = 0.0) -> MechanismRecord:
    return MechanismRecord(
        mechanism="test",
        version="1",
        guarantee=Guarantee.STRICT,
        n=100,
        fold_sizes={"all": 100},
        composition=Composition.SEQUENTIAL,
        events=(),
        epsilon=epsilon,
        delta=delta,
    )


def add_people_and_dataset(
    s: Session,
    *,
    dataset: str,
    owner: str,
    analysts: list[str],
    name: str | None = None,
    allow_paper_mode: bool = False,
) -> None:
    """Add an owner, analysts and a ready dataset row (flushed, not committed); ``name``
    names every principal (default: its id)."""
    for pid, role in [(owner, "owner")] + [(p, "analyst") for p in analysts]:
        s.add(
            Principal(
                id=pid,
                name=name or pid,
                role=role,
                key_hash=pid + pid,
                key_prefix="x",
                created_at="t",
            )
        )
    s.flush()
    s.add(
        Dataset(
            id=dataset,
            owner_id=owner,
            name="d",
            description="",
            schema_json="{}",
            schema_hash="h",
            version=1,
            n=100,
            q=1,
            status="ready",
            allow_paper_mode=allow_paper_mode,
            created_at="t",
        )
    )
    s.flush()


def seed_dataset(
    url: str, *, epsilon_total: float, analysts: int = 1
) -> tuple[str, str, list[str]]:
    engine = make_engine(url)
    dataset, owner = uuid.uuid4().hex, uuid.uuid4().hex
    people = [uuid.uuid4().hex for _ in range(analysts)]
    with Session(engine) as s:
        add_people_and_dataset(s, dataset=dataset, owner=owner, analysts=people)
        ledger.open_ledger(s, dataset_id=dataset, principal_id=owner)
        ledger.set_budget(
            s, dataset_id=dataset, principal_id=owner, epsilon_total=epsilon_total, delta_total=1e-5
        )
        for p in people:
            ledger.set_grant(
                s,
                dataset_id=dataset,
                owner_id=owner,
                principal_id=p,
                epsilon_cap=None,
                delta_cap=None,
            )
        s.commit()
    engine.dispose()
    return dataset, owner, people


def try_charge(url: str, dataset: str, principal: str, epsilon: float) -> bool:
    """One charge in its own engine and transaction; True if it was admitted."""
    engine = make_engine(url)
    try:
        with Session(engine) as s:
            try:
                ledger.charge(
                    s,
                    dataset_id=dataset,
                    principal_id=principal,
                    release_id=uuid.uuid4().hex,
                    record=record(epsilon),
                    request_hash="h",
                    idempotency_key=uuid.uuid4().hex,
                    via_grant=True,
                )
                s.commit()
                return True
            except (BudgetExhausted, PrincipalCapExceeded):
                s.rollback()
                return False
    finally:
        engine.dispose()


def checks_during(url: str, write: Callable[[], None], check: Callable[[Session], T]) -> list[T]:
    """Run ``write`` in a thread and ``check`` (a fresh session each time, committed) in a loop
    until it is done, at least once; return every check's result."""
    done = threading.Event()

    def writer() -> None:
        try:
            write()
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    engine = make_engine(url)
    results: list[T] = []
    try:
        while not done.is_set() or not results:
            with Session(engine) as s:
                results.append(check(s))
                s.commit()
    finally:
        thread.join()
        engine.dispose()
    return results
