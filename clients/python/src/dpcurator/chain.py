"""Verify a dataset's ledger here, not on the server, and against a checkpoint you keep.

The server's ``…/ledger/verify`` recomputes the hash chain with the server's code on the
server's database. This module recomputes it from the entries the server exports, with the
published rule (docs/guide-owner.md, "Verify the ledger yourself"):

    row_hash = SHA-256(prev_hash + "\\n" + canonical JSON of the hashed fields)

from the genesis hash SHA-256("dp-curator-ledger:" + dataset id), amounts in integer units
(ε × 10¹², δ × 10¹⁸), canonical JSON with sorted keys, no spaces and UTF-8 text. It also checks
the running totals and the budget's spend.

A chain can be rewritten whole by whoever can write the database (the hashes have no key). A
**checkpoint** (an entry's sequence number and hash, saved outside the server after a
successful check) catches that: every later check must find the same entry with the same hash,
so nothing up to it can have been rewritten since.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

from dpcurator.models import Grant, LedgerEntry, Verification

EPSILON_SCALE = 10**12
DELTA_SCALE = 10**18
HASHED_FIELDS = (
    "dataset_id",
    "seq",
    "entry_type",
    "principal_id",
    "release_id",
    "epsilon",
    "delta",
    "epsilon_spent",
    "delta_spent",
    "epsilon_total",
    "delta_total",
    "guarantee",
    "details_json",
    "request_hash",
    "idempotency_key",
    "created_at",
)


def genesis_hash(dataset_id: str) -> str:
    return hashlib.sha256(f"dp-curator-ledger:{dataset_id}".encode()).hexdigest()


def _units(amount: Decimal, scale: int) -> int:
    units = amount * scale
    if units != units.to_integral_value():
        raise ValueError(f"{amount} is not a whole number of ledger units")
    return int(units)


def hashed_fields(dataset_id: str, entry: LedgerEntry) -> dict[str, Any]:
    """The fields an entry's hash covers, as the server stores them."""
    return {
        "dataset_id": dataset_id,
        "seq": entry.seq,
        "entry_type": entry.entry_type,
        "principal_id": entry.principal_id,
        "release_id": entry.release_id,
        "epsilon": _units(entry.epsilon, EPSILON_SCALE),
        "delta": _units(entry.delta, DELTA_SCALE),
        "epsilon_spent": _units(entry.epsilon_spent, EPSILON_SCALE),
        "delta_spent": _units(entry.delta_spent, DELTA_SCALE),
        "epsilon_total": _units(entry.epsilon_total, EPSILON_SCALE),
        "delta_total": _units(entry.delta_total, DELTA_SCALE),
        "guarantee": entry.guarantee,
        "details_json": entry.details_json,
        "request_hash": entry.request_hash,
        "idempotency_key": entry.idempotency_key,
        "created_at": entry.created_at,
    }


