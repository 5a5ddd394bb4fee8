"""The ledger on both databases: atomic charges under concurrency, caps, tamper evidence."""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from service.db.engine import make_engine
from service.db.models import Budget, LedgerEntry
from service.ledger import amounts
from service.ledger import service as ledger
from service.problems import BudgetBelowSpent, BudgetExhausted
from tests.db.ledger_helpers import checks_during, record, seed_dataset, try_charge


def _spent(url: str, dataset: str) -> int:
    engine = make_engine(url)
    with Session(engine) as s:
        b = s.get(Budget, dataset)
        assert b is not None
        spent = b.epsilon_spent
        assert ledger.verify(s, dataset_id=dataset).valid
    engine.dispose()
    return spent


@pytest.mark.slow
def test_concurrent_threads_charge_exactly_k(db_url: str) -> None:
    # Budget 1.0 admits k = 4 charges of 0.25; 16 threads race for it.
    dataset, _, people = seed_dataset(db_url, epsilon_total=1.0, analysts=4)
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(
            pool.map(lambda i: try_charge(db_url, dataset, people[i % 4], 0.25), range(16))
        )
    assert sum(results) == 4
    assert _spent(db_url, dataset) == amounts.epsilon_cost_units(0.25) * 4


@pytest.mark.slow
def test_concurrent_processes_charge_exactly_k(db_url: str) -> None:
    dataset, _, people = seed_dataset(db_url, epsilon_total=0.9, analysts=2)
    ctx = mp.get_context("spawn")
    with ctx.Pool(6) as pool:
        results = pool.starmap(
            try_charge, [(db_url, dataset, people[i % 2], 0.3) for i in range(12)]
        )
    assert sum(results) == 3
    assert _spent(db_url, dataset) == amounts.epsilon_cost_units(0.3) * 3


def test_per_principal_cap_holds(db_url: str) -> None:
    dataset, owner, people = seed_dataset(db_url, epsilon_total=10.0, analysts=2)
    engine = make_engine(db_url)
    with Session(engine) as s:
        ledger.set_grant(
            s,
            dataset_id=dataset,
            owner_id=owner,
            principal_id=people[0],
            epsilon_cap=0.5,
            delta_cap=None,
        )
        s.commit()
    assert try_charge(db_url, dataset, people[0], 0.25)
    assert not try_charge(db_url, dataset, people[0], 0.3)  # 0.55 > cap 0.5
    assert try_charge(db_url, dataset, people[0], 0.25)  # exactly at the cap (0.25 is exact)
    assert not try_charge(db_url, dataset, people[0], 1e-9)
    assert try_charge(db_url, dataset, people[1], 3.0)  # the other analyst is uncapped
    with Session(engine) as s, pytest.raises(BudgetBelowSpent):
        ledger.set_grant(
            s,
            dataset_id=dataset,
            owner_id=owner,
            principal_id=people[0],
            epsilon_cap=0.4,
            delta_cap=None,
        )
    engine.dispose()
    assert _spent(db_url, dataset) == amounts.epsilon_cost_units(0.5) + amounts.epsilon_cost_units(
        3.0
    )


def test_revoked_grant_cannot_charge(db_url: str) -> None:
    dataset, owner, people = seed_dataset(db_url, epsilon_total=10.0)
    engine = make_engine(db_url)
    with Session(engine) as s:
        ledger.revoke_grant(s, dataset_id=dataset, owner_id=owner, principal_id=people[0])
        s.commit()
    engine.dispose()
    assert not try_charge(db_url, dataset, people[0], 0.1)


def test_budget_cannot_drop_below_spent_and_exhaustion_is_refused(db_url: str) -> None:
    dataset, owner, people = seed_dataset(db_url, epsilon_total=1.0)
    assert try_charge(db_url, dataset, people[0], 0.75)
    engine = make_engine(db_url)
    with Session(engine) as s:
        with pytest.raises(BudgetBelowSpent):
            ledger.set_budget(
                s, dataset_id=dataset, principal_id=owner, epsilon_total=0.5, delta_total=1e-5
            )
        s.rollback()
        with pytest.raises(BudgetExhausted):
            ledger.charge(
                s,
                dataset_id=dataset,
                principal_id=people[0],
                release_id="r",
                record=record(0.3),
                request_hash="h",
                idempotency_key="k",
                via_grant=True,
            )
        s.rollback()
    engine.dispose()


