"""The owner's audit view of a ledger: filters, pagination and each charge's release.

Read-only. The hashed fields come from ``ledger.entry_view`` unchanged; a charge's release kind
and status are added from the release itself (not part of the hash chain), its status exactly as
``GET /v1/releases/{id}`` shows it (padded: no completion time leaks through the ledger).
"""

from __future__ import annotations

import csv
import io
import time
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import LedgerEntry, Release
from service.ledger import service as ledger
from service.releases.service import shown_status

EntryType = Literal["create", "budget", "grant", "charge", "rows_deleted", "settings"]
ReleaseStatus = Literal["queued", "running", "done", "failed"]

CSV_COLUMNS = (*ledger.CSV_COLUMNS, "release_kind", "release_status")


@dataclass(frozen=True)
class LedgerFilter:
    """Every set field must match; ``None`` matches everything."""

    entry_type: EntryType | None = None
    principal_id: str | None = None
    release_kind: str | None = None
    release_status: ReleaseStatus | None = None
    guarantee: Literal["strict", "paper"] | None = None


def filtered(
    session: Session,
    *,
    dataset_id: str,
    where: LedgerFilter,
    newest_first: bool = False,
) -> list[dict[str, Any]]:
    """The matching entries as audit rows (``entry_view`` plus release kind and status)."""
    query = (
        select(LedgerEntry, Release)
        .outerjoin(Release, Release.id == LedgerEntry.release_id)
        .where(LedgerEntry.dataset_id == dataset_id)
        .order_by(LedgerEntry.seq.desc() if newest_first else LedgerEntry.seq)
    )
    if where.entry_type is not None:
        query = query.where(LedgerEntry.entry_type == where.entry_type)
    if where.principal_id is not None:
        query = query.where(LedgerEntry.principal_id == where.principal_id)
    if where.guarantee is not None:
        query = query.where(LedgerEntry.guarantee == where.guarantee)
    if where.release_kind is not None:
        query = query.where(Release.kind == where.release_kind)
    now = time.time()
    rows = []
    for entry, release in session.execute(query).all():
        status = None if release is None else shown_status(release, now=now)
        # The shown status depends on the clock (padding), so it is matched here, not in SQL.
        if where.release_status is not None and status != where.release_status:
            continue
        row = ledger.entry_view(entry)
        row["release_kind"] = None if release is None else release.kind
        row["release_status"] = status
        rows.append(row)
    return rows


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
