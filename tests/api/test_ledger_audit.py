"""The owner's ledger audit view (filters, pagination, release kind and status, CSV) and who
may read grants: what the owner console calls."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.test_datasets import problem
from tests.api.test_releases import FAST, post_release, wait
from tests.conftest import RCT_SCHEMA, Api


@pytest.fixture
def audited(api: Api, client: TestClient) -> dict[str, Any]:
    """An RCT dataset with two analysts: one done charge each, plus budget and grant entries."""
    owner, a1, a2 = api.principal("owner"), api.principal("analyst"), api.principal("analyst")
    ds = api.dataset(owner["api_key"], n=600, schema=RCT_SCHEMA, epsilon_total=5.0)
    api.grant(owner["api_key"], ds["id"], a1["id"], epsilon_cap=2.0)
    api.grant(owner["api_key"], ds["id"], a2["id"])
    releases = []
    for analyst in (a1, a2):
        r = post_release(client, analyst["api_key"], ds["id"], FAST)
        assert r.status_code == 202, r.text
        releases.append(wait(client, analyst["api_key"], r.json()["id"]))
    return {"owner": owner, "a1": a1, "a2": a2, "ds": ds, "releases": releases}


def _ledger(client: TestClient, key: str, dataset_id: str, **params: Any) -> Any:
    return client.get(f"/v1/datasets/{dataset_id}/ledger", params=params, headers=Api.auth(key))


def test_ledger_filters_and_pages(client: TestClient, audited: dict[str, Any]) -> None:
    key, ds = audited["owner"]["api_key"], audited["ds"]["id"]
    everything = _ledger(client, key, ds).json()
    # create, budget, grant, grant, charge, charge: all of it without a limit, as before.
    assert everything["total"] == 6
    assert everything["limit"] is None
    assert [e["entry_type"] for e in everything["entries"]] == [
        "create", "budget", "grant", "grant", "charge", "charge"
    ]  # fmt: skip
    charges = _ledger(client, key, ds, entry_type="charge").json()
    assert charges["total"] == 2
    assert {e["release_id"] for e in charges["entries"]} == {r["id"] for r in audited["releases"]}
    assert {e["release_kind"] for e in charges["entries"]} == {"ate"}
    assert {e["release_status"] for e in charges["entries"]} == {"done"}
    assert all(len(e["request_hash"]) == 64 for e in charges["entries"])
    mine = _ledger(client, key, ds, principal_id=audited["a1"]["id"]).json()
    assert [e["principal_id"] for e in mine["entries"]] == [audited["a1"]["id"]]
    assert _ledger(client, key, ds, status="failed").json()["total"] == 0
    assert _ledger(client, key, ds, release_kind="ate", guarantee="strict").json()["total"] == 2
    assert _ledger(client, key, ds, guarantee="paper").json()["total"] == 0
    # Pages: newest first, two at a time; the total counts every match.
    first = _ledger(client, key, ds, order="desc", limit=2).json()
    second = _ledger(client, key, ds, order="desc", limit=2, offset=2).json()
    assert (first["total"], first["limit"], second["offset"]) == (6, 2, 2)
    assert [e["seq"] for e in first["entries"] + second["entries"]] == [6, 5, 4, 3]
    assert _ledger(client, key, ds, limit=2, offset=10).json()["entries"] == []


def test_ledger_csv_follows_the_filters(client: TestClient, audited: dict[str, Any]) -> None:
    key, ds = audited["owner"]["api_key"], audited["ds"]["id"]
    r = _ledger(client, key, ds, format="csv", entry_type="charge")
    assert r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == 2
    assert {row["release_status"] for row in rows} == {"done"}
    assert {row["release_kind"] for row in rows} == {"ate"}
    assert r.text.splitlines()[0].startswith("seq,entry_type,created_at")


def test_ledger_query_is_validated(client: TestClient, audited: dict[str, Any]) -> None:
    key, ds = audited["owner"]["api_key"], audited["ds"]["id"]
    for bad in ({"limit": 0}, {"limit": 5000}, {"offset": -1}, {"entry_type": "refund"},
                {"status": "lost"}, {"order": "sideways"}):  # fmt: skip
        problem(_ledger(client, key, ds, **bad), 422, "validation-failed")
    # Still the owner's view only.
    problem(_ledger(client, audited["a1"]["api_key"], ds), 403, "forbidden")


def test_grantees_read_only_their_own_grant(
    api: Api, client: TestClient, audited: dict[str, Any]
) -> None:
    ds = audited["ds"]["id"]
    path = f"/v1/datasets/{ds}/grants"
    everyone = client.get(path, headers=Api.auth(audited["owner"]["api_key"])).json()
    assert {g["principal_id"] for g in everyone} == {audited["a1"]["id"], audited["a2"]["id"]}
    own = client.get(path, headers=Api.auth(audited["a1"]["api_key"])).json()
    assert [g["principal_id"] for g in own] == [audited["a1"]["id"]]
    assert own[0]["epsilon_cap"] == pytest.approx(2.0)
    assert own[0]["epsilon_spent"] == pytest.approx(1.0)
    # A client with a grant sees its own; a stranger cannot tell the dataset exists.
    reader = api.principal("client")
    api.grant(audited["owner"]["api_key"], ds, reader["id"])
    theirs = client.get(path, headers=Api.auth(reader["api_key"])).json()
    assert [g["principal_id"] for g in theirs] == [reader["id"]]
    stranger = api.principal("analyst")
    problem(client.get(path, headers=Api.auth(stranger["api_key"])), 404, "not-found")
    other_owner = api.principal("owner")
    problem(client.get(path, headers=Api.auth(other_owner["api_key"])), 404, "not-found")
    # Revoked: the grant (and the dataset) disappear for the former grantee.
    client.delete(f"{path}/{audited['a2']['id']}", headers=Api.auth(audited["owner"]["api_key"]))
    problem(client.get(path, headers=Api.auth(audited["a2"]["api_key"])), 404, "not-found")


def test_paper_mode_changes_are_ledgered_and_a_paper_charge_needs_them(
    client: TestClient, api: Api
) -> None:
    """A security audit turned paper mode on in the database for one paper release and off
    again: no check saw it (the setting was not in the ledger). Its changes are settings
    entries now, and a paper-mode charge must find it on in the replay."""
    from sqlalchemy import update

    from service.db.engine import get_sessionmaker
    from service.db.models import Dataset

    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"], n=600, epsilon_total=5.0)
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    oh = Api.auth(owner["api_key"])
    paper = {"epsilon": 0.5, "mode": "paper", "nuisance": "linear"}

    def set_paper(on: bool) -> None:
        r = client.patch(f"/v1/datasets/{ds['id']}", json={"allow_paper_mode": on}, headers=oh)
        assert r.status_code == 200, r.text

    def verify() -> Any:
        return client.get(f"/v1/datasets/{ds['id']}/ledger/verify", headers=oh).json()

    set_paper(True)
    r = post_release(client, analyst["api_key"], ds["id"], paper)
    assert r.status_code == 202, r.text
    wait(client, analyst["api_key"], r.json()["id"])
    set_paper(False)
    set_paper(False)  # no change, no entry
    entries = _ledger(client, owner["api_key"], ds["id"], entry_type="settings").json()
    assert [e["details_json"] for e in entries["entries"]] == [
        '{"allow_paper_mode":true}',
        '{"allow_paper_mode":false}',
    ]
    assert verify()["valid"] is True

    def flip(on: bool) -> None:
        with get_sessionmaker()() as s:
            s.execute(update(Dataset).where(Dataset.id == ds["id"]).values(allow_paper_mode=on))
            s.commit()

    flip(True)  # the insider's switch, not ledgered
    assert "paper-mode setting differs" in verify()["reason"]
    r = post_release(client, analyst["api_key"], ds["id"], {**paper, "epsilon": 0.6})
    assert r.status_code == 202, r.text
    wait(client, analyst["api_key"], r.json()["id"])
    flip(False)
    checked = verify()
    assert checked["valid"] is False
    assert "a paper-mode charge while the ledger has paper mode off" in checked["reason"]