def _tamper(url: str, sql: str) -> ledger.Verification:
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text(sql))
    with Session(engine) as s:
        dataset = s.execute(select(LedgerEntry.dataset_id).limit(1)).scalar_one()
        v = ledger.verify(s, dataset_id=dataset)
    engine.dispose()
    return v


@pytest.mark.parametrize(
    ("sql", "bad_seq"),
    [
        ("UPDATE ledger_entry SET epsilon = epsilon - 1 WHERE seq = 4", 4),
        ("UPDATE ledger_entry SET created_at = 'x' WHERE seq = 2", 2),
        ("UPDATE ledger_entry SET details_json = '{}' WHERE seq = 5", 5),
        ("DELETE FROM ledger_entry WHERE seq = 3", 3),
        ("DELETE FROM ledger_entry WHERE seq = 5", 5),
        ("UPDATE budget SET epsilon_spent = 0", None),
    ],
)
def test_hash_chain_detects_tampering(db_url: str, sql: str, bad_seq: int | None) -> None:
    dataset, _, people = seed_dataset(db_url, epsilon_total=5.0)  # entries 1-3
    assert try_charge(db_url, dataset, people[0], 0.5)  # 4
    assert try_charge(db_url, dataset, people[0], 0.5)  # 5
    assert _spent(db_url, dataset) > 0
    v = _tamper(db_url, sql)
    assert not v.valid
    assert v.first_invalid_seq == bad_seq


def test_verify_during_concurrent_charges_sees_a_consistent_chain(db_url: str) -> None:
    """A check that reads the head and then the entries must not call a charge committed in
    between an entry "removed from the end" (PostgreSQL, READ COMMITTED): the check reads one
    snapshot."""
    dataset, _, people = seed_dataset(db_url, epsilon_total=100.0)

    def charges() -> None:
        for _ in range(40):
            assert try_charge(db_url, dataset, people[0], 0.01)

    results = checks_during(db_url, charges, lambda s: ledger.verify(s, dataset_id=dataset))
    assert [v for v in results if not v.valid] == []
    assert results[-1].entries >= 3


def test_a_check_in_progress_does_not_hold_up_charges(db_url: str) -> None:
    """The check reads a snapshot and locks nothing: a charge made while a check's transaction
    is still open goes through at once, and the check still sees the ledger of its start.
    (SQLite has one writer at a time: its checks and charges queue by design.)"""
    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite's transactions are exclusive: checks and charges queue by design")
    dataset, _, people = seed_dataset(db_url, epsilon_total=5.0)
    engine = make_engine(db_url)
    try:
        with ThreadPoolExecutor(1) as pool:
            with Session(engine) as s:  # closed (its transaction ended) before the pool waits
                before = ledger.verify(s, dataset_id=dataset)  # its transaction stays open
                charged = pool.submit(try_charge, db_url, dataset, people[0], 0.5)
                try:
                    charged.result(timeout=20)
                    waited = False
                except TimeoutError:
                    waited = True
                # the check's snapshot still holds the ledger of its start
                in_snapshot = s.execute(
                    select(func.count())
                    .select_from(LedgerEntry)
                    .where(LedgerEntry.dataset_id == dataset)
                ).scalar_one()
            assert not waited, "the charge waited for the check's transaction to end"
            assert in_snapshot == before.entries
            assert charged.result()
        with Session(engine) as s:
            after = ledger.verify(s, dataset_id=dataset)
    finally:
        engine.dispose()
    assert before.valid
    assert after.valid
    assert after.entries == before.entries + 1


def test_costs_round_up_and_totals_round_down() -> None:
    assert amounts.epsilon_cost_units(0.1) == 100_000_000_000  # the decimal the caller wrote
    assert amounts.epsilon_cost_units(0.1 + 0.2) == 300_000_000_001  # 0.30000000000000004
    assert amounts.epsilon_total_units(0.1) == 100_000_000_000
    assert amounts.delta_cost_units(1e-5) == 10**13 == amounts.delta_total_units(1e-5)
    assert amounts.epsilon_cost_units(1e-13) == 1  # never rounded to zero
    for bad in (float("nan"), float("inf"), -0.1, 5e-324):
        with pytest.raises(amounts.InvalidAmount):
            amounts.epsilon_cost_units(bad)


