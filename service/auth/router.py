"""Principals: the admin creates owners, analysts and clients, each with an API key."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

from service.auth.service import CurrentCaller, Role, create_principal, require
from service.db.engine import SessionDep
from service.db.models import Principal
from service.problems import Forbidden, Unauthenticated, ValidationFailed, responses

router = APIRouter(prefix="/v1/principals", tags=["principals"])


class PrincipalCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f]+$")
    role: Role


class PrincipalRead(BaseModel):
    id: str
    name: str
    role: str
    key_prefix: str
    created_at: str


class PrincipalCreated(PrincipalRead):
    api_key: str = Field(description="Shown once; only its hash is stored.")


def _read(p: Principal) -> PrincipalRead:
    return PrincipalRead(
        id=p.id, name=p.name, role=p.role, key_prefix=p.key_prefix, created_at=p.created_at
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


@router.get("", response_model=list[PrincipalRead], responses=responses(Unauthenticated, Forbidden))
def list_principals(session: SessionDep, caller: CurrentCaller) -> list[PrincipalRead]:
    require(caller, Role.ADMIN, Role.OWNER)
    rows = session.execute(select(Principal).order_by(Principal.created_at)).scalars()
    return [_read(p) for p in rows]


@router.get("/me", response_model=PrincipalRead, responses=responses(Unauthenticated))
def me(session: SessionDep, caller: CurrentCaller) -> PrincipalRead:
    if caller.role == Role.ADMIN:
        return PrincipalRead(id="admin", name="admin", role="admin", key_prefix="", created_at="")
    principal = session.get(Principal, caller.id)
    assert principal is not None
    return _read(principal)
