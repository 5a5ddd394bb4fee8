"""Hash chain of ledger entries: row_hash = SHA-256(prev_hash ‖ canonical JSON of the row).

On PostgreSQL a charge's entry is hashed by the database, inside the statement that charges
(``curator_charge_v1``): the fields known only under the budget row's lock (its sequence number,
running totals and timestamp) are filled into the canonical JSON that ``body_parts`` prepared in
Python, so the text hashed is byte for byte the one ``row_hash`` hashes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

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
