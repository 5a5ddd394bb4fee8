"""Reuse of an identical release: free, per principal, atomic, and never of a failed release.

The races are replayed deterministically by making the reuse lookup stale once (as it is for
a request whose lookup ran before a concurrent identical request committed); the burst from
many processes is in ``tests/db/test_reuse_concurrency.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from service.db.engine import get_sessionmaker
from service.db.models import Release
from service.releases import service
from tests.api.test_releases import FAST, post_release
from tests.conftest import RCT_SCHEMA, Api


@pytest.fixture
def setup(api: Api, client: TestClient) -> tuple[dict[str, Any], dict[str, Any]]:
    """An owner and an analyst; the job runner is stopped, so releases stay queued."""
    client.app.state.runner.stop()  # type: ignore[attr-defined]
    return api.principal("owner"), api.principal("analyst")


def _dataset(api: Api, owner: dict[str, Any], analyst: dict[str, Any], eps: float) -> str:
    ds = api.dataset(owner["api_key"], n=500, schema=RCT_SCHEMA, epsilon_total=eps)
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    return str(ds["id"])


def _charges(client: TestClient, owner: dict[str, Any], dataset_id: str) -> list[str]:
    h = Api.auth(owner["api_key"])
    assert client.get(f"/v1/datasets/{dataset_id}/ledger/verify", headers=h).json()["valid"]
    entries = client.get(f"/v1/datasets/{dataset_id}/ledger", headers=h).json()["entries"]
    return [e["release_id"] for e in entries if e["entry_type"] == "charge"]


def _stale_once(monkeypatch: pytest.MonkeyPatch, lookup: str = "_reusable") -> None:
    """The next ``lookup`` misses, as if it ran before the winner committed."""
    real = getattr(service, lookup)
    calls = [0]

    def stale(*args: Any) -> Release | None:
        calls[0] += 1
        return None if calls[0] == 1 else real(*args)  # type: ignore[no-any-return]

    monkeypatch.setattr(service, lookup, stale)


def test_identical_request_is_reused_and_charges_nothing(
    api: Api, client: TestClient, setup: Any
) -> None:
    owner, analyst = setup
    dataset = _dataset(api, owner, analyst, 10.0)
    a = post_release(client, analyst["api_key"], dataset, FAST)
    b = post_release(client, analyst["api_key"], dataset, FAST)
    assert (a.status_code, b.status_code) == (202, 200)
    assert b.json()["id"] == a.json()["id"]
    assert b.headers["location"] == a.headers["location"]
    assert (a.json()["cached"], b.json()["cached"]) == (False, True)
    assert _charges(client, owner, dataset) == [a.json()["id"]]
    # Reuse is per principal and per request: another analyst, or other parameters, are charged.
    other = api.principal("analyst")
    api.grant(owner["api_key"], dataset, other["id"])
    c = post_release(client, other["api_key"], dataset, FAST)
    d = post_release(client, analyst["api_key"], dataset, {**FAST, "epsilon": 0.5})
    assert (c.status_code, d.status_code) == (202, 202)
    assert len(_charges(client, owner, dataset)) == 3


def test_a_quote_only_field_does_not_make_another_release(
    api: Api, client: TestClient, setup: Any
) -> None:
    """target_half_width (ate) and expected_heterogeneity_sd (CATE kinds) shape only a quote: a
    release with them is the release without them (its stored parameters drop them), reused at
    no charge. An observational walkthrough quoted with a target and released with the same
    dict: three targets, three charges of the same release."""
    owner, analyst = setup
    dataset = _dataset(api, owner, analyst, 10.0)
    a = post_release(client, analyst["api_key"], dataset, {**FAST, "target_half_width": 1e-9})
    b = post_release(client, analyst["api_key"], dataset, {**FAST, "target_half_width": 2.0})
    c = post_release(client, analyst["api_key"], dataset, FAST)
    assert (a.status_code, b.status_code, c.status_code) == (202, 200, 200)
    assert a.json()["id"] == b.json()["id"] == c.json()["id"]
    assert "target_half_width" not in {k for k, v in a.json()["params"].items() if v is not None}
    assert _charges(client, owner, dataset) == [a.json()["id"]]
    vector = {"epsilon": 1.0, "points": [[50.0, 0.5, 1.0]]}
    d = post_release(
        client,
        analyst["api_key"],
        dataset,
        {**vector, "expected_heterogeneity_sd": 0.5},
        kind="cate_vector",
    )
    e = post_release(client, analyst["api_key"], dataset, vector, kind="cate_vector")
    assert (d.status_code, e.status_code) == (202, 200)
    assert d.json()["id"] == e.json()["id"]
    assert len(_charges(client, owner, dataset)) == 2


def test_covariate_names_in_column_lists_are_their_positions(
    api: Api, client: TestClient, setup: Any
) -> None:
    """effect_columns / adjustment_columns take schema names as well as positions (cut_points
    takes names): the stored request holds positions, so a name and its position are one
    release, reused; an unknown name is a 422 pointing at it, before any charge."""
    owner, analyst = setup
    dataset = _dataset(api, owner, analyst, 10.0)
    by_name = {"epsilon": 1.0, "nuisance": "dp_linear", "adjustment_columns": ["age", "severity"]}
    a = post_release(client, analyst["api_key"], dataset, by_name)
    b = post_release(client, analyst["api_key"], dataset, {**by_name, "adjustment_columns": [0, 1]})
    assert (a.status_code, b.status_code) == (202, 200)
    assert a.json()["id"] == b.json()["id"]
    assert a.json()["params"]["adjustment_columns"] == [0, 1]
    # the order of a set does not make another release (a re-test's [0, "severity"] after
    # ["severity", "age"] was charged again)
    c = post_release(
        client, analyst["api_key"], dataset, {**by_name, "adjustment_columns": [1, "age"]}
    )
    assert c.status_code == 200
    assert c.json()["id"] == a.json()["id"]
    bad = post_release(
        client, analyst["api_key"], dataset, {**by_name, "adjustment_columns": ["age", "weight"]}
    )
    assert bad.status_code == 422
    problem = bad.json()
    assert problem["errors"][0]["pointer"] == "#/params/adjustment_columns/1"
    assert "'weight' is not a covariate" in problem["errors"][0]["detail"]
    assert "age, severity, sex" in problem["errors"][0]["detail"]
    h = Api.auth(analyst["api_key"])
    quoted = client.post(
        f"/v1/datasets/{dataset}/quotes",
        headers=h,
        json={"kind": "ebm_cate", "params": {"epsilon": 1.0, "effect_columns": ["sex"]}},
    )
    assert quoted.status_code == 200, quoted.text
    assert quoted.json()["accuracy"]["effect_columns"] == [2]
    assert _charges(client, owner, dataset) == [a.json()["id"]]


def test_loser_of_the_reuse_key_rolls_back_and_is_reused(
    api: Api, client: TestClient, setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, analyst = setup
    dataset = _dataset(api, owner, analyst, 10.0)
    a = post_release(client, analyst["api_key"], dataset, FAST)
    _stale_once(monkeypatch)
    b = post_release(client, analyst["api_key"], dataset, FAST)
    assert b.status_code == 200, b.text
    assert b.json()["id"] == a.json()["id"]
    assert b.json()["cached"] is True
    assert _charges(client, owner, dataset) == [a.json()["id"]]
    budget = client.get(f"/v1/datasets/{dataset}/budget", headers=Api.auth(owner["api_key"]))
    assert budget.json()["epsilon_spent"] == pytest.approx(1.0)


def test_loser_finding_the_budget_spent_by_the_winner_is_reused(
    api: Api, client: TestClient, setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, analyst = setup
    dataset = _dataset(api, owner, analyst, 1.0)  # exactly one release of FAST
    a = post_release(client, analyst["api_key"], dataset, FAST)
    _stale_once(monkeypatch)
    b = post_release(client, analyst["api_key"], dataset, FAST)
    assert b.status_code == 200, b.text
    assert b.json()["id"] == a.json()["id"]
    assert _charges(client, owner, dataset) == [a.json()["id"]]
    # A request that is not identical is still refused.
    r = post_release(client, analyst["api_key"], dataset, {**FAST, "epsilon": 0.5})
    assert r.status_code == 409


def test_retry_finding_the_budget_spent_by_its_own_key_is_replayed(
    api: Api, client: TestClient, setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, analyst = setup
    dataset = _dataset(api, owner, analyst, 1.0)
    a = post_release(client, analyst["api_key"], dataset, FAST, idem="k", fresh=True)
    _stale_once(monkeypatch, "_by_key")
    b = post_release(client, analyst["api_key"], dataset, FAST, idem="k", fresh=True)
    assert (a.status_code, b.status_code) == (202, 200), b.text
    assert b.json()["id"] == a.json()["id"]
    assert _charges(client, owner, dataset) == [a.json()["id"]]


def test_fresh_releases_hold_no_reuse_key_and_failed_ones_free_it(
    api: Api, client: TestClient, setup: Any
) -> None:
    owner, analyst = setup
    dataset = _dataset(api, owner, analyst, 10.0)
    a = post_release(client, analyst["api_key"], dataset, FAST).json()
    f = post_release(client, analyst["api_key"], dataset, FAST, fresh=True).json()
    with get_sessionmaker()() as s:
        rows = {r.id: r for r in s.execute(select(Release)).scalars()}
        assert rows[a["id"]].reuse_key == rows[a["id"]].request_hash
        assert rows[f["id"]].reuse_key is None
        assert rows[f["id"]].request_hash == rows[a["id"]].request_hash
        # Both fail (as a job failure or the stale sweep would mark them).
        s.execute(update(Release).values(status="failed", stage="failed"))
        s.commit()
    # A failed release is never reused: the next identical request is charged anew and takes
    # the key, and the one after it is reused.
    b = post_release(client, analyst["api_key"], dataset, FAST)
    c = post_release(client, analyst["api_key"], dataset, FAST)
    assert (b.status_code, c.status_code) == (202, 200)
    assert c.json()["id"] == b.json()["id"] not in (a["id"], f["id"])
    assert _charges(client, owner, dataset) == [a["id"], f["id"], b.json()["id"]]
