"""The charge as one statement (``curator_charge_v1``, PostgreSQL) against the Python path.

The one-statement charge hashes its ledger entry in SQL; these tests prove the chain it writes
is the one the Python path writes (same hashes, byte for byte) and that the verifier accepts
it, and that through ``ledger.charge_release`` (the accept path) concurrent charges never
overspend, an Idempotency-Key charges once, and a refused charge writes nothing (no entry, no
release, no job).
"""

from __future__ import annotations

import hashlib
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.db.engine import make_engine
from service.db.models import Budget, LedgerEntry, Release
from service.ledger import amounts
from service.ledger import service as ledger
from service.ledger.chain import LOCKED_FIELDS, body_parts, canonical_json, fill
from service.mechanisms.records import Composition, Guarantee, MechanismRecord
from service.problems import BudgetExhausted, BudgetNotSet, NotFound, PrincipalCapExceeded
from tests.db.ledger_helpers import add_people_and_dataset, record, seed_dataset

# Text the canonical JSON must escape identically in SQL and Python: quotes, backslashes,
# control characters, non-ASCII (kept as is) and a line separator.
ODD = 'clé "ü" \\ \t\n\x01 ✓ \u2028 𝛆'


def _postgres_only(url: str) -> None:
    if not url.startswith("postgresql"):
        pytest.skip("the one-statement charge is PostgreSQL's")


def _release(dataset: str, principal: str, key: str, epsilon: float) -> Release:
    return Release(
        id=uuid.uuid4().hex,
        dataset_id=dataset,
        principal_id=principal,
        kind="ate",
        params_json=canonical_json({"params": {"epsilon": epsilon, "note": ODD}}),
        request_hash=hashlib.sha256(key.encode()).hexdigest(),
        reuse_key=None,
        idempotency_key=key,
        status="queued",
        progress=0.0,
        stage="queued",
        guarantee="strict",
        record_json="{}",
    )


def test_body_parts_rebuild_the_canonical_json() -> None:
    fields = {
        "dataset_id": ODD,
        "entry_type": "charge",
        "principal_id": "p",
        "release_id": None,
        "epsilon": 10**12,
        "delta": 0,
        "guarantee": None,
        "details_json": canonical_json({"mechanism": ODD}),
        "request_hash": "h",
        "idempotency_key": ODD,
    }
    locked = {
        "created_at": "2026-11-25T17:00:00.000001+00:00",
        "delta_spent": 0,
        "delta_total": 10**18,
        "epsilon_spent": 2**62,
        "epsilon_total": 2**62,
        "seq": 7,
    }
    assert set(locked) == set(LOCKED_FIELDS)
    parts = body_parts(fields)
    assert len(parts) == len(LOCKED_FIELDS) + 1
    assert fill(parts, locked) == canonical_json({**fields, **locked})


class Clock:
    """``ledger.now_iso``: replays ``replay`` first, then ticks on from a fixed time; every
    time it gives is kept in ``given``."""

    def __init__(self) -> None:
        self.replay: list[str] = []
        self.given: list[str] = []
        self.ticks = iter(range(10**6))

    def __call__(self) -> str:
        now = (
            self.replay.pop(0)
            if self.replay
            else f"2026-11-25T17:00:00.{next(self.ticks):06d}+00:00"
        )
        self.given.append(now)
        return now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(ledger, "now_iso", clock)
    return clock


