"""HTTP routes of releases and quotes."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Response

from service.auth.service import CurrentCaller
from service.config import get_settings
from service.datasets import service as datasets
from service.db.engine import MAX_OFFSET, SessionDep
from service.jobs import liveness
from service.problems import (
    BudgetExhausted,
    BudgetNotSet,
    DatasetUnavailable,
    Forbidden,
    IdempotencyKeyInFlight,
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
    NotFound,
    PaperModeNotEnabled,
    PrincipalCapExceeded,
    Unauthenticated,
    UnknownKind,
    ValidationFailed,
    responses,
)
from service.releases import service
from service.releases.schemas import QuoteCreate, QuoteRead, ReleaseCreate, ReleaseRead

router = APIRouter(tags=["releases"])

# An Idempotency-Key reaches the owner's ledger CSV verbatim (the row hash covers it), so a value
# a spreadsheet would run as a formula (a leading =, +, - or @; OWASP's CSV injection list, whose
# tab and carriage return are outside the printable range anyway) is refused at the door.
IDEMPOTENCY_KEY = re.compile(r"[!-*,.-<>?A-~][ -~]*")  # first: printable but not = + - @

AUTH = (Unauthenticated, Forbidden, NotFound)

# A queued or running release's answer carries ``Retry-After`` (seconds): when a client that
# polls GET /v1/releases/{id} should ask again. Constant, so it says nothing about the job.
POLL_AFTER_SECONDS = 1
_UNFINISHED = frozenset({"queued", "running"})
_POLL_HEADER = {
    "Retry-After": {
        "description": "On a queued or running release: seconds to wait before polling again",
        "schema": {"type": "integer"},
    }
}


def _poll_hint(view: ReleaseRead, response: Response) -> ReleaseRead:
    if view.status in _UNFINISHED:
        response.headers["Retry-After"] = str(POLL_AFTER_SECONDS)
    _say_why_waiting([view])
    return view


def _say_why_waiting(views: list[ReleaseRead]) -> None:
    """Queued releases say so when no job worker is alive (PostgreSQL: one count query)."""
    queued = [v for v in views if v.status == "queued"]
    if not queued:
        return
    settings = get_settings()
    if liveness.workers_alive(settings) == 0:
        for view in queued:
            view.waiting = liveness.waiting_note(settings)


@router.post(
    "/v1/datasets/{dataset_id}/releases",
    status_code=202,
    response_model=ReleaseRead,
    responses={
        200: {
            "description": "An identical release already exists (a replay of this "
            "Idempotency-Key, or a reuse): that release, charged once; Location names it",
            "model": ReleaseRead,
            "headers": _POLL_HEADER,
        },
        202: {"description": "Charged and queued; Location names it", "headers": _POLL_HEADER},
        **responses(
            *AUTH,
            BudgetExhausted,
            BudgetNotSet,
            PrincipalCapExceeded,
            DatasetUnavailable,
            IdempotencyKeyMissing,
            IdempotencyKeyReused,
            IdempotencyKeyInFlight,
            PaperModeNotEnabled,
            UnknownKind,
            ValidationFailed,
        ),
    },
    summary="Request a DP release; it is charged now and runs as a job",
)
def create_release(
    session: SessionDep,
    caller: CurrentCaller,
    dataset_id: str,
    body: ReleaseCreate,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            max_length=255,
            description="Required: any unique string per intended release (a UUID), "
            "printable ASCII not starting with =, +, - or @; a retry with the same key and "
            "body returns the same release and never charges twice.",
        ),
    ] = None,
) -> ReleaseRead:
    datasets.require_release_role(caller)
    if not idempotency_key or not idempotency_key.strip():
        raise IdempotencyKeyMissing("send an Idempotency-Key header (any unique string)")
    key = idempotency_key.strip()
    if not IDEMPOTENCY_KEY.fullmatch(key):
        raise ValidationFailed(
            "the Idempotency-Key must be printable ASCII and must not start with "
            "=, +, - or @ (it is written to the owner's ledger export, where a spreadsheet would "
            "read such a value as a formula); a UUID is a good key",
            pointer="#/idempotency-key",
        )
    release, created = service.create(
        session, caller=caller, dataset_id=dataset_id, body=body, idempotency_key=key
    )
    session.commit()
    response.headers["Location"] = f"/v1/releases/{release.id}"
    if not created:
        response.status_code = 200
    return _poll_hint(service.view(release, cached=not created), response)


@router.get(
    "/v1/datasets/{dataset_id}/releases",
    response_model=list[ReleaseRead],
    responses=responses(*AUTH, ValidationFailed),
    summary="The dataset's releases the caller may see, oldest first; pages with limit/offset",
)
def list_releases(
    session: SessionDep,
    caller: CurrentCaller,
    dataset_id: str,
    response: Response,
    limit: Annotated[
        int | None, Query(ge=1, le=1000, description="Page size; without it, every release")
    ] = None,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Releases to skip")] = 0,
    order: Annotated[
        Literal["asc", "desc"], Query(description="By creation: oldest (asc) or newest first")
    ] = "asc",
) -> list[ReleaseRead]:
    rows, total = service.listing(
        session,
        caller=caller,
        dataset_id=dataset_id,
        limit=limit,
        offset=offset,
        newest_first=order == "desc",
    )
    response.headers["X-Total-Count"] = str(total)
    views = [service.view(r) for r in rows]
    _say_why_waiting(views)
    return views


@router.get(
    "/v1/releases/{release_id}",
    response_model=ReleaseRead,
    responses={200: {"description": "The release", "headers": _POLL_HEADER}, **responses(*AUTH)},
)
def get_release(
    session: SessionDep, caller: CurrentCaller, release_id: str, response: Response
) -> ReleaseRead:
    view = service.view(service.readable(session, caller=caller, release_id=release_id))
    return _poll_hint(view, response)


@router.post(
    "/v1/datasets/{dataset_id}/quotes",
    response_model=QuoteRead,
    responses=responses(*AUTH, UnknownKind, ValidationFailed, PaperModeNotEnabled),
    summary="Cost and expected accuracy of a release, from public quantities only; no charge",
)
def create_quote(
    session: SessionDep, caller: CurrentCaller, dataset_id: str, body: QuoteCreate
) -> QuoteRead:
    return service.quote(session, caller=caller, dataset_id=dataset_id, body=body)