def row_hash(prev_hash: str, fields: dict[str, Any]) -> str:
    body = json.dumps(
        {k: fields[k] for k in HASHED_FIELDS},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256((prev_hash + "\n" + body).encode()).hexdigest()


@dataclass(frozen=True)
class Checkpoint:
    """An entry a successful check saw: its sequence number and hash, and when."""

    dataset_id: str
    seq: int
    row_hash: str
    saved_at: str

    @classmethod
    def load(cls, path: Path) -> Checkpoint | None:
        if not path.exists():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(
            dataset_id=str(data["dataset_id"]),
            seq=int(data["seq"]),
            row_hash=str(data["row_hash"]),
            saved_at=str(data.get("saved_at", "")),
        )

    def save(self, path: Path) -> None:
        data = {
            "dataset_id": self.dataset_id,
            "seq": self.seq,
            "row_hash": self.row_hash,
            "saved_at": self.saved_at,
        }
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def verify_entries(
    dataset_id: str,
    entries: list[LedgerEntry],
    *,
    epsilon_spent: float | None = None,
    delta_spent: float | None = None,
    checkpoint: Checkpoint | None = None,
    epsilon_total: float | None = None,
    delta_total: float | None = None,
    spent_before: tuple[float, float] | None = None,
    grants: Sequence[Grant] | None = None,
    roles: Mapping[str, str] | None = None,
) -> Verification:
    """Recompute the chain of ``entries`` (oldest first, all of them); ``epsilon_spent``: the
    budget's spend as the server reports it (a float of the same units), which must be the sum
    of the charges, and ``delta_spent`` likewise; ``epsilon_total`` / ``delta_total``: the
    budget's totals as the server reports them, which must be the last budget entry's;
    ``checkpoint``: an entry an earlier check saw, which must still be there with the same
    hash. Every entry must carry the totals the last budget entry set, and every charge come
    from the dataset's owner or a grantee with a grant in force, within its caps.
    ``spent_before``: the budget's (epsilon, delta) spend read before the entries (with
    ``epsilon_spent`` / ``delta_spent`` read after them, the charges' sum must lie between:
    a check among many charges a second cannot read both at one instant). ``grants``: the
    dataset's grants as the server lists them (their caps and revocation must be the grant
    entries'); ``roles``: principal ids to roles (a grantee that charged must be an analyst)."""

    def bad(seq: int | None, reason: str) -> Verification:
        head = entries[-1].row_hash if entries else genesis_hash(dataset_id)
        return Verification(
            valid=False, entries=len(entries), head_hash=head, first_invalid_seq=seq, reason=reason
        )

    if checkpoint is not None and checkpoint.dataset_id != dataset_id:
        raise ValueError(f"the checkpoint is of dataset {checkpoint.dataset_id}, not {dataset_id}")
    prev = genesis_hash(dataset_id)
    eps = dlt = 0
    replay = _Replay()
    for expected, entry in enumerate(entries, start=1):
        if entry.seq != expected:
            return bad(expected, "an entry is missing or out of order")
        try:
            fields = hashed_fields(dataset_id, entry)
        except ValueError as exc:
            return bad(expected, str(exc))
        if entry.prev_hash != prev or row_hash(prev, fields) != entry.row_hash:
            return bad(expected, "hash mismatch: the entry was altered")
        if entry.entry_type == "charge":
            eps += fields["epsilon"]
            dlt += fields["delta"]
        if (fields["epsilon_spent"], fields["delta_spent"]) != (eps, dlt):
            return bad(expected, "running totals do not match the sum of charges")
        if eps > fields["epsilon_total"] or dlt > fields["delta_total"]:
            return bad(expected, "spent exceeds total")
        reason = replay.step(fields)
        if reason is not None:
            return bad(expected, reason)
        prev = entry.row_hash
    if (epsilon_total is not None and replay.totals[0] / EPSILON_SCALE != epsilon_total) or (
        delta_total is not None and replay.totals[1] / DELTA_SCALE != delta_total
    ):
        return bad(None, "the budget's totals are not the ones the last budget entry set")
    low = spent_before if spent_before is not None else (epsilon_spent, delta_spent)
    summed = (eps / EPSILON_SCALE, dlt / DELTA_SCALE)
    for lower, total, upper in zip(low, summed, (epsilon_spent, delta_spent), strict=True):
        # spend only grows: read before the entries it is at most their sum, after at least
        if (lower is not None and lower > total) or (upper is not None and upper < total):
            return bad(
                None,
                "the budget's spend is not the sum of the ledger's charges (if charges kept "
                "arriving during the check, run it again)",
            )
    problem = replay.rows_problem(grants, roles)
    if problem is not None:
        return bad(None, problem)
    if checkpoint is not None:
        saved = f"the checkpoint saved {checkpoint.saved_at or 'earlier'}"
        if checkpoint.seq > len(entries):
            return bad(checkpoint.seq, f"the ledger is shorter than {saved}: entries were removed")
        if entries[checkpoint.seq - 1].row_hash != checkpoint.row_hash:
            return bad(
                checkpoint.seq,
                f"entry {checkpoint.seq} is not the one in {saved}: the ledger up to it "
                "was rewritten",
            )
    return Verification(valid=True, entries=len(entries), head_hash=prev)


class _Replay:
    """The totals and grants replayed from the entries, as the server's verify replays them
    (service/ledger/chain.py ``Replay``; this distribution cannot import the server)."""

    def __init__(self) -> None:
        self.owner: str | None = None
        self.totals = (0, 0)
        self.paper_mode: bool | None = None  # None: a ledger from before it was recorded
        # grantee -> [epsilon cap, delta cap, revoked, epsilon spent, delta spent]
        self.grants: dict[str, list[Any]] = {}

    def step(self, fields: dict[str, Any]) -> str | None:
        kind = fields["entry_type"]
        details = json.loads(fields["details_json"] or "{}")
        recorded: tuple[int, int] = (fields["epsilon_total"], fields["delta_total"])
        if kind == "create":
            self.owner, self.totals = fields["principal_id"], recorded
            if "allow_paper_mode" in details:
                self.paper_mode = bool(details["allow_paper_mode"])
        elif kind == "budget":
            declared = (
                _amount(details.get("epsilon_total"), EPSILON_SCALE),
                _amount(details.get("delta_total"), DELTA_SCALE),
            )
            if declared != recorded:
                return "a budget entry's totals differ from the totals it records"
            self.totals = recorded
        elif recorded != self.totals:
            return "the entry's budget totals were not set by a budget entry"
        if kind == "grant":
            state = self.grants.setdefault(str(details.get("grantee")), [None, None, False, 0, 0])
            if details.get("revoked"):
                state[2] = True
            else:
                state[0] = _amount(details.get("epsilon_cap"), EPSILON_SCALE)
                state[1] = _amount(details.get("delta_cap"), DELTA_SCALE)
                state[2] = False
        if kind == "settings" and "allow_paper_mode" in details:
            self.paper_mode = bool(details["allow_paper_mode"])
        if kind == "charge" and _recorded_cost(details) != (fields["epsilon"], fields["delta"]):
            # (a record stating no cost is no record: every charge stores its mechanism's)
            return "a charge's amount differs from the cost its mechanism record states"
        if kind == "charge" and fields["guarantee"] == "paper" and self.paper_mode is False:
            return "a paper-mode charge while the ledger has paper mode off"
        if kind == "charge" and fields["principal_id"] != self.owner:
            grant = self.grants.get(fields["principal_id"])
            if grant is None or grant[2]:
                return "a charge by a principal without a grant in force"
            grant[3] += fields["epsilon"]
            grant[4] += fields["delta"]
            if (grant[0] is not None and grant[3] > grant[0]) or (
                grant[1] is not None and grant[4] > grant[1]
            ):
                return "a charge beyond the grantee's cap"
        return None

    def rows_problem(
        self, grants: Sequence[Grant] | None, roles: Mapping[str, str] | None
    ) -> str | None:
        """How the server's grant list and principal roles disagree with the replay, or None."""
        if grants is not None:
            listed = {g.principal_id: g for g in grants}
            if set(listed) != set(self.grants):
                return "the grants differ from the ledger's grant entries"
            for grantee, state in self.grants.items():
                row = listed[grantee]
                caps = (
                    None if state[0] is None else state[0] / EPSILON_SCALE,
                    None if state[1] is None else state[1] / DELTA_SCALE,
                )
                if (row.epsilon_cap, row.delta_cap, row.revoked) != (*caps, state[2]):
                    return (
                        f"principal {grantee}'s grant: its caps or revocation differ from the "
                        "ledger's grant entries"
                    )
        if roles is not None:
            for grantee, state in self.grants.items():
                charged = state[3] or state[4]
                if charged and roles.get(grantee, "analyst") != "analyst":
                    return "a grantee that charged is not an analyst"
        return None


def _is_amount(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _recorded_cost(details: dict[str, Any]) -> tuple[int, int] | None:
    """A charge's cost in ledger units from its mechanism record: each amount's shortest
    decimal, rounded up to the unit (the server's ``amounts.*_cost_units``); None where the
    record states none."""
    eps, dlt = details.get("epsilon"), details.get("delta")
    if not (_is_amount(eps) and _is_amount(dlt)):
        return None
    assert isinstance(eps, int | float)
    assert isinstance(dlt, int | float)
    return (
        int((Decimal(repr(float(eps))) * EPSILON_SCALE).to_integral_value(ROUND_CEILING)),
        int((Decimal(repr(float(dlt))) * DELTA_SCALE).to_integral_value(ROUND_CEILING)),
    )


def _amount(text: Any, scale: int) -> int | None:
    return None if text is None else _units(Decimal(str(text)), scale)


def new_checkpoint(dataset_id: str, verification: Verification) -> Checkpoint:
    """The checkpoint of a successful check: its head entry."""
    if not verification.valid or verification.entries == 0:
        raise ValueError("only a valid, non-empty ledger gives a checkpoint")
    return Checkpoint(
        dataset_id=dataset_id,
        seq=verification.entries,
        row_hash=verification.head_hash,
        saved_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