def _scenario(url: str, ids: dict[str, str]) -> tuple[list[LedgerEntry], list[Release], bool]:
    """Seed a dataset and charge it, all in one transaction that is rolled back."""
    engine = make_engine(url)
    with Session(engine) as s:
        # paper mode on: the odd record below is a paper-mode charge
        add_people_and_dataset(
            s,
            dataset=ids["dataset"],
            owner=ids["owner"],
            analysts=[ids["analyst"]],
            name=ODD,
            allow_paper_mode=True,
        )
        ledger.open_ledger(
            s, dataset_id=ids["dataset"], principal_id=ids["owner"], allow_paper_mode=True
        )
        ledger.set_budget(
            s,
            dataset_id=ids["dataset"],
            principal_id=ids["owner"],
            epsilon_total=10.0,
            delta_total=1e-5,
        )
        ledger.set_grant(
            s,
            dataset_id=ids["dataset"],
            owner_id=ids["owner"],
            principal_id=ids["analyst"],
            epsilon_cap=5.0,
            delta_cap=None,
        )
        odd_record = MechanismRecord(
            mechanism=ODD,
            version="1",
            guarantee=Guarantee.PAPER,
            n=100,
            fold_sizes={"all": 100, ODD: 3},
            composition=Composition.SEQUENTIAL,
            events=(),
            epsilon=0.1 + 0.2,
            delta=1e-7,
        )
        releases = []
        for i, (rec, key) in enumerate(
            [(record(0.25), "k1"), (odd_record, ODD), (record(1.5), "k3")]
        ):
            release = _release(ids["dataset"], ids["analyst"], key, rec.epsilon)
            release.id = f"{i:032d}"
            ledger.charge(
                s,
                dataset_id=ids["dataset"],
                principal_id=ids["analyst"],
                release_id=release.id,
                record=rec,
                request_hash=release.request_hash,
                idempotency_key=key,
                via_grant=True,
                release=release,
            )
            releases.append(release)
        ledger.record_rows_deleted(s, dataset_id=ids["dataset"], principal_id=ids["owner"])
        valid = ledger.verify(s, dataset_id=ids["dataset"]).valid
        entries = ledger.entries(s, dataset_id=ids["dataset"])
        stored = list(s.execute(select(Release).order_by(Release.id)).scalars())
        s.expunge_all()
        s.rollback()
    engine.dispose()
    return entries, stored, valid


