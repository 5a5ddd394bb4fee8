"""Verifying a ledger outside the server (``dpcurator.chain``): the client recomputes the chain
from the exported entries with the published rule, and a checkpoint the owner keeps catches
what no recomputation can, a chain rewritten whole by someone who can write the database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy import select

from dpcurator import CuratorClient
from dpcurator.chain import Checkpoint, hashed_fields, new_checkpoint, row_hash, verify_entries
from dpcurator.cli import cli
from service.db.engine import get_sessionmaker
from service.db.models import Budget, Grant, LedgerEntry, Principal
from service.ledger import chain
from tests.api.test_releases import post_release, wait
from tests.conftest import Api


def _setup(api: Api, client: TestClient) -> tuple[str, str, CuratorClient]:
    owner, analyst = api.principal("owner"), api.principal("analyst")
    ds = api.dataset(owner["api_key"], n=600)
    api.grant(owner["api_key"], ds["id"], analyst["id"])
    for epsilon in (0.1, 0.2):
        r = post_release(client, analyst["api_key"], ds["id"], {"epsilon": epsilon})
        assert r.status_code == 202, r.text
        wait(client, analyst["api_key"], r.json()["id"])
    curator = CuratorClient("http://testserver", owner["api_key"], transport=client._transport)
    return ds["id"], owner["api_key"], curator


def _rewrite_whole_chain(dataset_id: str, seq: int, **change: Any) -> None:
    """What a database writer can do: change an entry, then recompute every hash after it and
    the head, so that the chain is consistent again."""
    with get_sessionmaker()() as s:
        rows = list(
            s.execute(
                select(LedgerEntry).where(LedgerEntry.dataset_id == dataset_id).order_by("seq")
            ).scalars()
        )
        prev = chain.genesis_hash(dataset_id)
        for row in rows:
            if row.seq == seq:
                for k, v in change.items():
                    if k == "details_extra":  # keep the record (its cost is checked), add to it
                        row.details_json = json.dumps(
                            {**json.loads(row.details_json or "{}"), **v},
                            sort_keys=True,
                            separators=(",", ":"),
                        )
                    else:
                        setattr(row, k, v)
            row.prev_hash = prev
            row.row_hash = prev = chain.row_hash(
                prev, {k: getattr(row, k) for k in chain.HASHED_FIELDS}
            )
        budget = s.get(Budget, dataset_id)
        assert budget is not None
        budget.last_hash = prev
        s.commit()


def _verify_with_cli(client: TestClient, key: str, dataset_id: str, *args: str) -> Any:
    """``dpcurator ledger verify DATASET_ID *args`` against the test app."""
    import dpcurator.cli.app as app

    original = app.CuratorClient
    app.CuratorClient = lambda *a, **k: CuratorClient(  # type: ignore[misc, assignment]
        *a, **{**k, "transport": client._transport}
    )
    try:
        return CliRunner().invoke(
            cli,
            ["ledger", "verify", dataset_id, *args],
            env={"CURATOR_URL": "http://testserver", "CURATOR_KEY": key},
            catch_exceptions=False,
        )
    finally:
        app.CuratorClient = original  # type: ignore[misc]


def test_local_verification_matches_the_server_and_a_checkpoint_catches_a_rewrite(
    api: Api, client: TestClient
) -> None:
    dataset_id, _, curator = _setup(api, client)
    server = curator.verify_ledger(dataset_id)
    here = curator.verify_ledger_locally(dataset_id)
    assert here.valid, here
    assert (here.entries, here.head_hash) == (server.entries, server.head_hash)
    assert here.entries == 5  # create, budget, grant, two charges
    saved = new_checkpoint(dataset_id, here)

    # an entry altered in place: the server and the client both see it
    entries = curator.ledger(dataset_id)
    altered = [
        e.model_copy(update={"details_json": '{"x":1}'}) if e.seq == 4 else e for e in entries
    ]
    v = verify_entries(dataset_id, altered)
    assert (v.valid, v.first_invalid_seq) == (False, 4)
    # a spend that is not the charges' sum
    v = verify_entries(dataset_id, entries, epsilon_spent=0.05)
    assert (v.valid, "spend" in (v.reason or "")) == (False, True)

    # the whole chain rewritten after entry 4's details changed: consistent again, so only
    # the checkpoint shows it
    _rewrite_whole_chain(dataset_id, 4, details_extra={"rewritten": True})
    assert curator.verify_ledger(dataset_id).valid
    assert curator.verify_ledger_locally(dataset_id).valid
    caught = curator.verify_ledger_locally(dataset_id, checkpoint=saved)
    assert (caught.valid, caught.first_invalid_seq) == (False, 5)
    assert "rewritten" in (caught.reason or "")
    # and a ledger cut back below the checkpoint
    short = verify_entries(dataset_id, curator.ledger(dataset_id)[:3], checkpoint=saved)
    assert (short.valid, "removed" in (short.reason or "")) == (False, True)


def test_the_cli_keeps_a_checkpoint_file(api: Api, client: TestClient, tmp_path: Path) -> None:
    dataset_id, key, curator = _setup(api, client)
    file = tmp_path / "ledger-checkpoint.json"

    def run(*args: str, code: int = 0) -> Any:
        result = _verify_with_cli(client, key, dataset_id, *args)
        assert result.exit_code == code, (result.stdout, result.stderr)
        return result

    assert "valid: 5 entries" in run("--local").stdout
    first = run("--checkpoint", str(file))
    assert "saved to" in first.stderr
    saved = Checkpoint.load(file)
    assert saved is not None
    assert (saved.dataset_id, saved.seq) == (dataset_id, 5)
    assert json.loads(file.read_text())["row_hash"] == curator.verify_ledger(dataset_id).head_hash
    again = run("--checkpoint", str(file))
    assert "entry 5 unchanged" in again.stderr
    _rewrite_whole_chain(dataset_id, 4, details_extra={"rewritten": True})
    broken = run("--checkpoint", str(file), code=1)
    assert "INVALID at seq 5" in broken.stdout
    assert Checkpoint.load(file) == saved  # a failed check does not move the checkpoint
    bad = tmp_path / "not-a-checkpoint.json"
    bad.write_text("[1, 2]")
    refused = run("--checkpoint", str(bad), code=1)
    assert "not a usable checkpoint file" in refused.stderr
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"dataset_id": "x" * 32, "seq": 1, "row_hash": "0" * 64}))
    assert "checkpoint, not" in run("--checkpoint", str(other), code=1).stderr


def test_a_total_raised_in_the_budget_row_fails_both_checks(api: Api, client: TestClient) -> None:
    """An auditor's insider raised the budget row's epsilon total (not chained) and charged on:
    the server's check and the owner's local one both said valid. Both replay the totals from
    the budget entries now: the row's total, and every entry charged under it."""
    dataset_id, _, curator = _setup(api, client)
    with get_sessionmaker()() as s:
        budget = s.get(Budget, dataset_id)
        assert budget is not None
        budget.epsilon_total *= 100
        s.commit()
    for check in (curator.verify_ledger, curator.verify_ledger_locally):
        v = check(dataset_id)
        assert not v.valid
        assert "totals" in (v.reason or ""), v
    # an entry recorded under the raised total (its hash is consistent) is named itself
    entries = curator.ledger(dataset_id)
    raised = entries[-1].model_copy(update={"epsilon_total": entries[-1].epsilon_total * 100})
    fields = hashed_fields(dataset_id, raised)
    fields["prev_hash"] = entries[-2].row_hash
    rehashed = raised.model_copy(update={"row_hash": row_hash(entries[-2].row_hash, fields)})
    v = verify_entries(dataset_id, [*entries[:-1], rehashed])
    assert (v.valid, v.first_invalid_seq) == (False, 5)
    assert "not set by a budget entry" in (v.reason or "")


