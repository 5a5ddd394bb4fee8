"""Releases over HTTP: the ATE end to end, idempotency, budget refusals, jobs and their failures."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.test_datasets import problem
from tests.conftest import RCT_SCHEMA, Api

FAST = {"epsilon": 1.0, "nuisance": "none"}


def post_release(
    client: TestClient,
    key: str,
    dataset_id: str,
    params: dict[str, Any],
    *,
    idem: str | None = None,
    kind: str = "ate",
    fresh: bool = False,
) -> Any:
    headers = Api.auth(key) | {"Idempotency-Key": idem or uuid.uuid4().hex}
    return client.post(
        f"/v1/datasets/{dataset_id}/releases",
        json={"kind": kind, "params": params, "fresh": fresh},
        headers=headers,
    )


def wait(client: TestClient, key: str, release_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        body: dict[str, Any] = client.get(
            f"/v1/releases/{release_id}", headers=Api.auth(key)
        ).json()
        if body["status"] in ("done", "failed"):
            return body
        time.sleep(0.05)
    raise AssertionError("release did not finish")


@pytest.fixture
def rct(api: Api) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(
        owner["api_key"], n=2000, schema=RCT_SCHEMA, epsilon_total=3.0, delta_total=1e-4
    )
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    return owner, analyst, ds


def test_strict_ate_end_to_end(client: TestClient, rct: Any) -> None:
    owner, analyst, ds = rct
    r = post_release(client, analyst["api_key"], ds["id"], FAST)
    assert r.status_code == 202, r.text
    assert r.headers["location"] == f"/v1/releases/{r.json()['id']}"
    assert r.json()["status"] in ("queued", "running")
    assert r.json()["result"] is None
    assert r.headers["retry-after"] == "1"  # when to poll again, while it is unfinished
    done = wait(client, analyst["api_key"], r.json()["id"])
    assert done["status"] == "done", done
    finished = client.get(r.headers["location"], headers=Api.auth(analyst["api_key"]))
    assert "retry-after" not in finished.headers
    assert done["guarantee"] == "strict"
    assert done["epsilon"] == pytest.approx(1.0)
    res = done["result"]
    # the interval is estimate +- half_width, and never narrower than the public noise floor
    assert res["ci_upper"] - res["estimate"] == pytest.approx(res["half_width"])
    assert res["estimate"] - res["ci_lower"] == pytest.approx(res["half_width"])
    assert res["half_width"] >= 1.959963984540054 * res["s_theta"] * (1 - 1e-12)
    assert done["mechanism"]["neighbouring"] == "replace-one"
    # the request as set: defaults and rule-resolved nulls (trim, ate_share, delta, ...) omitted
    assert done["params"] == FAST
    budget = client.get(
        f"/v1/datasets/{ds['id']}/budget", headers=Api.auth(owner["api_key"])
    ).json()
    assert budget["epsilon_spent"] == pytest.approx(1.0)
    entries = client.get(
        f"/v1/datasets/{ds['id']}/ledger", headers=Api.auth(owner["api_key"])
    ).json()["entries"]
    charge = entries[-1]
    assert charge["entry_type"] == "charge"
    assert charge["release_id"] == done["id"]
    assert charge["guarantee"] == "strict"


def test_a_finished_release_is_one_operator_log_line(
    client: TestClient, rct: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator's walkthrough found that a successful job logged nothing (failures did):
    one line with the release id, nothing about its data or result."""
    import logging

    _, analyst, ds = rct
    with caplog.at_level(logging.INFO, logger="service"):
        r = post_release(client, analyst["api_key"], ds["id"], FAST)
        done = wait(client, analyst["api_key"], r.json()["id"])
    assert done["status"] == "done"
    lines = [record.getMessage() for record in caplog.records if done["id"] in record.getMessage()]
    assert lines == [f"release {done['id']} done"]
    assert str(done["result"]["estimate"]) not in caplog.text


def test_same_key_same_body_charges_once(client: TestClient, rct: Any) -> None:
    owner, analyst, ds = rct
    first = post_release(client, analyst["api_key"], ds["id"], FAST, idem="key-1")
    again = post_release(client, analyst["api_key"], ds["id"], FAST, idem="key-1")
    assert (first.status_code, again.status_code) == (202, 200)
    assert first.json()["id"] == again.json()["id"]
    done = wait(client, analyst["api_key"], first.json()["id"])
    replay = post_release(client, analyst["api_key"], ds["id"], FAST, idem="key-1")
    assert replay.json()["result"] == done["result"]
    budget = client.get(
        f"/v1/datasets/{ds['id']}/budget", headers=Api.auth(owner["api_key"])
    ).json()
    assert budget["epsilon_spent"] == pytest.approx(1.0)