@pytest.mark.parametrize(
    ("sql", "charge_after", "bad_seq", "reason"),
    [
        # an insider raises the total in the (unchained) budget row, then charges past it
        ("UPDATE budget SET epsilon_total = epsilon_total * 100 WHERE {d}", True, 6, "not set by"),
        ("UPDATE budget SET epsilon_total = epsilon_total * 100 WHERE {d}", False, None, "totals"),
        # ... or resets an analyst's spend under its cap, or lifts the cap, or drops the grant
        ("UPDATE dataset_grant SET epsilon_spent = 0 WHERE {d}", False, None, "its spend differs"),
        ("UPDATE dataset_grant SET epsilon_cap = 10000000000000 WHERE {d}", False, None, "caps"),
        ("DELETE FROM dataset_grant WHERE {d}", False, None, "grants differ"),
        # ... or makes a client key an analyst for a charge and back: the grantee that charged
        # is a client now
        (
            "UPDATE principal SET role = 'client' WHERE id IN "
            "(SELECT principal_id FROM dataset_grant WHERE {d})",
            False,
            None,
            "not an analyst",
        ),
    ],
)
def test_the_unchained_rows_are_checked_against_the_entries(
    db_url: str, sql: str, charge_after: bool, bad_seq: int | None, reason: str
) -> None:
    """An auditor's insider raised a dataset's epsilon total from 1 to 100 in the budget row
    and charged six more releases, and made a client key an analyst for one charge: the check
    said valid both times. The totals, grants and roles are now replayed from the entries."""
    dataset, _, people = seed_dataset(db_url, epsilon_total=5.0)  # entries 1-3
    assert try_charge(db_url, dataset, people[0], 0.5)  # 4
    assert try_charge(db_url, dataset, people[0], 0.5)  # 5
    assert _spent(db_url, dataset) > 0  # valid before
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text(sql.format(d=f"dataset_id = '{dataset}'")))
    if charge_after:
        assert try_charge(db_url, dataset, people[0], 0.5)  # 6
    with Session(engine) as s:
        v = ledger.verify(s, dataset_id=dataset)
    engine.dispose()
    assert not v.valid
    assert v.first_invalid_seq == bad_seq
    assert v.reason is not None
    assert reason in v.reason


def test_an_owners_own_charges_and_regranted_caps_verify(db_url: str) -> None:
    """The replay accepts what the service does: the owner's charges without a grant, a cap
    set and changed, a revoked grant given back (its spend stays spent), a new budget."""
    dataset, owner, people = seed_dataset(db_url, epsilon_total=5.0, analysts=2)
    engine = make_engine(db_url)
    assert try_charge(db_url, dataset, people[0], 0.5)
    with Session(engine) as s:
        ledger.set_grant(
            s,
            dataset_id=dataset,
            owner_id=owner,
            principal_id=people[0],
            epsilon_cap=2.0,
            delta_cap=None,
        )
        ledger.revoke_grant(s, dataset_id=dataset, owner_id=owner, principal_id=people[1])
        ledger.set_budget(
            s, dataset_id=dataset, principal_id=owner, epsilon_total=6.0, delta_total=1e-5
        )
        s.commit()
    assert not try_charge(db_url, dataset, people[1], 0.5)
    with Session(engine) as s:
        ledger.set_grant(
            s,
            dataset_id=dataset,
            owner_id=owner,
            principal_id=people[1],
            epsilon_cap=None,
            delta_cap=None,
        )
        ledger.charge(
            s,
            dataset_id=dataset,
            principal_id=owner,
            release_id="own",
            record=record(1.0),
            request_hash="h",
            idempotency_key="own-1",
            via_grant=False,
        )
        s.commit()
    assert try_charge(db_url, dataset, people[1], 0.5)
    assert try_charge(db_url, dataset, people[0], 1.5)  # exactly at its cap of 2
    with Session(engine) as s:
        v = ledger.verify(s, dataset_id=dataset)
    engine.dispose()
    assert v.valid, v
