"""Listings page: ``limit``/``offset`` (and ``order`` for releases), with the total in
``X-Total-Count``; without ``limit`` the whole list, as before."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.api.test_datasets import problem
from tests.api.test_releases import post_release, wait
from tests.conftest import ADMIN_KEY, RCT_SCHEMA, Api


def _ids(r: Any) -> list[str]:
    assert r.status_code == 200, r.text
    return [item["id"] for item in r.json()]


def test_release_listing_pages_in_both_orders(client: TestClient, api: Api) -> None:
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"], schema=RCT_SCHEMA)
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    made = []
    for eps in (0.1, 0.2, 0.3):
        r = post_release(client, analyst["api_key"], ds["id"], {"epsilon": eps, "nuisance": "none"})
        assert r.status_code == 202, r.text
        made.append(r.json()["id"])
    for rid in made:
        wait(client, analyst["api_key"], rid)
    url, key = f"/v1/datasets/{ds['id']}/releases", Api.auth(analyst["api_key"])
    whole = client.get(url, headers=key)
    assert _ids(whole) == made
    assert whole.headers["X-Total-Count"] == "3"
    page = client.get(url, params={"limit": 2}, headers=key)
    assert _ids(page) == made[:2]
    assert page.headers["X-Total-Count"] == "3"
    assert _ids(client.get(url, params={"limit": 2, "offset": 2}, headers=key)) == made[2:]
    assert _ids(client.get(url, params={"offset": 3}, headers=key)) == []
    newest = client.get(url, params={"order": "desc", "limit": 2}, headers=key)
    assert _ids(newest) == made[::-1][:2]
    for bad in (
        {"limit": 0},
        {"limit": 1001},
        {"offset": -1},
        {"offset": 2**31},
        {"offset": 10**20},  # beyond every backend's integer: a 422, not a driver error
        {"order": "up"},
    ):
        problem(client.get(url, params=bad, headers=key), 422, "validation-failed")


def test_a_client_counts_only_what_it_may_list(client: TestClient, api: Api) -> None:
    """A client lists finished releases only (the total too); the analyst sees both."""
    owner, analyst = api.principal("owner"), api.principal("analyst")
    reader = api.principal("client")
    ds = api.dataset(owner["api_key"], schema=RCT_SCHEMA)
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    api.grant(owner["api_key"], ds["id"], reader["id"])
    params = {"epsilon": 0.1, "nuisance": "none"}
    done = post_release(client, analyst["api_key"], ds["id"], params).json()["id"]
    wait(client, analyst["api_key"], done)
    client.app.state.runner.stop()  # type: ignore[attr-defined]
    queued = post_release(client, analyst["api_key"], ds["id"], {**params, "epsilon": 0.2})
    assert queued.status_code == 202, queued.text
    url = f"/v1/datasets/{ds['id']}/releases"
    listed = client.get(url, headers=Api.auth(reader["api_key"]))
    assert _ids(listed) == [done]
    assert listed.headers["X-Total-Count"] == "1"
    seen = client.get(url, params={"order": "desc"}, headers=Api.auth(analyst["api_key"]))
    assert _ids(seen) == [queued.json()["id"], done]
    assert seen.headers["X-Total-Count"] == "2"


def test_principal_listing_pages(client: TestClient, api: Api) -> None:
    for role in ("owner", "analyst", "client"):
        api.principal(role)
    admin = Api.auth(ADMIN_KEY)
    whole = client.get("/v1/principals", headers=admin)
    total = int(whole.headers["X-Total-Count"])
    assert total == len(whole.json()) >= 3
    page = client.get("/v1/principals", params={"limit": 2, "offset": 1}, headers=admin)
    assert _ids(page) == _ids(whole)[1:3]
    assert page.headers["X-Total-Count"] == str(total)
    for bad in ({"limit": 0}, {"offset": 10**20}):
        problem(client.get("/v1/principals", params=bad, headers=admin), 422, "validation-failed")