def test_a_default_spelled_out_is_the_same_request(client: TestClient, rct: Any) -> None:
    _, analyst, ds = rct
    first = post_release(client, analyst["api_key"], ds["id"], FAST, idem="key-2")
    spelled = {**FAST, "alpha": 0.05, "delta": None, "mode": "strict"}
    again = post_release(client, analyst["api_key"], ds["id"], spelled, idem="key-2")
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["params"] == FAST
    other = post_release(client, analyst["api_key"], ds["id"], {**FAST, "alpha": 0.1})
    assert other.status_code == 202
    assert wait(client, analyst["api_key"], other.json()["id"])["params"] == {**FAST, "alpha": 0.1}


def test_same_key_different_body_is_422(client: TestClient, rct: Any) -> None:
    _, analyst, ds = rct
    post_release(client, analyst["api_key"], ds["id"], FAST, idem="k")
    r = post_release(client, analyst["api_key"], ds["id"], {**FAST, "epsilon": 0.5}, idem="k")
    problem(r, 422, "idempotency-key-reused")


def test_identical_request_is_served_from_the_store_unless_fresh(
    client: TestClient, rct: Any
) -> None:
    owner, analyst, ds = rct
    a = post_release(client, analyst["api_key"], ds["id"], FAST)
    b = post_release(client, analyst["api_key"], ds["id"], FAST)
    assert b.status_code == 200
    assert b.json()["id"] == a.json()["id"]
    assert b.json()["cached"]
    c = post_release(client, analyst["api_key"], ds["id"], FAST, fresh=True)
    assert c.status_code == 202
    assert c.json()["id"] != a.json()["id"]
    da, dc = (
        wait(client, analyst["api_key"], a.json()["id"]),
        wait(client, analyst["api_key"], c.json()["id"]),
    )
    assert da["result"]["estimate"] != dc["result"]["estimate"]  # fresh noise, never a seed
    budget = client.get(
        f"/v1/datasets/{ds['id']}/budget", headers=Api.auth(owner["api_key"])
    ).json()
    assert budget["epsilon_spent"] == pytest.approx(2.0)


def test_budget_exhaustion_and_caps(api: Api, client: TestClient, rct: Any) -> None:
    owner, analyst, ds = rct
    for _ in range(3):
        assert (
            post_release(client, analyst["api_key"], ds["id"], FAST, fresh=True).status_code == 202
        )
    problem(
        post_release(client, analyst["api_key"], ds["id"], FAST, fresh=True),
        409,
        "budget-exhausted",
    )
    capped = api.principal("analyst")
    ds2 = api.dataset(owner["api_key"], n=500, schema=RCT_SCHEMA, epsilon_total=10)
    api.grant(owner["api_key"], ds2["id"], capped["id"], epsilon_cap=1.5)
    assert post_release(client, capped["api_key"], ds2["id"], FAST).status_code == 202
    problem(
        post_release(client, capped["api_key"], ds2["id"], FAST, fresh=True),
        409,
        "principal-cap-exceeded",
    )


def test_budget_not_set(api: Api, client: TestClient) -> None:
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"], schema=RCT_SCHEMA, epsilon_total=None)
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    problem(post_release(client, analyst["api_key"], ds["id"], FAST), 409, "budget-not-set")


@pytest.mark.parametrize(
    ("params", "slug"),
    [
        ({"epsilon": 0}, "validation-failed"),
        ({"epsilon": -1}, "validation-failed"),
        ({"epsilon": "NaN"}, "validation-failed"),
        ({"epsilon": "Infinity"}, "validation-failed"),
        ({"epsilon": 1, "delta": 0.5}, "validation-failed"),  # delta >= 1/n
        ({"epsilon": 1, "delta": 0}, "validation-failed"),
        ({"epsilon": 1, "alpha": 1.5}, "validation-failed"),
        ({"epsilon": 1, "unknown": 3}, "validation-failed"),
        ({"epsilon": 1, "mode": "paper", "estimator": "ipw"}, "validation-failed"),
        ({"epsilon": 1, "mode": "paper"}, "paper-mode-disabled"),
    ],
)
def test_invalid_parameters_are_refused_before_any_charge(
    client: TestClient, rct: Any, params: dict[str, Any], slug: str
) -> None:
    owner, analyst, ds = rct
    status = 403 if slug == "paper-mode-disabled" else 422
    problem(post_release(client, analyst["api_key"], ds["id"], params), status, slug)
    budget = client.get(
        f"/v1/datasets/{ds['id']}/budget", headers=Api.auth(owner["api_key"])
    ).json()
    assert budget["epsilon_spent"] == 0