def test_the_local_check_sees_grants_roles_and_the_servers_verdict(
    api: Api, client: TestClient
) -> None:
    """A follow-up audit: the owner's --checkpoint check said valid (and moved the checkpoint)
    after a client key was made an analyst for a charge and back, or a grant row was deleted,
    where the server's check refused. The local check now compares the grant list and the
    roles with the replay, and asks the server's check too."""
    dataset_id, _, curator = _setup(api, client)
    assert curator.verify_ledger_locally(dataset_id).valid
    with get_sessionmaker()() as s:
        (grant,) = s.execute(select(Grant).where(Grant.dataset_id == dataset_id)).scalars()
        analyst = s.get(Principal, grant.principal_id)
        assert analyst is not None
        analyst.role = "client"  # the grantee that charged is a client now
        s.commit()
    v = curator.verify_ledger_locally(dataset_id)
    assert not v.valid
    assert "not an analyst" in (v.reason or "")
    entries = curator.ledger(dataset_id)
    grants = curator.list_grants(dataset_id)
    here = verify_entries(dataset_id, entries, grants=grants[:0])  # a grant row deleted
    assert "grants differ" in (here.reason or "")
    with get_sessionmaker()() as s:
        analyst = s.get(Principal, grant.principal_id)
        assert analyst is not None
        analyst.role = "analyst"
        s.commit()
    assert curator.verify_ledger_locally(dataset_id).valid
    # among charges arriving during the check: the sum lies between the spends read around it
    total = sum(float(e.epsilon) for e in entries)
    ok = verify_entries(dataset_id, entries, spent_before=(0.0, 0.0), epsilon_spent=total + 1)
    assert ok.valid
    low = verify_entries(dataset_id, entries, spent_before=(0.0, 0.0), epsilon_spent=total / 2)
    assert "spend" in (low.reason or "")


