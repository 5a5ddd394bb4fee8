"""Typed views of the API's responses. Fields the server adds later are kept, not refused."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Model(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)


class Principal(Model):
    id: str
    name: str
    role: str
    key_prefix: str | None = None  # None for the configured admin (its key is not stored)
    created_at: str | None = None  # None for the configured admin
    disabled: bool = False


class PrincipalCreated(Principal):
    api_key: str = Field(description="Shown once by the server; store it now.")


class PrincipalEvent(Model):
    """One entry of a principal's account record (``created``, ``disabled``, ``enabled``,
    ``key_replaced``), with who made the change and the key prefix in force afterwards."""

    seq: int
    event: str
    actor_id: str
    key_prefix: str
    created_at: str
    prev_hash: str
    row_hash: str


class Budget(Model):
    is_set: bool
    epsilon_total: float
    delta_total: float
    epsilon_spent: float
    delta_spent: float
    epsilon_remaining: float
    delta_remaining: float
    epsilon_spent_paper: float = 0.0
    # A total that gives little protection (delta_total not below 1/n); empty: an older server.
    warnings: list[str] = []


class IngestReport(Model):
    """Shown once, to the uploading owner only; not public (docs/privacy.md)."""

    rows_received: int
    n: int
    rows_rejected: int
    cells_clipped: dict[str, int]
    cells_imputed: dict[str, int]
    # Columns clipped (or rows rejected) in more than 1 % of the rows, constant covariates,
    # arms or outcomes nothing can be estimated from (empty: an older server).
    warnings: list[str] = []
    # Rows rejected under a reject_row policy, by the column that caused it (empty: an older
    # server).
    rows_rejected_by_column: dict[str, int] = {}
    # Values of a categorical column (or a binary outcome) that were none of its declared codes;
    # counted as missing too (empty: an older server, or none).
    cells_not_a_code: dict[str, int] = {}
    # How the file was read: delimiter (as found in the header), decimal mark, encoding, extra
    # missing-value markers (None: an older server).
    csv_format: dict[str, Any] | None = None


class UploadCheck(Model):
    """``check_upload``: the rows an upload would keep and its report; nothing is stored."""

    n: int
    ingest_report: IngestReport


class Dataset(Model):
    id: str
    name: str
    description: str = ""
    owner_id: str
    version: int
    n: int
    status: str
    allow_paper_mode: bool = False
    created_at: str
    public_schema: dict[str, Any] = Field(alias="schema")
    schema_hash: str
    budget: Budget


class DatasetCreated(Dataset):
    ingest_report: IngestReport


class Grant(Model):
    principal_id: str
    epsilon_cap: float | None = None
    delta_cap: float | None = None
    epsilon_spent: float
    delta_spent: float
    revoked: bool
    created_at: str


class LedgerEntry(Model):
    """One entry of the owner's audit view; amounts are exact decimals."""

    seq: int
    entry_type: str
    created_at: str
    principal_id: str
    release_id: str | None = None
    guarantee: str | None = None
    epsilon: Decimal
    delta: Decimal
    epsilon_spent: Decimal
    delta_spent: Decimal
    epsilon_total: Decimal
    delta_total: Decimal
    idempotency_key: str | None = None
    request_hash: str | None = None
    details_json: str = "{}"
    prev_hash: str
    row_hash: str


class Verification(Model):
    valid: bool
    entries: int
    head_hash: str
    first_invalid_seq: int | None = None
    reason: str | None = None


class Quote(Model):
    kind: str
    guarantee: str
    epsilon: float
    delta: float
    fits_budget: bool
    epsilon_remaining: float
    delta_remaining: float
    # Why it would not be charged now (None: it fits, or an older server).
    budget_note: str | None = None
    # The caller's own per-principal cap left (None: no cap applies, or an older server).
    cap_epsilon_remaining: float | None = None
    cap_delta_remaining: float | None = None
    accuracy: dict[str, Any]
    mechanism: dict[str, Any]


class ReleaseErrorInfo(Model):
    type: str
    title: str
    detail: str


class Release(Model):
    id: str
    dataset_id: str
    principal_id: str
    kind: str
    status: str
    progress: float
    stage: str
    guarantee: str
    epsilon: float
    delta: float
    params: dict[str, Any]
    mechanism: dict[str, Any]
    result: dict[str, Any] | None = None
    error: ReleaseErrorInfo | None = None
    cached: bool = False
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in ("done", "failed")