def test_unknown_kind_and_missing_key(client: TestClient, rct: Any) -> None:
    _, analyst, ds = rct
    problem(
        post_release(client, analyst["api_key"], ds["id"], FAST, kind="nope"),
        422,
        "unknown-release-kind",
    )
    r = client.post(
        f"/v1/datasets/{ds['id']}/releases",
        json={"kind": "ate", "params": FAST},
        headers=Api.auth(analyst["api_key"]),
    )
    problem(r, 400, "idempotency-key-missing")


def test_clients_cannot_spend_and_see_only_done_releases(
    api: Api, client: TestClient, rct: Any
) -> None:
    owner, analyst, ds = rct
    cl = api.principal("client")
    api.grant(owner["api_key"], ds["id"], cl["id"])
    problem(post_release(client, cl["api_key"], ds["id"], FAST), 403, "forbidden")
    rel = post_release(client, analyst["api_key"], ds["id"], FAST).json()
    wait(client, analyst["api_key"], rel["id"])
    got = client.get(f"/v1/releases/{rel['id']}", headers=Api.auth(cl["api_key"]))
    assert got.status_code == 200
    assert got.json()["result"] is not None
    stranger = api.principal("client")
    other_owner = api.principal("owner")
    unknown = problem(
        client.get(f"/v1/releases/{'0' * 32}", headers=Api.auth(other_owner["api_key"])),
        404,
        "not-found",
    )
    for outsider in (stranger, other_owner):
        # in the words of an unknown id: "dataset not found" told an auditor it exists
        refused = problem(
            client.get(f"/v1/releases/{rel['id']}", headers=Api.auth(outsider["api_key"])),
            404,
            "not-found",
        )
        assert refused["detail"] == unknown["detail"] == "release not found"


def test_no_reader_learns_a_finished_jobs_real_duration(
    api: Api, client: TestClient, rct: Any
) -> None:
    """Until its padded completion time a finished release reads as running to the analyst
    (public progress, stage "running", no finish time) and does not exist for a client (GET 404,
    absent from the listing); then everyone sees it, with the padded finish time."""
    owner, analyst, ds = rct
    cl = api.principal("client")
    api.grant(owner["api_key"], ds["id"], cl["id"])
    client.app.state.runner.stop()  # type: ignore[attr-defined]
    rel = post_release(client, analyst["api_key"], ds["id"], FAST).json()
    from sqlalchemy import update

    from service.db.engine import get_sessionmaker
    from service.db.models import Release
    from service.jobs.runner import JobRunner

    factory = get_sessionmaker()
    runner = JobRunner(factory, workers=1, latency_buckets=(3600.0,))
    assert runner.claim_next() == rel["id"]
    runner.execute(rel["id"])
    with factory() as s:
        stored = s.get(Release, rel["id"])
        assert stored is not None
        assert stored.status == "done"
        real_finish, visible_at = stored.finished_at, stored.visible_at
    assert visible_at is not None
    seen = client.get(f"/v1/releases/{rel['id']}", headers=Api.auth(analyst["api_key"])).json()
    assert (seen["status"], seen["stage"], seen["finished_at"]) == ("running", "running", None)
    assert seen["result"] is None
    assert 0.0 <= seen["progress"] < 0.99
    cl_auth = Api.auth(cl["api_key"])
    problem(client.get(f"/v1/releases/{rel['id']}", headers=cl_auth), 404, "not-found")
    listed = client.get(f"/v1/datasets/{ds['id']}/releases", headers=cl_auth)
    assert listed.status_code == 200
    assert listed.json() == []
    with factory() as s:  # the bucket passes
        s.execute(update(Release).where(Release.id == rel["id"]).values(visible_at=1.0))
        s.commit()
    got = client.get(f"/v1/releases/{rel['id']}", headers=cl_auth).json()
    assert (got["status"], got["stage"], got["progress"]) == ("done", "done", 1.0)
    assert got["finished_at"] != real_finish
    assert [
        r["id"] for r in client.get(f"/v1/datasets/{ds['id']}/releases", headers=cl_auth).json()
    ] == [rel["id"]]


