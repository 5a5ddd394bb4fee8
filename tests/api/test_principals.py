"""Key lifecycle: the admin disables and enables a principal, and a key is replaced by the admin
or by its principal; the old key stops working at once, everywhere (the API and the function
evaluation path, which resolves keys on its own)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.api.test_datasets import problem
from tests.api.test_functions import FAST, evaluate, release, setup  # noqa: F401 (fixture)
from tests.conftest import ADMIN_KEY, Api


def _me(client: TestClient, key: str) -> Any:
    return client.get("/v1/principals/me", headers=Api.auth(key))


def test_the_configured_admin_reads_itself_with_null_key_fields(client: TestClient) -> None:
    """The admin's key comes from the deployment and is not stored: no prefix, no creation
    time (null, not an empty string a client would show or parse as a time)."""
    body = _me(client, ADMIN_KEY).json()
    assert body == {
        "id": "admin",
        "name": "admin",
        "role": "admin",
        "key_prefix": None,
        "created_at": None,
        "disabled": False,
    }


def test_admin_disables_and_enables_a_principal(client: TestClient, api: Api) -> None:
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"])
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    assert _me(client, analyst["api_key"]).status_code == 200

    r = client.patch(
        f"/v1/principals/{analyst['id']}", json={"disabled": True}, headers=Api.auth(ADMIN_KEY)
    )
    assert r.status_code == 200, r.text
    assert r.json()["disabled"] is True
    problem(_me(client, analyst["api_key"]), 401, "unauthenticated")
    problem(
        client.get(f"/v1/datasets/{ds['id']}", headers=Api.auth(analyst["api_key"])),
        401,
        "unauthenticated",
    )
    listed = client.get("/v1/principals", headers=Api.auth(ADMIN_KEY)).json()
    assert {p["id"]: p["disabled"] for p in listed}[analyst["id"]] is True

    r = client.patch(
        f"/v1/principals/{analyst['id']}", json={"disabled": False}, headers=Api.auth(ADMIN_KEY)
    )
    assert r.status_code == 200
    assert r.json()["disabled"] is False
    # Enabled again: the same key, and the grant survived.
    assert client.get(f"/v1/datasets/{ds['id']}", headers=Api.auth(analyst["api_key"])).is_success


def test_only_the_admin_disables(client: TestClient, api: Api) -> None:
    owner, analyst = api.principal("owner"), api.principal("analyst")
    for key in (owner["api_key"], analyst["api_key"]):
        r = client.patch(
            f"/v1/principals/{analyst['id']}", json={"disabled": True}, headers=Api.auth(key)
        )
        problem(r, 403, "forbidden")
    assert _me(client, analyst["api_key"]).status_code == 200
    problem(
        client.patch("/v1/principals/nope", json={"disabled": True}, headers=Api.auth(ADMIN_KEY)),
        404,
        "not-found",
    )
    problem(
        client.patch(
            f"/v1/principals/{analyst['id']}", json={"disabled": "yes"}, headers=Api.auth(ADMIN_KEY)
        ),
        422,
        "validation-failed",
    )


def test_a_principal_replaces_its_own_key(client: TestClient, api: Api) -> None:
    analyst = api.principal("analyst")
    old = analyst["api_key"]
    r = client.post("/v1/principals/me/key", headers=Api.auth(old))
    assert r.status_code == 200, r.text
    body = r.json()
    new = body["api_key"]
    assert new != old
    assert new.startswith("dpc_")
    assert body["id"] == analyst["id"]
    assert body["key_prefix"] == new[:8]
    problem(_me(client, old), 401, "unauthenticated")
    me = _me(client, new)
    assert me.status_code == 200
    assert me.json()["key_prefix"] == new[:8]
    assert "api_key" not in me.json()


def test_the_admin_replaces_any_key_and_others_cannot(client: TestClient, api: Api) -> None:
    analyst, other = api.principal("analyst"), api.principal("analyst")
    owner = api.principal("owner")
    for key in (other["api_key"], owner["api_key"]):
        r = client.post(f"/v1/principals/{analyst['id']}/key", headers=Api.auth(key))
        problem(r, 403, "forbidden")
    assert _me(client, analyst["api_key"]).status_code == 200

    r = client.post(f"/v1/principals/{analyst['id']}/key", headers=Api.auth(ADMIN_KEY))
    assert r.status_code == 200, r.text
    problem(_me(client, analyst["api_key"]), 401, "unauthenticated")
    assert _me(client, r.json()["api_key"]).status_code == 200
    problem(
        client.post("/v1/principals/me/key", headers=Api.auth(ADMIN_KEY)), 422, "validation-failed"
    )
    problem(client.post("/v1/principals/nope/key", headers=Api.auth(ADMIN_KEY)), 404, "not-found")


def test_the_shown_key_prefix_is_short(api: Api) -> None:
    created = api.principal("client")
    assert created["key_prefix"] == created["api_key"][:8]
    assert created["key_prefix"].startswith("dpc_")


def test_function_evaluation_refuses_a_disabled_or_replaced_key(
    client: TestClient,
    setup: dict[str, Any],  # noqa: F811 (the fixture)
) -> None:
    fid = release(client, setup, FAST)["id"]
    reader, point = setup["client"], [[40.0, 0.5, 1.0]]
    assert evaluate(client, reader["api_key"], fid, point).status_code == 200
    admin = Api.auth(ADMIN_KEY)
    client.patch(f"/v1/principals/{reader['id']}", json={"disabled": True}, headers=admin)
    problem(evaluate(client, reader["api_key"], fid, point), 401, "unauthenticated")
    client.patch(f"/v1/principals/{reader['id']}", json={"disabled": False}, headers=admin)
    assert evaluate(client, reader["api_key"], fid, point).status_code == 200
    new = client.post("/v1/principals/me/key", headers=Api.auth(reader["api_key"])).json()
    problem(evaluate(client, reader["api_key"], fid, point), 401, "unauthenticated")
    assert evaluate(client, new["api_key"], fid, point).status_code == 200


def test_an_owner_lists_analysts_clients_and_itself_only(client: TestClient, api: Api) -> None:
    owner, other = api.principal("owner"), api.principal("owner")
    analyst, reader = api.principal("analyst"), api.principal("client")
    seen = client.get("/v1/principals", headers=Api.auth(owner["api_key"]))
    assert seen.status_code == 200
    ids = {p["id"] for p in seen.json()}
    assert {owner["id"], analyst["id"], reader["id"]} <= ids
    assert other["id"] not in ids
    assert {p["role"] for p in seen.json() if p["id"] != owner["id"]} <= {"analyst", "client"}
    assert seen.headers["X-Total-Count"] == str(len(ids))
    every = client.get("/v1/principals", headers=Api.auth(ADMIN_KEY)).json()
    assert other["id"] in {p["id"] for p in every}
    problem(client.get("/v1/principals", headers=Api.auth(analyst["api_key"])), 403, "forbidden")


def test_the_admin_role_is_not_offered_and_cannot_be_created(client: TestClient) -> None:
    """PrincipalCreate.role listed 'admin' in the OpenAPI, and a request for it was refused
    (an HTTP consumer's walkthrough): the schema offers the three creatable roles only, and
    the refusal still says why."""
    from service.openapi import document

    created = document()["components"]["schemas"]["PrincipalCreate"]["properties"]["role"]
    assert set(created["enum"]) == {"owner", "analyst", "client"}
    r = client.post(
        "/v1/principals", json={"name": "root", "role": "admin"}, headers=Api.auth(ADMIN_KEY)
    )
    body = problem(r, 422, "validation-failed")
    assert body["errors"][0]["pointer"] == "#/role"
    assert "configured by CURATOR_ADMIN_KEY" in body["detail"]
