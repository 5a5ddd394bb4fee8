"""Datasets: create from an upload, look up with access checks, describe, delete rows."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.auth.service import Caller, Role
from service.datasets import storage
from service.datasets.ingest import ingest
from service.datasets.schemas import (
    BudgetRead,
    CsvFormat,
    DatasetCreated,
    DatasetRead,
    GrantRead,
    PublicSchema,
    UploadCheck,
)
from service.db.models import Budget, Dataset, Grant, LedgerEntry
from service.functions import service as functions
from service.ledger import amounts
from service.ledger import service as ledger
from service.ledger.chain import canonical_json
from service.mechanisms.calibration import DEFAULT_DELTA_CAP
from service.mechanisms.domain import PublicDomain, StudyDesign
from service.problems import DatasetUnavailable, Forbidden, NotFound


def schema_hash(schema: PublicSchema) -> str:
    return hashlib.sha256(canonical_json(schema.model_dump(mode="json")).encode()).hexdigest()


def create(
    session: Session,
    *,
    owner: Caller,
    name: str,
    description: str,
    schema: PublicSchema,
    csv_path: Path,
    allow_paper_mode: bool,
    csv_format: CsvFormat | None = None,
) -> DatasetCreated:
    """Ingest the CSV and store dataset, rows and ledger genesis in the caller's transaction."""
    ingested = ingest(csv_path, schema, csv_format)
    dataset = Dataset(
        id=uuid.uuid4().hex,
        owner_id=owner.id,
        name=name,
        description=description,
        schema_json=canonical_json(schema.model_dump(mode="json")),
        schema_hash=schema_hash(schema),
        version=1,
        n=int(ingested.matrix.shape[0]),
        q=len(schema.covariates),
        status="ready",
        allow_paper_mode=allow_paper_mode,
        created_at=ledger.now_iso(),
    )
    session.add(dataset)
    session.flush()
    storage.save_matrix(session, dataset_id=dataset.id, matrix=ingested.matrix)
    ledger.open_ledger(
        session, dataset_id=dataset.id, principal_id=owner.id, allow_paper_mode=allow_paper_mode
    )
    read = describe(session, dataset)
    return DatasetCreated(**read.model_dump(by_alias=True), ingest_report=ingested.report)


def check(*, schema: PublicSchema, csv_path: Path, csv_format: CsvFormat) -> UploadCheck:
    """An upload's ingest and report, nothing stored (``POST /v1/datasets/check``)."""
    ingested = ingest(csv_path, schema, csv_format)
    return UploadCheck(n=int(ingested.matrix.shape[0]), ingest_report=ingested.report)


def _grant(session: Session, dataset_id: str, principal_id: str) -> Grant | None:
    return session.execute(
        select(Grant).where(
            Grant.dataset_id == dataset_id,
            Grant.principal_id == principal_id,
            Grant.revoked.is_(False),
        )
    ).scalar_one_or_none()


def readable(session: Session, *, caller: Caller, dataset_id: str) -> Dataset:
    """The dataset if the caller may see it; otherwise 404, whether or not it exists."""
    dataset = session.get(Dataset, dataset_id)
    if dataset is None:
        raise NotFound("dataset not found")
    if caller.role == Role.ADMIN or dataset.owner_id == caller.id:
        return dataset
    if caller.role in (Role.ANALYST, Role.CLIENT) and _grant(session, dataset_id, caller.id):
        return dataset
    raise NotFound("dataset not found")


def owned(session: Session, *, caller: Caller, dataset_id: str) -> Dataset:
    dataset = readable(session, caller=caller, dataset_id=dataset_id)
    if dataset.owner_id != caller.id:
        raise Forbidden("only the dataset's owner may do this")
    return dataset


def usable_for_release(
    session: Session, *, caller: Caller, dataset_id: str
) -> tuple[Dataset, bool]:
    """The dataset and whether the charge goes through a grant (analysts) or not (owner)."""
    dataset = readable(session, caller=caller, dataset_id=dataset_id)
    if caller.role == Role.ANALYST:
        return dataset, True
    if caller.role == Role.OWNER and dataset.owner_id == caller.id:
        return dataset, False
    raise Forbidden(RELEASE_ROLES)


RELEASE_ROLES = (
    "only analysts (and the dataset's owner) may ask for quotes and releases; a client reads "
    "the releases of the datasets it is granted"
)


def require_release_role(caller: Caller) -> None:
    """403 for a role that never requests releases (client, admin), before anything else about
    the request is checked (a client sending no Idempotency-Key had been told to send one)."""
    if caller.role not in (Role.ANALYST, Role.OWNER):
        raise Forbidden(RELEASE_ROLES)


def visible(session: Session, *, caller: Caller) -> list[Dataset]:
    query = select(Dataset).order_by(Dataset.created_at)
    if caller.role == Role.OWNER:
        query = query.where(Dataset.owner_id == caller.id)
    elif caller.role != Role.ADMIN:
        query = query.join(Grant, Grant.dataset_id == Dataset.id).where(
            Grant.principal_id == caller.id, Grant.revoked.is_(False)
        )
    return list(session.execute(query).scalars())


