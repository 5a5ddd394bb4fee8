"""Principals: the admin creates owners, analysts and clients, each with an API key."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from service.auth import events
from service.auth.service import (
    KEY_PREFIX_SHOWN,
    Caller,
    CurrentCaller,
    Role,
    create_principal,
    require,
    rotate_key,
)
from service.db.engine import MAX_OFFSET, SessionDep
from service.db.models import Principal
from service.problems import Forbidden, NotFound, Unauthenticated, ValidationFailed, responses

router = APIRouter(prefix="/v1/principals", tags=["principals"])


class PrincipalCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f]+$")
    # the admin is configured (CURATOR_ADMIN_KEY), never created: not offered
    role: Literal[Role.OWNER, Role.ANALYST, Role.CLIENT]

    @field_validator("name")
    @classmethod
    def _visible(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the name must show at least one character")
        return value

    @field_validator("role", mode="before")
    @classmethod
    def _not_admin(cls, value: object) -> object:
        if value == Role.ADMIN:
            raise ValueError("the admin is configured by CURATOR_ADMIN_KEY, not created")
        return value


class PrincipalUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    disabled: StrictBool = Field(
        description="A disabled principal's key is refused everywhere (401), at once; its grants, "
        "releases and ledger entries stay. Set false to enable it again."
    )


class PrincipalRead(BaseModel):
    id: str
    name: str
    role: str
    key_prefix: str | None = Field(
        description="The key's first characters, to tell keys apart; null for the configured "
        "admin, whose key is set by the deployment, not stored."
    )
    created_at: str | None = Field(description="null for the configured admin.")
    disabled: bool = False


class PrincipalCreated(PrincipalRead):
    api_key: str = Field(description="Shown once; only its hash is stored.")


def _read(p: Principal) -> PrincipalRead:
    return PrincipalRead(
        id=p.id,
        name=p.name,
        role=p.role,
        # Rows created before the prefix was shortened store more characters; show as many.
        key_prefix=p.key_prefix[:KEY_PREFIX_SHOWN],
        created_at=p.created_at,
        disabled=bool(p.disabled),
    )


@router.post(
    "",
    status_code=201,
    response_model=PrincipalCreated,
    responses=responses(Unauthenticated, Forbidden, ValidationFailed),
)
def create(session: SessionDep, caller: CurrentCaller, body: PrincipalCreate) -> PrincipalCreated:
    require(caller, Role.ADMIN)
    principal, key = create_principal(session, name=body.name, role=body.role, created_by=caller.id)
    session.commit()
    return PrincipalCreated(**_read(principal).model_dump(), api_key=key)


@router.get(
    "",
    response_model=list[PrincipalRead],
    responses=responses(Unauthenticated, Forbidden, ValidationFailed),
    summary="Principals, oldest first (admin: all; an owner: analysts, clients and itself)",
)
def list_principals(
    session: SessionDep,
    caller: CurrentCaller,
    response: Response,
    limit: Annotated[
        int | None, Query(ge=1, le=1000, description="Page size; without it, every principal")
    ] = None,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Principals to skip")] = 0,
) -> list[PrincipalRead]:
    require(caller, Role.ADMIN, Role.OWNER)
    where = []
    if caller.role == Role.OWNER:
        # an owner grants analysts and clients: it sees those and itself, not the other owners
        where.append(
            or_(
                Principal.role.in_((str(Role.ANALYST), str(Role.CLIENT))), Principal.id == caller.id
            )
        )
    total = session.execute(select(func.count()).select_from(Principal).where(*where)).scalar_one()
    query = (
        select(Principal).where(*where).order_by(Principal.created_at, Principal.id).offset(offset)
    )
    if limit is not None:
        query = query.limit(limit)
    response.headers["X-Total-Count"] = str(total)
    return [_read(p) for p in session.execute(query).scalars()]


@router.get("/me", response_model=PrincipalRead, responses=responses(Unauthenticated))
def me(session: SessionDep, caller: CurrentCaller) -> PrincipalRead:
    if caller.role == Role.ADMIN:
        return PrincipalRead(
            id="admin", name="admin", role="admin", key_prefix=None, created_at=None
        )
    principal = session.get(Principal, caller.id)
    assert principal is not None
    return _read(principal)


@router.patch(
    "/{principal_id}",
    response_model=PrincipalRead,
    responses=responses(Unauthenticated, Forbidden, NotFound, ValidationFailed),
    summary="Disable or enable a principal (admin)",
)
def update(
    session: SessionDep, caller: CurrentCaller, principal_id: str, body: PrincipalUpdate
) -> PrincipalRead:
    require(caller, Role.ADMIN)
    principal = events.locked(session, principal_id)
    if bool(principal.disabled) != body.disabled:
        principal.disabled = body.disabled
        events.record(
            session, principal, "disabled" if body.disabled else "enabled", actor_id=caller.id
        )
    session.commit()
    return _read(principal)


def _self_or_admin(caller: Caller, principal_id: str, *, admin_me: str, other: str) -> str:
    """The id a path's ``principal_id`` names for ``caller``: the admin may name anyone (not
    ``me``: 422 ``admin_me``), a principal only itself, as ``me`` or its id (403 ``other``)."""
    if caller.role == Role.ADMIN:
        if principal_id == "me":
            raise ValidationFailed(admin_me, pointer="#/principal_id")
        return principal_id
    if principal_id not in ("me", caller.id):
        raise Forbidden(other)
    return caller.id


@router.post(
    "/{principal_id}/key",
    response_model=PrincipalCreated,
    responses=responses(Unauthenticated, Forbidden, NotFound, ValidationFailed),
    summary="Replace a principal's API key (admin, or the principal itself as 'me')",
)
def replace_key(session: SessionDep, caller: CurrentCaller, principal_id: str) -> PrincipalCreated:
    """The old key stops working at once; the new one is shown only in this response."""
    target = _self_or_admin(
        caller,
        principal_id,
        admin_me="the admin key is configured by CURATOR_ADMIN_KEY, not replaced",
        other="a principal can replace only its own key ('me'); the admin any",
    )
    principal = events.locked(session, target)
    key = rotate_key(principal)
    events.record(session, principal, "key_replaced", actor_id=caller.id)
    session.commit()
    return PrincipalCreated(**_read(principal).model_dump(), api_key=key)


class PrincipalEventRead(BaseModel):
    seq: int
    event: events.EventType
    actor_id: str = Field(description="Who made the change: 'admin' or a principal's id.")
    key_prefix: str = Field(description="The first characters of the key in force afterwards.")
    created_at: str
    prev_hash: str
    row_hash: str


class PrincipalEventPage(BaseModel):
    principal_id: str
    total: int
    offset: int
    limit: int | None
    events: list[PrincipalEventRead]


class PrincipalEventVerification(BaseModel):
    valid: bool
    entries: int
    head_hash: str
    first_invalid_seq: int | None
    reason: str | None


def _audited(session: Session, caller: CurrentCaller, principal_id: str) -> Principal:
    """The principal whose events ``caller`` may read: the admin any, a principal its own."""
    target = _self_or_admin(
        caller,
        principal_id,
        admin_me="the admin is configured, not a principal with events",
        other="a principal can read only its own events ('me'); the admin any",
    )
    principal = session.get(Principal, target)
    if principal is None:
        raise NotFound("no such principal")
    return principal


@router.get(
    "/{principal_id}/events",
    response_model=PrincipalEventPage,
    responses=responses(Unauthenticated, Forbidden, NotFound, ValidationFailed),
    summary="A principal's account events, oldest first (admin, or the principal itself as 'me')",
)
def list_events(
    session: SessionDep,
    caller: CurrentCaller,
    principal_id: str,
    limit: Annotated[
        int | None, Query(ge=1, le=1000, description="Page size; without it, every event")
    ] = None,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Events to skip")] = 0,
) -> PrincipalEventPage:
    """Creation, each disable and enable and each key replacement, with who did it: an
    append-only, hash-chained record (``GET …/events/verify`` recomputes the chain)."""
    principal = _audited(session, caller, principal_id)
    total, rows = events.page(session, principal_id=principal.id, limit=limit, offset=offset)
    return PrincipalEventPage(
        principal_id=principal.id,
        total=total,
        offset=offset,
        limit=limit,
        events=[
            PrincipalEventRead(
                seq=r.seq,
                event=r.event,
                actor_id=r.actor_id,
                key_prefix=r.key_prefix[:KEY_PREFIX_SHOWN],
                created_at=r.created_at,
                prev_hash=r.prev_hash,
                row_hash=r.row_hash,
            )
            for r in rows
        ],
    )


@router.get(
    "/{principal_id}/events/verify",
    response_model=PrincipalEventVerification,
    responses=responses(Unauthenticated, Forbidden, NotFound, ValidationFailed),
    summary="Recompute a principal's event chain (admin, or the principal itself as 'me')",
)
def verify_events(
    session: SessionDep, caller: CurrentCaller, principal_id: str
) -> PrincipalEventVerification:
    principal = _audited(session, caller, principal_id)
    session.commit()  # the check then reads one snapshot and holds up no writer
    v = events.verify(session, principal)
    return PrincipalEventVerification(**asdict(v))
