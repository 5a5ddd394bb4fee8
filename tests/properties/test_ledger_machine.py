"""Ledger invariants under any interleaving of charges, grants, cap and budget changes.

Invariants checked after every step: spent ≤ total (globally and per grant), the sum of the
charge entries equals spent, per-principal spent equals that principal's charges, and the hash
chain verifies. Runs on the SQLite file and on PostgreSQL.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.orm import Session

from service.db.engine import make_engine
from service.db.models import Base, Budget, Grant, LedgerEntry
from service.ledger import amounts
from service.ledger import service as ledger
from service.mechanisms.records import Composition, Guarantee, MechanismRecord
from service.problems import BudgetBelowSpent, BudgetExhausted, BudgetNotSet, PrincipalCapExceeded
from tests.db.ledger_helpers import add_people_and_dataset

EPS = st.sampled_from([0.05, 0.1, 0.25, 0.3, 0.5, 1.0, 1.7])
DLT = st.sampled_from([0.0, 1e-7, 1e-6, 5e-6])


def _record(epsilon: float, delta: float) -> MechanismRecord:
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


def _clean(url: str) -> None:
    eng = create_engine(url)
    with eng.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(text(f'DELETE FROM "{table.name}"'))
    eng.dispose()


def make_machine(url: str) -> type[RuleBasedStateMachine]:
    class LedgerMachine(RuleBasedStateMachine):
        @initialize()
        def setup(self) -> None:
            _clean(url)
            self.engine = make_engine(url)
            self.dataset = uuid.uuid4().hex
            self.owner = uuid.uuid4().hex
            self.analysts = [uuid.uuid4().hex for _ in range(3)]
            with Session(self.engine) as s:
                add_people_and_dataset(
                    s, dataset=self.dataset, owner=self.owner, analysts=self.analysts
                )
                ledger.open_ledger(s, dataset_id=self.dataset, principal_id=self.owner)
                s.commit()

        def teardown(self) -> None:
            self.engine.dispose()

        @rule(
            epsilon=st.sampled_from([0.5, 1.0, 2.0, 3.0, 5.0]), delta=st.sampled_from([1e-6, 1e-5])
        )
        def set_budget(self, epsilon: float, delta: float) -> None:
            with Session(self.engine) as s:
                try:
                    ledger.set_budget(
                        s,
                        dataset_id=self.dataset,
                        principal_id=self.owner,
                        epsilon_total=epsilon,
                        delta_total=delta,
                    )
                    s.commit()
                except BudgetBelowSpent:
                    s.rollback()

        @rule(
            who=st.integers(0, 2), cap=st.one_of(st.none(), st.sampled_from([0.2, 0.5, 1.0, 2.0]))
        )
        def grant(self, who: int, cap: float | None) -> None:
            with Session(self.engine) as s:
                try:
                    ledger.set_grant(
                        s,
                        dataset_id=self.dataset,
                        owner_id=self.owner,
                        principal_id=self.analysts[who],
                        epsilon_cap=cap,
                        delta_cap=None,
                    )
                    s.commit()
                except BudgetBelowSpent:
                    s.rollback()

        @rule(who=st.integers(0, 2))
        def revoke(self, who: int) -> None:
            with Session(self.engine) as s:
                try:
                    ledger.revoke_grant(
                        s,
                        dataset_id=self.dataset,
                        owner_id=self.owner,
                        principal_id=self.analysts[who],
                    )
                    s.commit()
                except Exception:
                    s.rollback()

        @rule(who=st.integers(0, 2), epsilon=EPS, delta=DLT)
        def charge(self, who: int, epsilon: float, delta: float) -> None:
            with Session(self.engine) as s:
                try:
                    ledger.charge(
                        s,
                        dataset_id=self.dataset,
                        principal_id=self.analysts[who],
                        release_id=uuid.uuid4().hex,
                        record=_record(epsilon, delta),
                        request_hash="h",
                        idempotency_key=uuid.uuid4().hex,
                        via_grant=True,
                    )
                    s.commit()
                except (BudgetExhausted, BudgetNotSet, PrincipalCapExceeded):
                    s.rollback()

        @invariant()
        def consistent(self) -> None:
            if not hasattr(self, "engine"):
                return
            with Session(self.engine) as s:
                b = s.get(Budget, self.dataset)
                assert b is not None
                assert b.epsilon_spent <= b.epsilon_total
                assert b.delta_spent <= b.delta_total
                eps_sum, dlt_sum = s.execute(
                    select(
                        func.coalesce(func.sum(LedgerEntry.epsilon), 0),
                        func.coalesce(func.sum(LedgerEntry.delta), 0),
                    ).where(
                        LedgerEntry.dataset_id == self.dataset, LedgerEntry.entry_type == "charge"
                    )
                ).one()
                assert (int(eps_sum), int(dlt_sum)) == (b.epsilon_spent, b.delta_spent)
                for g in s.execute(select(Grant)).scalars():
                    if g.epsilon_cap is not None:
                        assert g.epsilon_spent <= g.epsilon_cap
                    mine = s.execute(
                        select(func.coalesce(func.sum(LedgerEntry.epsilon), 0)).where(
                            LedgerEntry.entry_type == "charge",
                            LedgerEntry.principal_id == g.principal_id,
                        )
                    ).scalar_one()
                    assert int(mine) == g.epsilon_spent
                assert ledger.verify(s, dataset_id=self.dataset).valid
                assert amounts.epsilon_value(b.epsilon_spent) <= 5.0 + 1e-12

    return LedgerMachine


@pytest.mark.slow
def test_ledger_invariants(db_url: str) -> None:
    machine = make_machine(db_url)
    machine.TestCase.settings = settings(
        max_examples=25 if db_url.startswith("sqlite") else 12,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    machine.TestCase().runTest()
