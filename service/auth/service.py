"""Principals and API keys. Keys are random, shown once, stored as SHA-256 digests."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from fastapi import Depends, Header
from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from service.auth import events
from service.config import get_settings
from service.db.engine import SessionDep, read
from service.db.models import Principal
from service.ledger.service import now_iso
from service.problems import Forbidden, Unauthenticated

KEY_PREFIX = "dpc_"
# Characters of a key kept in the clear to tell keys apart: the marker and 4 random characters
# (24 of the key's 256 random bits).
KEY_PREFIX_SHOWN = len(KEY_PREFIX) + 4


class Role(StrEnum):
    ADMIN = "admin"
    OWNER = "owner"
    ANALYST = "analyst"
    CLIENT = "client"


@dataclass(frozen=True)
class Caller:
    id: str
    role: Role
    name: str


ADMIN = Caller(id="admin", role=Role.ADMIN, name="admin")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_principal(
    session: Session, *, name: str, role: Role, created_by: str
) -> tuple[Principal, str]:
    """Create a principal; return it with its API key (the only time the key is visible)."""
    key = new_key()
    principal = Principal(
        id=uuid.uuid4().hex,
        name=name,
        role=str(role),
        key_hash=hash_key(key),
        key_prefix=key[:KEY_PREFIX_SHOWN],
        created_at=now_iso(),
        created_by=created_by,
    )
    session.add(principal)
    session.flush()
    events.record(session, principal, "created", actor_id=created_by, at=principal.created_at)
    return principal, key


def new_key() -> str:
    """A fresh API key: the marker and 256 random bits."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def rotate_key(principal: Principal) -> str:
    """Give ``principal`` a new key (returned, never stored); the old one stops working."""
    key = new_key()
    principal.key_hash = hash_key(key)
    principal.key_prefix = key[:KEY_PREFIX_SHOWN]
    return key


# The 401 details, the same from every route and from the body middleware.
NO_BEARER_KEY = "send 'Authorization: Bearer <api key>'"
INVALID_KEY = "the API key is not valid"


def bearer_key(authorization: str | None) -> str:
    """The API key of an ``Authorization: Bearer <key>`` header."""
    if not authorization or not authorization.lower().startswith("bearer "):
        raise Unauthenticated(NO_BEARER_KEY)
    return authorization[7:].strip()


def is_admin_key(key: str) -> bool:
    return hmac.compare_digest(key.encode(), get_settings().admin_key.encode())


def key_role(key: str) -> Role | None:
    """The role of ``key`` if it is the admin's or an enabled principal's (None: not a valid
    key): one indexed read on the read pool, no session (the body middleware asks it before a
    body is read)."""
    if is_admin_key(key):
        return Role.ADMIN
    digest = hash_key(key)

    def known(conn: Connection) -> Role | None:
        row = conn.execute(
            select(Principal.disabled, Principal.role).where(Principal.key_hash == digest)
        ).first()
        return None if row is None or row.disabled else Role(row.role)

    return read(known)


def authenticate(
    session: SessionDep, authorization: Annotated[str | None, Header()] = None
) -> Caller:
    """Resolve ``Authorization: Bearer <key>`` to a caller."""
    key = bearer_key(authorization)
    if is_admin_key(key):
        return ADMIN
    principal = session.execute(
        select(Principal).where(Principal.key_hash == hash_key(key))
    ).scalar_one_or_none()
    caller = None
    if principal is not None and not principal.disabled:
        caller = Caller(id=principal.id, role=Role(principal.role), name=principal.name)
    # End this read transaction here: FastAPI runs the route in another worker thread, and a
    # transaction held across that hop (on SQLite, a write lock) could starve the thread pool.
    session.rollback()
    if caller is None:
        raise Unauthenticated(INVALID_KEY)
    return caller


CurrentCaller = Annotated[Caller, Depends(authenticate)]


def require(caller: Caller, *roles: Role) -> None:
    if caller.role not in roles:
        raise Forbidden(f"this action needs one of the roles: {', '.join(map(str, roles))}")
