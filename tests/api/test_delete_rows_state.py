"""Deleting a dataset's rows deletes every state built from them: an exact-basis function's
fitted g* keeps the estimation fold's rows as its kernel support (an owner walkthrough decoded
them after delete-rows), so its state goes with the rows and the function closes; finite-basis
functions (DP coefficients on public centres) and every release's DP result stay."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session

from service.db.models import CateFunction, CateFunctionBatch, CateFunctionSecret, DatasetChunk
from tests.api.test_functions import FAST, evaluate, make_constant, release
from tests.api.test_functions import setup as setup  # noqa: F401 - the fixture
from tests.api.test_releases import post_release, wait
from tests.conftest import Api

POINT = [[40.0, 0.2, 1.0]]


def _counts(db_url: str, fid: str) -> tuple[int, int, str]:
    engine = create_engine(db_url)
    try:
        with Session(engine) as session:
            secrets = session.scalar(
                select(func.count()).where(CateFunctionSecret.function_id == fid)
            )
            batches = session.scalar(
                select(func.count()).where(CateFunctionBatch.function_id == fid)
            )
            status = session.scalar(select(CateFunction.status).where(CateFunction.id == fid))
            return int(secrets or 0), int(batches or 0), str(status)
    finally:
        engine.dispose()


def _delete_rows(c: TestClient, s: dict[str, Any]) -> None:
    r = c.delete(f"/v1/datasets/{s['ds']['id']}/rows", headers=Api.auth(s["owner"]["api_key"]))
    assert r.status_code == 204, r.text


def test_deleting_rows_deletes_an_exact_functions_state(
    client: TestClient,
    setup: dict[str, Any],
    db_url: str,  # noqa: F811
) -> None:
    s = setup
    exact = release(client, s, {**FAST, "basis": "exact"})["id"]
    finite = release(client, s, {**FAST, "basis": "nystrom", "n_centres": 20})["id"]
    key = s["client"]["api_key"]
    answered = evaluate(client, key, exact, POINT)
    assert answered.status_code == 200, answered.text
    kept = evaluate(client, key, finite, POINT).json()["values"]
    assert _counts(db_url, exact)[:2] == (1, 1)

    _delete_rows(client, s)

    assert _counts(db_url, exact) == (0, 0, "closed")
    for point in (POINT, [[60.0, 0.7, 0.0]]):  # answered before, and new
        refused = evaluate(client, key, exact, point)
        assert refused.status_code == 409, refused.text
        body = refused.json()
        assert body["type"].endswith("/function-closed")
        assert "rows were deleted" in body["detail"]
    # a finite basis holds DP coefficients on public centres: it keeps answering, identically
    assert evaluate(client, key, finite, POINT).json()["values"] == kept
    assert _counts(db_url, finite)[0] == 1
    # the releases (DP outputs) stay readable
    for rid in (exact, finite):
        got = client.get(f"/v1/releases/{rid}", headers=Api.auth(s["analyst"]["api_key"]))
        assert got.json()["status"] == "done"
    engine = create_engine(db_url)
    try:
        with Session(engine) as session:
            left = session.scalar(
                select(func.count()).where(DatasetChunk.dataset_id == s["ds"]["id"])
            )
            assert left == 0
    finally:
        engine.dispose()


def test_a_fit_that_finishes_after_the_deletion_stores_no_state(
    client: TestClient,
    setup: dict[str, Any],
    db_url: str,  # noqa: F811
) -> None:
    """The job read the rows, the owner deleted them during the fit: the release's DP result is
    stored, its exact function closed and without state."""
    s = setup
    client.app.state.runner.stop()  # type: ignore[attr-defined]
    r = post_release(
        client,
        s["analyst"]["api_key"],
        s["ds"]["id"],
        {**FAST, "basis": "exact"},
        kind="cate_function",
    )
    assert r.status_code == 202, r.text
    rid = r.json()["id"]
    from service.db.engine import get_sessionmaker
    from service.jobs.runner import JobRunner

    runner = JobRunner(get_sessionmaker(), workers=1, latency_buckets=(0.01,))
    assert runner.claim_next() == rid
    assert runner.execute(rid, run_hook=lambda: _delete_rows(client, s)) == "done"
    done = wait(client, s["analyst"]["api_key"], rid)
    assert done["status"] == "done"
    assert _counts(db_url, rid) == (0, 0, "closed")
    refused = evaluate(client, s["client"]["api_key"], rid, POINT)
    assert refused.status_code == 409
    assert "rows were deleted" in refused.json()["detail"]


@pytest.mark.parametrize("basis", ["exact"])
def test_deleting_rows_twice_is_refused_and_changes_nothing(
    client: TestClient,
    setup: dict[str, Any],
    db_url: str,
    basis: str,  # noqa: F811
) -> None:
    s = setup
    fid = release(client, s, {**FAST, "basis": basis})["id"]
    _delete_rows(client, s)
    again = client.delete(
        f"/v1/datasets/{s['ds']['id']}/rows", headers=Api.auth(s["owner"]["api_key"])
    )
    assert again.status_code == 409
    assert _counts(db_url, fid) == (0, 0, "closed")


def test_sqlite_overwrites_deleted_pages(tmp_path: Any) -> None:
    """The service's SQLite connections overwrite freed pages (secure_delete), whatever the
    build's default, so deleted rows do not linger in the file."""
    from service.db.engine import make_engine

    engine = make_engine(f"sqlite:///{tmp_path / 'x.sqlite3'}")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA secure_delete").scalar() == 1
    finally:
        engine.dispose()


def test_an_operator_closes_exact_functions_after_a_restore(
    client: TestClient,
    setup: dict[str, Any],  # noqa: F811
) -> None:
    from service.db.engine import get_sessionmaker
    from service.functions.close import close_functions

    s = setup
    exact = release(client, s, {**FAST, "basis": "exact"})["id"]
    finite = release(client, s, {**FAST, "basis": "nystrom", "n_centres": 20})["id"]
    key = s["client"]["api_key"]
    assert evaluate(client, key, exact, POINT).status_code == 200
    counts = close_functions(get_sessionmaker(), all_exact=True)
    assert counts == {"closed": 1, "already_closed": 0, "unknown": 0}
    assert evaluate(client, key, exact, POINT).status_code == 409
    assert evaluate(client, key, finite, POINT).status_code == 200
    again = close_functions(get_sessionmaker(), ids=[exact, "nope"])
    assert again == {"closed": 0, "already_closed": 1, "unknown": 1}


def test_a_constant_exact_function_keeps_answering_its_anchor_after_the_deletion(
    client: TestClient,
    setup: dict[str, Any],
    db_url: str,  # noqa: F811
) -> None:
    """At shrinkage factor 0 every answer is the public anchor, served without the state: the
    deletion deletes the state (its rows) and the function stays open, answering the same (a
    CDS walkthrough's constant exact function had closed with the rows)."""
    s = setup
    params = {**{k: v for k, v in FAST.items() if k != "shrinkage"}, "basis": "exact"}
    fid = release(client, s, params)["id"]
    make_constant(db_url, fid)
    key = s["client"]["api_key"]
    before = evaluate(client, key, fid, POINT).json()["values"]
    assert _counts(db_url, fid)[0] == 1

    _delete_rows(client, s)

    assert _counts(db_url, fid) == (0, 0, "open")
    for point in (POINT, [[60.0, 0.7, 0.0]]):
        answered = evaluate(client, key, fid, point)
        assert answered.status_code == 200, answered.text
        assert answered.json()["values"] == before
