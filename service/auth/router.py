"""Principals: the admin creates owners, analysts and clients, each with an API key."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from service.auth.service import (
    KEY_PREFIX_SHOWN,
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
    role: Role


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
    key_prefix: str = Field(description="The key's first characters, to tell keys apart.")
    created_at: str
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
    if body.role == Role.ADMIN:
        raise ValidationFailed("the admin is configured by CURATOR_ADMIN_KEY, not created")
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
        return PrincipalRead(id="admin", name="admin", role="admin", key_prefix="", created_at="")
    principal = session.get(Principal, caller.id)
    assert principal is not None
    return _read(principal)


def _existing(session: Session, principal_id: str) -> Principal:
    principal = session.get(Principal, principal_id)
    if principal is None:
        raise NotFound("no such principal")
    return principal


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
    principal = _existing(session, principal_id)
    principal.disabled = body.disabled
    session.commit()
    return _read(principal)


@router.post(
    "/{principal_id}/key",
    response_model=PrincipalCreated,
    responses=responses(Unauthenticated, Forbidden, NotFound, ValidationFailed),
    summary="Replace a principal's API key (admin, or the principal itself as 'me')",
)
def replace_key(session: SessionDep, caller: CurrentCaller, principal_id: str) -> PrincipalCreated:
    """The old key stops working at once; the new one is shown only in this response."""
    if caller.role == Role.ADMIN:
        if principal_id == "me":
            raise ValidationFailed("the admin key is configured by CURATOR_ADMIN_KEY, not replaced")
    elif principal_id not in ("me", caller.id):
        raise Forbidden("a principal can replace only its own key ('me'); the admin any")
    target = caller.id if principal_id == "me" else principal_id
    principal = _existing(session, target)
    key = rotate_key(principal)
    session.commit()
    return PrincipalCreated(**_read(principal).model_dump(), api_key=key)