def test_one_statement_writes_the_chain_the_python_path_writes(
    db_url: str, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _postgres_only(db_url)
    ids = {k: uuid.uuid4().hex for k in ("owner", "analyst", "dataset")}
    sql_entries, sql_releases, sql_valid = _scenario(db_url, ids)
    assert sql_valid  # the Python verifier recomputes every hash the SQL function wrote
    assert [e.entry_type for e in sql_entries] == [
        "create",
        "budget",
        "grant",
        "charge",
        "charge",
        "charge",
        "rows_deleted",
    ]
    # The same events through the Python path, at the same times: the same chain.
    # (the Python path asks the clock for each charge's time after the grant's two)
    charged_at = [e.created_at for e in sql_entries if e.entry_type == "charge"]
    clock.replay = clock.given[:4] + charged_at + clock.given[4:]
    monkeypatch.setattr(ledger, "in_one_statement", lambda session: False)
    py_entries, py_releases, py_valid = _scenario(db_url, ids)
    assert py_valid
    columns = [c.key for c in LedgerEntry.__table__.columns if c.key != "id"]
    assert [[getattr(e, c) for c in columns] for e in sql_entries] == [
        [getattr(e, c) for c in columns] for e in py_entries
    ]
    assert [e.row_hash for e in sql_entries] == [e.row_hash for e in py_entries]
    release_columns = [c.key for c in Release.__table__.columns]
    assert [[getattr(r, c) for c in release_columns] for r in sql_releases] == [
        [getattr(r, c) for c in release_columns] for r in py_releases
    ]
    assert [r.ledger_seq for r in sql_releases] == [4, 5, 6]


def _charge_release(url: str, dataset: str, principal: str, epsilon: float, key: str) -> str:
    """One release through ``ledger.charge_release`` in its own engine: its outcome."""
    engine = make_engine(url)
    try:
        with Session(engine, expire_on_commit=False) as s:
            s.execute(select(Budget.entries).where(Budget.dataset_id == dataset))  # a read first
            try:
                ledger.charge_release(
                    s,
                    dataset_id=dataset,
                    principal_id=principal,
                    record=record(epsilon),
                    via_grant=True,
                    release=_release(dataset, principal, key, epsilon),
                )
                return "charged"
            except (BudgetExhausted, PrincipalCapExceeded):
                s.rollback()
                return "refused"
            except IntegrityError:
                s.rollback()
                return "duplicate"
    finally:
        engine.dispose()


def _state(url: str, dataset: str) -> dict[str, Any]:
    engine = make_engine(url)
    with Session(engine) as s:
        budget = s.get(Budget, dataset)
        assert budget is not None
        out = {
            "spent": budget.epsilon_spent,
            "entries": budget.entries,
            "valid": ledger.verify(s, dataset_id=dataset).valid,
            "releases": s.execute(
                select(func.count()).select_from(Release).where(Release.dataset_id == dataset)
            ).scalar_one(),
            "jobs": None,
        }
        if url.startswith("postgresql"):
            out["jobs"] = s.execute(text("SELECT count(*) FROM procrastinate_jobs")).scalar_one()
    engine.dispose()
    return out


@pytest.mark.slow
def test_concurrent_release_charges_never_overspend(db_url: str) -> None:
    # Budget 1.0 admits k = 4 releases of 0.25; 24 threads race for it.
    dataset, _, people = seed_dataset(db_url, epsilon_total=1.0, analysts=4)
    with ThreadPoolExecutor(max_workers=24) as pool:
        outcomes = list(
            pool.map(
                lambda i: _charge_release(db_url, dataset, people[i % 4], 0.25, uuid.uuid4().hex),
                range(24),
            )
        )
    assert outcomes.count("charged") == 4
    assert outcomes.count("refused") == 20
    state = _state(db_url, dataset)
    assert state["spent"] == amounts.epsilon_cost_units(0.25) * 4
    assert state["valid"]
    assert (state["releases"], state["entries"]) == (4, 6 + 4)  # create, budget, 4 grants
    assert state["jobs"] in (None, 4)  # one job per charged release (PostgreSQL)


@pytest.mark.slow
def test_one_idempotency_key_is_charged_once_under_a_race(db_url: str) -> None:
    dataset, _, people = seed_dataset(db_url, epsilon_total=10.0)
    with ThreadPoolExecutor(max_workers=12) as pool:
        outcomes = list(
            pool.map(lambda _: _charge_release(db_url, dataset, people[0], 0.5, ODD), range(12))
        )
    assert outcomes.count("charged") == 1
    assert outcomes.count("duplicate") == 11
    state = _state(db_url, dataset)
    assert state["spent"] == amounts.epsilon_cost_units(0.5)
    assert state["valid"]
    assert state["releases"] == 1
    assert state["jobs"] in (None, 1)


def test_refused_charges_write_nothing(db_url: str) -> None:
    dataset, owner, people = seed_dataset(db_url, epsilon_total=1.0, analysts=2)
    engine = make_engine(db_url)
    with Session(engine) as s:
        ledger.set_grant(
            s,
            dataset_id=dataset,
            owner_id=owner,
            principal_id=people[1],
            epsilon_cap=0.1,
            delta_cap=None,
        )
        s.commit()
    engine.dispose()
    before = _state(db_url, dataset)
    assert _charge_release(db_url, dataset, people[0], 1.5, "over-budget") == "refused"
    assert _charge_release(db_url, dataset, people[1], 0.5, "over-cap") == "refused"
    assert _state(db_url, dataset) == before
    unset, owner2, people2 = seed_dataset(db_url, epsilon_total=1.0)
    engine = make_engine(db_url)
    with Session(engine) as s:
        s.execute(text("UPDATE budget SET is_set = false WHERE dataset_id = :d"), {"d": unset})
        s.commit()
        for dataset_id, problem in ((unset, BudgetNotSet), ("no-such-dataset", NotFound)):
            with pytest.raises(problem):
                ledger.charge_release(
                    s,
                    dataset_id=dataset_id,
                    principal_id=people2[0],
                    record=record(0.1),
                    via_grant=False,
                    release=_release(unset, people2[0], "k", 0.1),
                )
            s.rollback()
    engine.dispose()
    assert _state(db_url, dataset) == before
