"""HTTP routes of datasets, their budget, grants and ledger. Thin: validate, call services."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import PlainTextResponse
from pydantic import ValidationError
from sqlalchemy import select

from service.auth.service import CurrentCaller, Role, require
from service.datasets import audit, service
from service.datasets.ingest import CsvError
from service.datasets.schemas import (
    BudgetRead,
    BudgetUpdate,
    CsvFormat,
    DatasetCreated,
    DatasetRead,
    DatasetUpdate,
    GrantRead,
    GrantUpdate,
    LedgerEntryRead,
    LedgerPage,
    UploadCheck,
    UploadSchema,
    VerificationRead,
)
from service.db.engine import MAX_OFFSET, SessionDep
from service.db.models import Grant, Principal
from service.ledger import service as ledger
from service.problems import (
    BudgetBelowSpent,
    DatasetUnavailable,
    Forbidden,
    InvalidCsv,
    InvalidSchema,
    NotFound,
    PayloadTooLarge,
    Unauthenticated,
    ValidationFailed,
    responses,
    validation_error,
    validation_summary,
)

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])

AUTH = (Unauthenticated, Forbidden, NotFound)


CSV_FORMAT_FORM = Form(
    alias="csv_format",
    description="How the file is written, as JSON (the CsvFormat schema): delimiter (omitted: "
    "found from the header), decimal mark, encoding, extra missing-value markers. Omitted: "
    "UTF-8, the delimiter found from the header, '.' decimals.",
)


def _keys_named_twice(text: str) -> list[str]:
    """Keys an object of the JSON ``text`` names twice (a labels map with the key 'treated'
    twice made both arms 1, silently); [] also for text that is not JSON (validated later)."""
    twice: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in items]
        twice.extend(sorted({k for k in keys if keys.count(k) > 1}))
        return dict(items)

    try:
        json.loads(text, object_pairs_hook=pairs)
    except ValueError:
        return []
    return twice


def _upload_inputs(schema_text: str, csv_format_text: str | None) -> tuple[UploadSchema, CsvFormat]:
    try:
        public = UploadSchema.model_validate_json(schema_text)
    except ValidationError as exc:
        errors = [validation_error(e, field="schema") for e in exc.errors()]
        raise InvalidSchema(validation_summary(errors), errors=errors) from None
    except json.JSONDecodeError:
        raise InvalidSchema("the schema is not valid JSON") from None
    twice = _keys_named_twice(csv_format_text or "{}")
    if twice:
        raise ValidationFailed(
            f"csv_format names a key twice: {', '.join(twice)} (JSON keeps only the last one)",
            pointer="#/csv_format",
        )
    try:
        fmt = CsvFormat.model_validate_json(csv_format_text or "{}")
    except ValidationError as exc:
        errors = [validation_error(e, field="csv_format") for e in exc.errors()]
        raise ValidationFailed(validation_summary(errors), errors=errors) from None
    return public, fmt


@contextmanager
def _saved_file(file: UploadFile) -> Iterator[Path]:
    """The uploaded rows in a private temporary file; a CsvError reading them is a 422."""
    with tempfile.TemporaryDirectory(prefix="curator-upload-") as tmp:
        path = Path(tmp) / "rows.csv"
        with path.open("wb") as out:
            shutil.copyfileobj(file.file, out, length=1 << 20)
        try:
            yield path
        except CsvError as exc:
            errors = [{"pointer": exc.pointer, "detail": str(exc)}] if exc.pointer else []
            raise InvalidCsv(str(exc), errors=errors) if errors else InvalidCsv(str(exc)) from None


@router.post(
    "",
    status_code=201,
    response_model=DatasetCreated,
    responses=responses(*AUTH, InvalidCsv, InvalidSchema, PayloadTooLarge, ValidationFailed),
    summary="Upload a dataset (CSV) with its public schema",
)
def create_dataset(
    session: SessionDep,
    caller: CurrentCaller,
    name: Annotated[str, Form(min_length=1, max_length=200)],
    schema_text: Annotated[str, Form(alias="schema", description="The public schema, as JSON")],
    file: Annotated[UploadFile, File(description="The rows, as CSV with a header line")],
    description: Annotated[str, Form(max_length=10_000)] = "",
    allow_paper_mode: Annotated[bool, Form()] = False,
    csv_format_text: Annotated[str | None, CSV_FORMAT_FORM] = None,
) -> DatasetCreated:
    require(caller, Role.OWNER)
    if not name.strip() or any(ord(c) < 0x20 for c in name):
        raise ValidationFailed(
            "the name must show at least one character and no control characters",
            pointer="#/name",
        )
    public, fmt = _upload_inputs(schema_text, csv_format_text)
    with _saved_file(file) as path:
        created = service.create(
            session,
            owner=caller,
            name=name,
            description=description,
            schema=public,
            csv_path=path,
            allow_paper_mode=allow_paper_mode,
            csv_format=fmt,
        )
    session.commit()
    return created


@router.post(
    "/check",
    response_model=UploadCheck,
    responses=responses(Unauthenticated, Forbidden, InvalidCsv, InvalidSchema, PayloadTooLarge),
    summary="Check a CSV against its schema as an upload would, storing nothing",
)
def check_upload(
    caller: CurrentCaller,
    schema_text: Annotated[str, Form(alias="schema", description="The public schema, as JSON")],
    file: Annotated[UploadFile, File(description="The rows, as CSV with a header line")],
    csv_format_text: Annotated[str | None, CSV_FORMAT_FORM] = None,
) -> UploadCheck:
    """The upload's checks and its owner-only ingest report, without a dataset, rows or ledger:
    a data manager's trial and error left a dozen permanent datasets (a dataset cannot be
    deleted once uploaded; only its rows can)."""
    require(caller, Role.OWNER)
    public, fmt = _upload_inputs(schema_text, csv_format_text)
    with _saved_file(file) as path:
        return service.check(schema=public, csv_path=path, csv_format=fmt)


@router.get("", response_model=list[DatasetRead], responses=responses(Unauthenticated))
def list_datasets(session: SessionDep, caller: CurrentCaller) -> list[DatasetRead]:
    return [service.describe(session, d) for d in service.visible(session, caller=caller)]


@router.get("/{dataset_id}", response_model=DatasetRead, responses=responses(*AUTH))
def get_dataset(session: SessionDep, caller: CurrentCaller, dataset_id: str) -> DatasetRead:
    return service.describe(
        session, service.readable(session, caller=caller, dataset_id=dataset_id)
    )


@router.patch("/{dataset_id}", response_model=DatasetRead, responses=responses(*AUTH))
def update_dataset(
    session: SessionDep, caller: CurrentCaller, dataset_id: str, body: DatasetUpdate
) -> DatasetRead:
    dataset = service.owned(session, caller=caller, dataset_id=dataset_id)
    if body.description is not None:
        dataset.description = body.description
    if body.allow_paper_mode is not None and body.allow_paper_mode != dataset.allow_paper_mode:
        dataset.allow_paper_mode = body.allow_paper_mode
        ledger.set_paper_mode(
            session, dataset_id=dataset.id, principal_id=caller.id, allowed=body.allow_paper_mode
        )
    session.commit()
    return service.describe(session, dataset)


@router.delete(
    "/{dataset_id}/rows",
    status_code=204,
    responses=responses(*AUTH, DatasetUnavailable),
    summary="Delete the stored rows; the dataset's ledger and releases stay",
)
def delete_rows(session: SessionDep, caller: CurrentCaller, dataset_id: str) -> None:
    dataset = service.owned(session, caller=caller, dataset_id=dataset_id)
    closed = service.delete_rows(session, caller=caller, dataset=dataset)
    session.commit()
    service.after_rows_deleted(session, closed)


@router.get("/{dataset_id}/budget", response_model=BudgetRead, responses=responses(*AUTH))
def get_budget(session: SessionDep, caller: CurrentCaller, dataset_id: str) -> BudgetRead:
    service.readable(session, caller=caller, dataset_id=dataset_id)
    return service.budget_view(session, dataset_id)


@router.put(
    "/{dataset_id}/budget",
    response_model=BudgetRead,
    responses=responses(*AUTH, BudgetBelowSpent, ValidationFailed),
)
def set_budget(
    session: SessionDep, caller: CurrentCaller, dataset_id: str, body: BudgetUpdate
) -> BudgetRead:
    service.owned(session, caller=caller, dataset_id=dataset_id)
    ledger.set_budget(
        session,
        dataset_id=dataset_id,
        principal_id=caller.id,
        epsilon_total=body.epsilon_total,
        delta_total=body.delta_total,
    )
    session.commit()
    return service.budget_view(session, dataset_id)


@router.get(
    "/{dataset_id}/grants",
    response_model=list[GrantRead],
    responses=responses(*AUTH),
    summary="Grants of the dataset (owner), or the caller's own grant (analyst, client)",
)
def list_grants(session: SessionDep, caller: CurrentCaller, dataset_id: str) -> list[GrantRead]:
    """The owner sees every grant; an analyst or client with a grant sees only their own."""
    dataset = service.readable(session, caller=caller, dataset_id=dataset_id)
    query = select(Grant).where(Grant.dataset_id == dataset_id).order_by(Grant.id)
    if dataset.owner_id != caller.id:
        if caller.role not in (Role.ANALYST, Role.CLIENT):
            raise Forbidden("only the dataset's owner and its grantees may read grants")
        query = query.where(Grant.principal_id == caller.id)
    return [service.grant_view(g) for g in session.execute(query).scalars()]


@router.put(
    "/{dataset_id}/grants/{principal_id}",
    response_model=GrantRead,
    responses=responses(*AUTH, BudgetBelowSpent, ValidationFailed),
    summary="Grant an analyst (optionally with a per-principal cap) or a client access",
)
def put_grant(
    session: SessionDep,
    caller: CurrentCaller,
    dataset_id: str,
    principal_id: str,
    body: GrantUpdate,
) -> GrantRead:
    service.owned(session, caller=caller, dataset_id=dataset_id)
    grantee = session.get(Principal, principal_id)
    if grantee is None or grantee.role not in (Role.ANALYST, Role.CLIENT):
        raise ValidationFailed(
            "grants go to an existing analyst or client principal", pointer="#/principal_id"
        )
    if grantee.role == Role.CLIENT:
        capped = [name for name in ("epsilon_cap", "delta_cap") if getattr(body, name) is not None]
        if capped:
            # a client reads releases and evaluates functions; it can never spend budget, so a
            # cap would only suggest that it could
            raise ValidationFailed(
                "a client never spends budget: caps are for analysts' grants; grant the client "
                "without epsilon_cap and delta_cap",
                errors=[{"pointer": f"#/{name}", "detail": "not for a client"} for name in capped],
            )
    grant = ledger.set_grant(
        session,
        dataset_id=dataset_id,
        owner_id=caller.id,
        principal_id=principal_id,
        epsilon_cap=body.epsilon_cap,
        delta_cap=body.delta_cap,
    )
    session.commit()
    return service.grant_view(grant)


@router.delete("/{dataset_id}/grants/{principal_id}", status_code=204, responses=responses(*AUTH))
def revoke_grant(
    session: SessionDep, caller: CurrentCaller, dataset_id: str, principal_id: str
) -> None:
    service.owned(session, caller=caller, dataset_id=dataset_id)
    ledger.revoke_grant(
        session, dataset_id=dataset_id, owner_id=caller.id, principal_id=principal_id
    )
    session.commit()


@router.get(
    "/{dataset_id}/ledger",
    response_model=LedgerPage,
    responses={
        **responses(*AUTH, ValidationFailed),
        200: {
            "content": {"application/json": {}, "text/csv": {}},
            "description": "The matching entries, as JSON (a page) or CSV (all of them)",
        },
    },
    summary="The dataset's ledger (owner's audit view): filtered, paginated, as JSON or CSV",
)
def get_ledger(
    session: SessionDep,
    caller: CurrentCaller,
    dataset_id: str,
    format: Annotated[Literal["json", "csv"], Query()] = "json",
    entry_type: Annotated[audit.EntryType | None, Query()] = None,
    principal_id: Annotated[
        str | None, Query(max_length=64, description="Who caused the entry")
    ] = None,
    release_kind: Annotated[
        str | None, Query(max_length=32, description="The charged release's kind")
    ] = None,
    status: Annotated[
        audit.ReleaseStatus | None, Query(description="The charged release's status now")
    ] = None,
    guarantee: Annotated[Literal["strict", "paper"] | None, Query()] = None,
    order: Annotated[
        Literal["asc", "desc"], Query(description="By seq: oldest (asc) or newest first")
    ] = "asc",
    limit: Annotated[
        int | None,
        Query(ge=1, le=1000, description="Page size (JSON only); without it, every entry"),
    ] = None,
    offset: Annotated[
        int, Query(ge=0, le=MAX_OFFSET, description="Entries to skip (JSON only)")
    ] = 0,
) -> object:
    service.owned(session, caller=caller, dataset_id=dataset_id)
    where = audit.LedgerFilter(
        entry_type=entry_type,
        principal_id=principal_id,
        release_kind=release_kind,
        release_status=status,
        guarantee=guarantee,
    )
    rows = audit.filtered(session, dataset_id=dataset_id, where=where, newest_first=order == "desc")
    if format == "csv":
        return PlainTextResponse(
            audit.to_csv(rows),
            media_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="ledger-{dataset_id}.csv"'},
        )
    page = rows[offset:] if limit is None else rows[offset : offset + limit]
    return LedgerPage(
        dataset_id=dataset_id,
        total=len(rows),
        offset=offset,
        limit=limit,
        entries=[LedgerEntryRead.model_validate(r) for r in page],
    )


@router.get(
    "/{dataset_id}/ledger/verify", response_model=VerificationRead, responses=responses(*AUTH)
)
def verify_ledger(session: SessionDep, caller: CurrentCaller, dataset_id: str) -> VerificationRead:
    service.owned(session, caller=caller, dataset_id=dataset_id)
    session.commit()  # the check then reads one snapshot and holds up no writer
    v = ledger.verify(session, dataset_id=dataset_id)
    return VerificationRead(
        valid=v.valid,
        entries=v.entries,
        head_hash=v.head_hash,
        first_invalid_seq=v.first_invalid_seq,
        reason=v.reason,
    )
