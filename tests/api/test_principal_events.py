"""A principal's account events: creation, disable, enable and key replacement are recorded with
who made them, in an append-only hash chain that ``…/events/verify`` recomputes; the admin reads
anyone's, a principal only its own."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import delete, update

from service.auth import events
from service.auth.service import KEY_PREFIX_SHOWN
from service.db.engine import get_sessionmaker
from service.db.models import Principal, PrincipalEvent
from tests.api.test_datasets import problem
from tests.conftest import ADMIN_KEY, Api


def _events(client: TestClient, key: str, pid: str, **params: Any) -> Any:
    r = client.get(f"/v1/principals/{pid}/events", headers=Api.auth(key), params=params)
    assert r.status_code == 200, r.text
    return r.json()


def _verify(client: TestClient, key: str, pid: str) -> Any:
    r = client.get(f"/v1/principals/{pid}/events/verify", headers=Api.auth(key))
    assert r.status_code == 200, r.text
    return r.json()


def _disable(client: TestClient, pid: str, disabled: bool) -> None:
    r = client.patch(
        f"/v1/principals/{pid}", json={"disabled": disabled}, headers=Api.auth(ADMIN_KEY)
    )
    assert r.status_code == 200, r.text


def test_each_account_change_is_recorded_with_its_actor(client: TestClient, api: Api) -> None:
    analyst = api.principal("analyst")
    pid = analyst["id"]
    _disable(client, pid, True)
    _disable(client, pid, True)  # no change: no event
    _disable(client, pid, False)
    by_admin = client.post(f"/v1/principals/{pid}/key", headers=Api.auth(ADMIN_KEY)).json()
    by_self = client.post("/v1/principals/me/key", headers=Api.auth(by_admin["api_key"])).json()

    page = _events(client, ADMIN_KEY, pid)
    assert page["principal_id"] == pid
    assert page["total"] == 5
    got = [(e["seq"], e["event"], e["actor_id"]) for e in page["events"]]
    assert got == [
        (1, "created", "admin"),
        (2, "disabled", "admin"),
        (3, "enabled", "admin"),
        (4, "key_replaced", "admin"),
        (5, "key_replaced", pid),
    ]
    # the creation is dated as the principal is
    listed = client.get("/v1/principals", headers=Api.auth(ADMIN_KEY)).json()
    created_at = next(p["created_at"] for p in listed if p["id"] == pid)
    assert page["events"][0]["created_at"] == created_at
    prefixes = [e["key_prefix"] for e in page["events"]]
    assert events.KEY_PREFIX_SHOWN == KEY_PREFIX_SHOWN  # the record hashes what a listing shows
    assert prefixes[0] == analyst["api_key"][:8]
    assert prefixes[3] == by_admin["api_key"][:8]
    assert prefixes[4] == by_self["api_key"][:8] == by_self["key_prefix"]
    # chained: each event's prev_hash is the one before's row_hash
    rows = page["events"]
    assert all(b["prev_hash"] == a["row_hash"] for a, b in zip(rows, rows[1:], strict=False))
    # neither the key nor its digest is in the record
    text = str(page)
    for key in (analyst["api_key"], by_admin["api_key"], by_self["api_key"]):
        assert key not in text

    verified = _verify(client, ADMIN_KEY, pid)
    assert verified == {
        "valid": True,
        "entries": 5,
        "head_hash": rows[-1]["row_hash"],
        "first_invalid_seq": None,
        "reason": None,
    }
    # the principal reads its own, with 'me' or its id, and pages through them
    own = _events(client, by_self["api_key"], "me", limit=2, offset=3)
    assert [e["seq"] for e in own["events"]] == [4, 5]
    assert (own["total"], own["limit"], own["offset"]) == (5, 2, 3)
    assert _verify(client, by_self["api_key"], pid)["valid"] is True


def test_only_the_admin_or_the_principal_reads_the_events(client: TestClient, api: Api) -> None:
    owner, analyst = api.principal("owner"), api.principal("analyst")
    for path in ("events", "events/verify"):
        problem(
            client.get(
                f"/v1/principals/{analyst['id']}/{path}", headers=Api.auth(owner["api_key"])
            ),
            403,
            "forbidden",
        )
        problem(
            client.get(f"/v1/principals/nope/{path}", headers=Api.auth(ADMIN_KEY)), 404, "not-found"
        )
        problem(
            client.get(f"/v1/principals/me/{path}", headers=Api.auth(ADMIN_KEY)),
            422,
            "validation-failed",
        )
        problem(client.get(f"/v1/principals/me/{path}"), 401, "unauthenticated")
    # a disabled principal cannot read them either (its key is refused)
    _disable(client, analyst["id"], True)
    problem(
        client.get("/v1/principals/me/events", headers=Api.auth(analyst["api_key"])),
        401,
        "unauthenticated",
    )


def _tamper(statement: Any) -> None:
    with get_sessionmaker()() as s:
        s.execute(statement)
        s.commit()


def test_verify_finds_an_altered_or_removed_event(client: TestClient, api: Api) -> None:
    pid = api.principal("analyst")["id"]
    _disable(client, pid, True)
    _disable(client, pid, False)
    assert _verify(client, ADMIN_KEY, pid)["valid"] is True
    second = (PrincipalEvent.principal_id == pid, PrincipalEvent.seq == 2)

    _tamper(update(PrincipalEvent).where(*second).values(actor_id="someone-else"))
    bad = _verify(client, ADMIN_KEY, pid)
    assert (bad["valid"], bad["first_invalid_seq"]) == (False, 2)
    assert "altered" in bad["reason"]

    # restored, then the last event dropped: the head on the principal row shows it
    _tamper(update(PrincipalEvent).where(*second).values(actor_id="admin"))
    assert _verify(client, ADMIN_KEY, pid)["valid"] is True
    _tamper(
        delete(PrincipalEvent).where(PrincipalEvent.principal_id == pid, PrincipalEvent.seq == 3)
    )
    bad = _verify(client, ADMIN_KEY, pid)
    assert (bad["valid"], bad["first_invalid_seq"], bad["entries"]) == (False, 3, 2)
    assert "removed" in bad["reason"]
    # and so does moving the head back with it (the dropped event's hash is not the head)
    _tamper(update(Principal).where(Principal.id == pid).values(event_count=2))
    assert _verify(client, ADMIN_KEY, pid)["valid"] is False


def test_verify_replays_the_record_against_the_principal_row(client: TestClient, api: Api) -> None:
    """A row changed without its event, or a chain cut back or emptied together with its head,
    no longer matches the state the record replays to."""
    pid = api.principal("analyst")["id"]
    _disable(client, pid, True)
    client.post(f"/v1/principals/{pid}/key", headers=Api.auth(ADMIN_KEY))
    assert _verify(client, ADMIN_KEY, pid)["valid"] is True
    this = Principal.id == pid

    # re-enabled in the database, not through the service (no 'enabled' event)
    _tamper(update(Principal).where(this).values(disabled=False))
    bad = _verify(client, ADMIN_KEY, pid)
    assert (bad["valid"], bad["first_invalid_seq"]) == (False, None)
    assert "disabled flag" in bad["reason"]
    _tamper(update(Principal).where(this).values(disabled=True))
    assert _verify(client, ADMIN_KEY, pid)["valid"] is True

    # a key swapped in the database: the shown prefix is not the last recorded one
    with get_sessionmaker()() as s:
        original = s.get(Principal, pid).key_prefix  # type: ignore[union-attr]
    _tamper(update(Principal).where(this).values(key_prefix="dpc_XXXX"))
    bad = _verify(client, ADMIN_KEY, pid)
    assert (bad["valid"], "key" in bad["reason"]) == (False, True)
    _tamper(update(Principal).where(this).values(key_prefix=original))
    assert _verify(client, ADMIN_KEY, pid)["valid"] is True

    # the key replacement dropped and the head moved back to the event before it: the
    # replayed key is the creation's, not the row's
    with get_sessionmaker()() as s:
        second = s.query(PrincipalEvent).filter_by(principal_id=pid, seq=2).one()
    _tamper(
        delete(PrincipalEvent).where(PrincipalEvent.principal_id == pid, PrincipalEvent.seq == 3)
    )
    _tamper(update(Principal).where(this).values(event_count=2, last_event_hash=second.row_hash))
    bad = _verify(client, ADMIN_KEY, pid)
    assert (bad["valid"], bad["entries"]) == (False, 2)
    assert "key" in bad["reason"]

    # the whole record and its head removed
    _tamper(delete(PrincipalEvent).where(PrincipalEvent.principal_id == pid))
    _tamper(update(Principal).where(this).values(event_count=0, last_event_hash=None))
    bad = _verify(client, ADMIN_KEY, pid)
    assert (bad["valid"], bad["entries"], bad["first_invalid_seq"]) == (False, 0, 1)
    assert "creation" in bad["reason"]


def test_verify_finds_a_second_creation_and_a_key_changed_outside_a_replacement(
    client: TestClient, api: Api
) -> None:
    """Events whose hashes are recomputed (a writer who knows the scheme) still have to tell a
    consistent story: one creation, first; a new key only in a key replacement."""
    pid = api.principal("analyst")["id"]
    _disable(client, pid, True)
    _disable(client, pid, False)

    def rechain(change: dict[int, dict[str, Any]]) -> None:
        with get_sessionmaker()() as s:
            rows = s.query(PrincipalEvent).filter_by(principal_id=pid).order_by("seq").all()
            prev = events.genesis_hash(pid)
            for row in rows:
                for k, v in change.get(row.seq, {}).items():
                    setattr(row, k, v)
                row.prev_hash = prev
                row.row_hash = prev = events.row_hash(
                    prev, {k: getattr(row, k) for k in events.HASHED_FIELDS}
                )
            s.get(Principal, pid).last_event_hash = prev  # type: ignore[union-attr]
            s.commit()

    rechain({})
    assert _verify(client, ADMIN_KEY, pid)["valid"] is True
    rechain({2: {"event": "created"}, 3: {"event": "created"}})
    bad = _verify(client, ADMIN_KEY, pid)
    assert (bad["valid"], bad["first_invalid_seq"]) == (False, 2)
    assert "creation" in bad["reason"]
    rechain({2: {"event": "disabled"}, 3: {"event": "enabled", "key_prefix": "dpc_XXXX"}})
    bad = _verify(client, ADMIN_KEY, pid)
    assert (bad["valid"], bad["first_invalid_seq"]) == (False, 3)
    assert "key replacement" in bad["reason"]
