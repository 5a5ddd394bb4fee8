"""Hash chain of ledger entries: row_hash = SHA-256(prev_hash ‖ canonical JSON of the row).

On PostgreSQL a charge's entry is hashed by the database, inside the statement that charges
(``curator_charge_v1``): the fields known only under the budget row's lock (its sequence number,
running totals and timestamp) are filled into the canonical JSON that ``body_parts`` prepared in
Python, so the text hashed is byte for byte the one ``row_hash`` hashes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from service.ledger import amounts
from service.ledger.amounts import DELTA_SCALE, EPSILON_SCALE

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

# The fields of a charge's entry known only under the budget row's lock, in canonical (sorted)
# order: the order in which ``curator_charge_v1`` fills them into the body's holes.
LOCKED_FIELDS = (
    "created_at",
    "delta_spent",
    "delta_total",
    "epsilon_spent",
    "epsilon_total",
    "seq",
)


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def genesis_hash(dataset_id: str) -> str:
    return hashlib.sha256(f"dp-curator-ledger:{dataset_id}".encode()).hexdigest()


def row_hash(prev_hash: str, fields: dict[str, Any]) -> str:
    body = canonical_json({k: fields[k] for k in HASHED_FIELDS})
    return hashlib.sha256((prev_hash + "\n" + body).encode()).hexdigest()


def body_parts(fields: dict[str, Any]) -> list[str]:
    """The canonical JSON of an entry cut at its ``LOCKED_FIELDS`` (absent from ``fields``).

    ``len(LOCKED_FIELDS) + 1`` parts: the body is ``parts[0] + v_0 + parts[1] + ... + v_5 +
    parts[6]`` where ``v_i`` is the canonical JSON of the i-th locked field's value (an integer's
    decimal digits; the timestamp in double quotes). ``fill`` does this in Python.
    """
    parts: list[str] = []
    current = "{"
    for i, key in enumerate(sorted(HASHED_FIELDS)):
        current += ("," if i else "") + canonical_json(key) + ":"
        if key in LOCKED_FIELDS:
            parts.append(current)
            current = ""
        else:
            current += canonical_json(fields[key])
    parts.append(current + "}")
    return parts


def fill(parts: list[str], locked: dict[str, Any]) -> str:
    """The body ``body_parts`` was cut from, with the locked fields' values put back."""
    values = [canonical_json(locked[k]) for k in LOCKED_FIELDS]
    return parts[0] + "".join(v + p for v, p in zip(values, parts[1:], strict=True))


def _units(text: Any, scale: int) -> int | None:
    """Ledger units of an exact decimal string written by ``amounts.*_str`` (None stays None)."""
    if text is None:
        return None
    return int(Decimal(str(text)) * scale)


def _is_amount(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _recorded_cost(details: dict[str, Any]) -> tuple[int, int] | None:
    """A charge's cost in ledger units from its mechanism record (``epsilon``, ``delta``), as
    the charge rounded it (``amounts.*_cost_units``); None where the record states none."""
    eps, dlt = details.get("epsilon"), details.get("delta")
    if not (_is_amount(eps) and _is_amount(dlt)):
        return None
    assert isinstance(eps, int | float)
    assert isinstance(dlt, int | float)
    try:
        return amounts.epsilon_cost_units(float(eps)), amounts.delta_cost_units(float(dlt))
    except amounts.InvalidAmount:
        return (-1, -1)  # a record no charge could have come from


@dataclass
class GrantState:
    """A grantee's grant as the ledger's grant entries set it, and its spend from charges."""

    epsilon_cap: int | None = None
    delta_cap: int | None = None
    revoked: bool = False
    epsilon_spent: int = 0
    delta_spent: int = 0


@dataclass
class Replay:
    """The budget's totals and the grants replayed from the entries in order (pure).

    Beyond the hash chain and the running spend (``service.ledger.service.verify``), an entry
    must carry the totals the last ``budget`` entry set (the budget row is not chained, so a
    total raised there would otherwise pass: an auditor's insider raised epsilon 1 to 100 and
    the check said valid), and a charge must come from the dataset's owner (the ``create``
    entry's principal) or a grantee whose grant was in force, within its caps. ``step`` returns
    the reason of the first inconsistency, or None.
    """

    owner_id: str | None = None
    epsilon_total: int = 0
    delta_total: int = 0
    grants: dict[str, GrantState] = field(default_factory=dict)
    # whether paper mode is allowed, from the create entry and settings entries; None: a ledger
    # opened before the create entry recorded it (not checked)
    paper_mode: bool | None = None

    def step(self, entry: dict[str, Any]) -> str | None:
        kind = entry["entry_type"]
        details = json.loads(entry["details_json"] or "{}")
        if kind == "create":
            self.owner_id = entry["principal_id"]
            self.epsilon_total, self.delta_total = entry["epsilon_total"], entry["delta_total"]
            if "allow_paper_mode" in details:
                self.paper_mode = bool(details["allow_paper_mode"])
        elif kind == "budget":
            declared = (
                _units(details.get("epsilon_total"), EPSILON_SCALE),
                _units(details.get("delta_total"), DELTA_SCALE),
            )
            if declared != (entry["epsilon_total"], entry["delta_total"]):
                return "a budget entry's totals differ from the totals it records"
            self.epsilon_total, self.delta_total = entry["epsilon_total"], entry["delta_total"]
        elif (entry["epsilon_total"], entry["delta_total"]) != (
            self.epsilon_total,
            self.delta_total,
        ):
            return "the entry's budget totals were not set by a budget entry"
        if kind == "grant":
            grantee = str(details.get("grantee"))
            state = self.grants.setdefault(grantee, GrantState())
            if details.get("revoked"):
                state.revoked = True
            else:
                state.revoked = False
                state.epsilon_cap = _units(details.get("epsilon_cap"), EPSILON_SCALE)
                state.delta_cap = _units(details.get("delta_cap"), DELTA_SCALE)
        if kind == "settings" and "allow_paper_mode" in details:
            self.paper_mode = bool(details["allow_paper_mode"])
        if kind == "charge" and _recorded_cost(details) != (entry["epsilon"], entry["delta"]):
            # the charged amount is its mechanism record's cost, rounded up to the ledger's unit;
            # an amount rewritten with the hashes recomputed left the record saying otherwise
            # (a record stating no cost is no record: every charge stores its mechanism's)
            return "a charge's amount differs from the cost its mechanism record states"
        if kind == "charge" and entry["guarantee"] == "paper" and self.paper_mode is False:
            return "a paper-mode charge while the ledger has paper mode off"
        if kind == "charge" and entry["principal_id"] != self.owner_id:
            grant = self.grants.get(entry["principal_id"])
            if grant is None or grant.revoked:
                return "a charge by a principal without a grant in force"
            grant.epsilon_spent += entry["epsilon"]
            grant.delta_spent += entry["delta"]
            over_epsilon = grant.epsilon_cap is not None and grant.epsilon_spent > grant.epsilon_cap
            over_delta = grant.delta_cap is not None and grant.delta_spent > grant.delta_cap
            if over_epsilon or over_delta:
                return "a charge beyond the grantee's cap"
        return None