def test_an_identical_request_cannot_learn_of_a_failure_before_its_bucket(
    client: TestClient, rct: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a failed release waits for its padded completion time, an identical request is
    answered by it (running, no charge), exactly as by a release still running; once the
    failure is visible, an identical request is a new, charged release."""
    from sqlalchemy import update

    from service.db.engine import get_sessionmaker
    from service.db.models import Release
    from service.jobs.runner import JobRunner
    from service.releases.kinds import REGISTRY

    owner, analyst, ds = rct

    def explode(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise ValueError("a data-dependent failure")

    monkeypatch.setattr(type(REGISTRY["ate"]), "run", explode)
    client.app.state.runner.stop()  # type: ignore[attr-defined]
    first = post_release(client, analyst["api_key"], ds["id"], FAST)
    assert first.status_code == 202
    factory = get_sessionmaker()
    runner = JobRunner(factory, workers=1, latency_buckets=(3600.0,))
    assert runner.claim_next() == first.json()["id"]
    assert runner.execute(first.json()["id"]) == "failed"
    budget = f"/v1/datasets/{ds['id']}/budget"
    spent = client.get(budget, headers=Api.auth(owner["api_key"])).json()["epsilon_spent"]
    again = post_release(client, analyst["api_key"], ds["id"], FAST)
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert (again.json()["status"], again.json()["error"]) == ("running", None)
    assert client.get(budget, headers=Api.auth(owner["api_key"])).json()["epsilon_spent"] == spent
    with factory() as s:  # the bucket passes
        s.execute(update(Release).where(Release.id == first.json()["id"]).values(visible_at=1.0))
        s.commit()
    third = post_release(client, analyst["api_key"], ds["id"], FAST)
    assert third.status_code == 202
    assert third.json()["id"] != first.json()["id"]


def test_quote_costs_nothing(client: TestClient, rct: Any) -> None:
    owner, analyst, ds = rct
    r = client.post(
        f"/v1/datasets/{ds['id']}/quotes",
        json={"kind": "ate", "params": FAST},
        headers=Api.auth(analyst["api_key"]),
    )
    assert r.status_code == 200, r.text
    q = r.json()
    assert q["epsilon"] == pytest.approx(1.0)
    assert q["fits_budget"] is True
    assert q["guarantee"] == "strict"
    assert q["accuracy"]
    budget = client.get(
        f"/v1/datasets/{ds['id']}/budget", headers=Api.auth(owner["api_key"])
    ).json()
    assert budget["epsilon_spent"] == 0


def test_release_on_deleted_rows_fails_but_keeps_charge(client: TestClient, rct: Any) -> None:
    owner, analyst, ds = rct
    client.app.state.runner.stop()  # type: ignore[attr-defined]
    rel = post_release(client, analyst["api_key"], ds["id"], FAST).json()
    assert (
        client.delete(
            f"/v1/datasets/{ds['id']}/rows", headers=Api.auth(owner["api_key"])
        ).status_code
        == 204
    )
    from service.db.engine import get_sessionmaker
    from service.jobs.runner import JobRunner

    runner = JobRunner(get_sessionmaker(), workers=1, latency_buckets=(0.01,))
    assert runner.claim_next() == rel["id"]
    runner.execute(rel["id"])
    done = wait(client, analyst["api_key"], rel["id"])
    assert done["status"] == "failed"
    assert done["result"] is None
    assert done["error"]["type"].endswith("/release-failed")
    budget = client.get(
        f"/v1/datasets/{ds['id']}/budget", headers=Api.auth(owner["api_key"])
    ).json()
    assert budget["epsilon_spent"] == pytest.approx(1.0)
    problem(
        post_release(client, analyst["api_key"], ds["id"], FAST, fresh=True),
        409,
        "dataset-unavailable",
    )


def test_any_failure_after_the_charge_is_one_generic_error(
    client: TestClient, rct: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data-dependent failure (here: an exception quoting a value) looks like any other."""
    from service.releases.kinds import REGISTRY

    owner, analyst, ds = rct
    kind = REGISTRY["ate"]

    def explode(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise ValueError("patient P000017 has outcome 4.2137; singular matrix")

    monkeypatch.setattr(type(kind), "run", explode)
    rel = post_release(client, analyst["api_key"], ds["id"], FAST).json()
    done = wait(client, analyst["api_key"], rel["id"])
    assert done["status"] == "failed"
    assert done["error"] == {
        "type": "https://dp-curator.dev/problems/release-failed",
        "title": "The release failed; its charge is kept",
        "detail": "the release failed after its charge; the charge is kept",
    }
    listing = client.get(f"/v1/datasets/{ds['id']}/releases", headers=Api.auth(owner["api_key"]))
    assert "4.2137" not in listing.text
    assert "P000017" not in listing.text
    assert "singular" not in listing.text