def budget_warnings(delta_total: float, n: int) -> list[str]:
    """What an owner should hear about a total (the console warned, the API and CLI accepted
    delta_total 0.5 on n = 8000 silently): delta not below 1/n. Public n and the total only."""
    if n > 0 and delta_total >= 1.0 / n:
        return [
            f"delta_total {delta_total:g} is not below 1/n = {1.0 / n:.3g}: a release may then "
            "reveal a record outright with probability about delta; keep it well below 1/n "
            f"(e.g. {0.1 / n:.1g} or less)"
        ]
    if delta_total == 0.0:
        return [
            "delta_total 0: only pure-epsilon releases can be charged (the DP difference in "
            "means on a trial, the epsilon-ADUM uplift table); every other release needs some "
            "delta"
        ]
    if delta_total < DEFAULT_DELTA_CAP:
        return [
            f"delta_total {delta_total:g} is below the delta a release takes by default (up "
            f"to {DEFAULT_DELTA_CAP:g} each): every request must then name a smaller delta "
            f"(e.g. {delta_total / 10:.1g} for ten releases), or it is refused for lack of budget"
        ]
    return []


def budget_view(session: Session, dataset_id: str) -> BudgetRead:
    budget = session.get(Budget, dataset_id)
    assert budget is not None
    dataset = session.get(Dataset, dataset_id)
    paper = session.execute(
        select(func.coalesce(func.sum(LedgerEntry.epsilon), 0)).where(
            LedgerEntry.dataset_id == dataset_id,
            LedgerEntry.entry_type == "charge",
            LedgerEntry.guarantee == "paper",
        )
    ).scalar_one()
    return BudgetRead(
        is_set=budget.is_set,
        epsilon_total=amounts.epsilon_value(budget.epsilon_total),
        delta_total=amounts.delta_value(budget.delta_total),
        epsilon_spent=amounts.epsilon_value(budget.epsilon_spent),
        delta_spent=amounts.delta_value(budget.delta_spent),
        epsilon_remaining=amounts.epsilon_value(budget.epsilon_total - budget.epsilon_spent),
        delta_remaining=amounts.delta_value(budget.delta_total - budget.delta_spent),
        epsilon_spent_paper=amounts.epsilon_value(int(paper)),
        warnings=(
            budget_warnings(amounts.delta_value(budget.delta_total), dataset.n)
            if budget.is_set and dataset is not None
            else []
        ),
    )


def public_schema(dataset: Dataset) -> PublicSchema:
    return PublicSchema.model_validate_json(dataset.schema_json)


def describe(session: Session, dataset: Dataset) -> DatasetRead:
    return DatasetRead(
        id=dataset.id,
        name=dataset.name,
        description=dataset.description,
        owner_id=dataset.owner_id,
        version=dataset.version,
        n=dataset.n,
        status=dataset.status,
        allow_paper_mode=dataset.allow_paper_mode,
        created_at=dataset.created_at,
        schema_=public_schema(dataset),
        schema_hash=dataset.schema_hash,
        budget=budget_view(session, dataset.id),
    )


def grant_view(grant: Grant) -> GrantRead:
    return GrantRead(
        principal_id=grant.principal_id,
        epsilon_cap=None if grant.epsilon_cap is None else amounts.epsilon_value(grant.epsilon_cap),
        delta_cap=None if grant.delta_cap is None else amounts.delta_value(grant.delta_cap),
        epsilon_spent=amounts.epsilon_value(grant.epsilon_spent),
        delta_spent=amounts.delta_value(grant.delta_spent),
        revoked=grant.revoked,
        created_at=grant.created_at,
    )


def domain_of(dataset: Dataset) -> PublicDomain:
    """The public domain the mechanisms see: bounds, n and design, all declared or public."""
    schema = public_schema(dataset)
    bounds = np.array([c.bounds for c in schema.covariates], dtype=np.float64)
    return PublicDomain(
        x_lower=bounds[:, 0],
        x_upper=bounds[:, 1],
        y_lower=schema.outcome.lower,
        y_upper=schema.outcome.upper,
        n=dataset.n,
        design=StudyDesign(schema.design),
        treatment_probability=schema.treatment_probability,
        min_propensity_clip=schema.min_propensity_clip,
        allow_paper_mode=dataset.allow_paper_mode,
        x_codes=tuple(
            tuple(sorted(c.codes)) if c.type == "categorical" and c.codes else None
            for c in schema.covariates
        ),
        effect_modifiers=tuple(j for j, c in enumerate(schema.covariates) if c.effect_modifier)
        or None,
        adjustment_set=tuple(j for j, c in enumerate(schema.covariates) if c.adjust_for) or None,
        x_names=tuple(c.name for c in schema.covariates),
        y_binary=schema.outcome.type == "binary",
    )


def after_rows_deleted(session: Session, closed: list[str]) -> None:
    """After ``delete_rows`` committed: this process forgets the closed functions' cached state
    (other processes refuse them by their closed header, and drop the copies as their caches
    turn over), and SQLite moves the overwritten pages out of its write-ahead log."""
    for function_id in closed:
        functions.forget(function_id)
    storage.checkpoint_log(session)


def delete_rows(session: Session, *, caller: Caller, dataset: Dataset) -> list[str]:
    """Delete the stored rows and every state built from them (an exact-basis function's
    fitted state, ``functions.purge_row_state``), in the caller's transaction; the ledger and
    the releases (DP outputs) stay. Returns the functions closed, for the caller to forget
    from this process's cache once committed."""
    if dataset.status == "deleted":
        raise DatasetUnavailable("the rows were already deleted")
    dataset.status = "deleted"
    dataset.rows_deleted_at = ledger.now_iso()
    session.flush()  # the dataset's row is locked first, as a finishing job's store locks it
    storage.delete_rows(session, dataset_id=dataset.id)
    closed = functions.purge_row_state(session, dataset_id=dataset.id)
    ledger.record_rows_deleted(session, dataset_id=dataset.id, principal_id=caller.id)
    return closed
