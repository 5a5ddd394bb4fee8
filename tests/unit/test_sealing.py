"""Sealing of released functions' secret state: AES-GCM bound to its row, key refused if default."""

from __future__ import annotations

import pytest

from service.config import DEFAULT_ADMIN_KEY, DEFAULT_STATE_KEY, Settings
from service.functions.sealing import MAGIC, SealError, seal, unseal


def test_round_trip_and_binding() -> None:
    sealed = seal(b"noise values 0.1234", context="f1:batch:3")
    assert sealed.startswith(MAGIC)
    assert b"0.1234" not in sealed
    assert unseal(sealed, context="f1:batch:3") == b"noise values 0.1234"
    assert seal(b"x", context="c") != seal(b"x", context="c")  # fresh nonce each time
    with pytest.raises(SealError):
        unseal(sealed, context="f1:batch:4")  # moved to another row
    with pytest.raises(SealError):
        unseal(sealed[:-1] + bytes([sealed[-1] ^ 1]), context="f1:batch:3")  # altered
    with pytest.raises(SealError):
        unseal(b"PK\x03\x04 plain npz", context="f1:batch:3")


def test_production_refuses_the_default_state_key() -> None:
    with pytest.raises(ValueError, match="CURATOR_STATE_KEY"):
        Settings(
            environment="production", admin_key="a-real-secret-key", state_key=DEFAULT_STATE_KEY
        )
    with pytest.raises(ValueError, match="CURATOR_ADMIN_KEY"):
        Settings(environment="production", admin_key=DEFAULT_ADMIN_KEY)
    Settings(
        environment="production",
        admin_key="a-real-secret-key",
        state_key="c2VjcmV0LXN0YXRlLWtleS1mb3ItdGVzdHMtMzJieXQ=",
    )


def test_the_default_secrets_serve_loopback_only() -> None:
    """Development defaults work on this machine only: listening on another interface with
    either default secret is refused, whatever the environment."""
    Settings(environment="development")
    Settings(environment="development", host="localhost")
    Settings(environment="development", host="::1")
    for host in ("0.0.0.0", "10.1.2.3", "curator.hospital.example"):
        with pytest.raises(ValueError, match="CURATOR_ADMIN_KEY.*listening on"):
            Settings(environment="development", host=host)
        with pytest.raises(ValueError, match="CURATOR_STATE_KEY.*listening on"):
            Settings(environment="development", host=host, admin_key="a-real-secret-key")
    Settings(
        environment="development",
        host="0.0.0.0",
        admin_key="a-real-secret-key",
        state_key="c2VjcmV0LXN0YXRlLWtleS1mb3ItdGVzdHMtMzJieXQ=",
    )