def test_the_checkpoint_check_lists_limit_changes_since_the_checkpoint(
    api: Api, client: TestClient, tmp_path: Path
) -> None:
    """An entry appended after the checkpoint with its chain recomputed passes every check (a
    documented limit): the CLI lists the budget and grant entries since the checkpoint, so that
    the owner can confirm them."""
    dataset_id, key, curator = _setup(api, client)
    file = tmp_path / "checkpoint.json"
    curator.verify_ledger_locally(dataset_id, file)
    curator.set_budget(dataset_id, epsilon_total=7.5, delta_total=1e-4)
    result = _verify_with_cli(client, key, dataset_id, "--checkpoint", str(file))
    assert result.exit_code == 0, result.output
    assert "since the checkpoint: entry 6" in result.stderr
    assert "set eps 7.5" in result.stderr


def test_a_cron_check_fails_on_limits_changed_since_the_checkpoint(
    api: Api, client: TestClient, tmp_path: Path
) -> None:
    """An insider's forged grant entry (hashes recomputed) passes every check, and the
    checkpoint check printed it and moved on: a cron job could not alert. With
    --fail-on-changes it exits 2 and keeps the checkpoint until the owner confirms."""
    dataset_id, key, _ = _setup(api, client)
    file = tmp_path / "ledger-checkpoint.json"

    def run(*args: str, code: int = 0) -> Any:
        result = _verify_with_cli(client, key, dataset_id, *args)
        assert result.exit_code == code, (result.stdout, result.stderr)
        return result

    run("--checkpoint", str(file))
    saved = Checkpoint.load(file)
    assert saved is not None
    assert "valid" in run("--checkpoint", str(file), "--fail-on-changes").stdout  # nothing new
    api.grant(key, dataset_id, api.principal("client")["id"])  # a grant after the checkpoint
    flagged = run("--checkpoint", str(file), "--fail-on-changes", code=2)
    assert "confirm it was yours" in flagged.stderr
    assert "kept at entry" in flagged.stderr
    assert Checkpoint.load(file) == saved
    run("--checkpoint", str(file), "--fail-on-changes", code=2)  # still, until confirmed
    confirmed = run("--checkpoint", str(file))  # the owner's own run: they were theirs
    assert "saved to" in confirmed.stderr
    run("--checkpoint", str(file), "--fail-on-changes")
    # a paper-mode change weakens the guarantee: it is a change to confirm too
    paper = client.patch(
        f"/v1/datasets/{dataset_id}", json={"allow_paper_mode": True}, headers=api.auth(key)
    )
    assert paper.status_code == 200, paper.text
    assert (
        "confirm it was yours" in run("--checkpoint", str(file), "--fail-on-changes", code=2).stderr
    )
    run("--checkpoint", str(file))
    usage = _verify_with_cli(client, key, dataset_id, "--fail-on-changes")
    assert usage.exit_code == 1  # not 2, what a cron job reads as changes
    assert "needs --checkpoint" in usage.stderr


def test_a_charge_rewritten_below_its_records_cost_fails_both_checks(
    api: Api, client: TestClient
) -> None:
    """An owner walkthrough rewrote a charge from epsilon 0.3 to 0.1 with every total and hash
    made consistent: it verified, though the charge's own hashed mechanism record says 0.3. Both
    checks now hold each charge to its record's cost."""
    from decimal import Decimal

    dataset_id, _, curator = _setup(api, client)
    entries = curator.ledger(dataset_id)
    charge = next(i for i, e in enumerate(entries) if e.entry_type == "charge")
    cut = Decimal("0.05")  # its record says more
    rewritten: list[Any] = []
    prev = chain.genesis_hash(dataset_id)
    for i, e in enumerate(entries):
        update: dict[str, Any] = {}
        if i == charge:
            update["epsilon"] = Decimal(str(e.epsilon)) - cut
        if i >= charge:
            update["epsilon_spent"] = Decimal(str(e.epsilon_spent)) - cut
        moved = e.model_copy(update=update)
        fields = hashed_fields(dataset_id, moved)
        fields["prev_hash"] = prev
        moved = moved.model_copy(update={"prev_hash": prev, "row_hash": row_hash(prev, fields)})
        rewritten.append(moved)
        prev = moved.row_hash
    here = verify_entries(dataset_id, rewritten)
    assert (here.valid, here.first_invalid_seq) == (False, entries[charge].seq)
    assert "mechanism record" in (here.reason or "")
    # the server's replay, on the same fields
    replay = chain.Replay()
    reasons = [replay.step(hashed_fields(dataset_id, e)) for e in rewritten]
    assert "mechanism record" in (reasons[charge] or "")
    assert all(r is None for r in reasons[:charge])
    # the untouched ledger passes both
    assert verify_entries(dataset_id, entries).valid
    assert curator.verify_ledger(dataset_id).valid
