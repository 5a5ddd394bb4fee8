"""Hash chain of ledger entries: row_hash = SHA-256(prev_hash ‖ canonical JSON of the row)."""

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


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def genesis_hash(dataset_id: str) -> str:
    return hashlib.sha256(f"dp-curator-ledger:{dataset_id}".encode()).hexdigest()


def row_hash(prev_hash: str, fields: dict[str, Any]) -> str:
    body = canonical_json({k: fields[k] for k in HASHED_FIELDS})
    return hashlib.sha256((prev_hash + "\n" + body).encode()).hexdigest()
