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


KEY_A = "c2VjcmV0LXN0YXRlLWtleS1mb3ItdGVzdHMtMzJieXQ="
KEY_B = "YW5vdGhlci1zdGF0ZS1rZXktZm9yLXRlc3RzLTMyYnk="


def _use(monkeypatch: pytest.MonkeyPatch, key: str, previous: str = "") -> None:
    from service.config import get_settings

    monkeypatch.setenv("CURATOR_STATE_KEY", key)
    monkeypatch.setenv("CURATOR_STATE_KEY_PREVIOUS", previous)
    get_settings.cache_clear()


def test_a_rotated_key_opens_old_state_and_reseal_moves_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from service.config import get_settings
    from service.functions.sealing import reseal

    try:
        _use(monkeypatch, KEY_A)
        old = seal(b"fitted state", context="f1:fitted")
        _use(monkeypatch, KEY_B)
        with pytest.raises(SealError):
            unseal(old, context="f1:fitted")  # the new key alone does not open it
        _use(monkeypatch, KEY_B, previous=KEY_A)
        assert unseal(old, context="f1:fitted") == b"fitted state"
        assert unseal(seal(b"new", context="c"), context="c") == b"new"
        moved = reseal(old, context="f1:fitted")
        assert moved is not None
        assert moved != old
        assert reseal(moved, context="f1:fitted") is None  # already under the current key
        with pytest.raises(SealError):
            reseal(old, context="f1:batch:1")  # bound to its row still
        _use(monkeypatch, KEY_B)
        assert unseal(moved, context="f1:fitted") == b"fitted state"
        with pytest.raises(SealError):
            reseal(old, context="f1:fitted")  # no configured key opens it any more
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()


def test_previous_state_keys_must_be_keys() -> None:
    settings = Settings(state_key=KEY_B + "\n", state_key_previous=f" {KEY_A}, ")
    assert settings.previous_state_keys == (KEY_A,)
    for bad in ("not base64!", "c2hvcnQ=", f"{KEY_A},c2hvcnQ="):
        with pytest.raises(ValueError, match="CURATOR_STATE_KEY_PREVIOUS"):
            Settings(state_key=KEY_B, state_key_previous=bad)
    with pytest.raises(ValueError, match="base64 of 32 bytes"):
        Settings(state_key="c2hvcnQ=")


def test_values_name_their_key_and_legacy_values_still_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A value sealed under a key this process lacks is ``UnknownKey`` (its configuration is
    wrong), not corrupt; values from before key names (DPCS1) open under any configured key and
    the rotation moves them to the current format."""
    import base64
    import os

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from service.config import get_settings
    from service.functions.sealing import LEGACY_MAGIC, UnknownKey, key_id, reseal

    try:
        _use(monkeypatch, KEY_A)
        sealed = seal(b"state", context="f:fitted")
        assert sealed.startswith(MAGIC)
        assert key_id(base64.b64decode(KEY_A)) in sealed[:20]
        _use(monkeypatch, KEY_B)
        with pytest.raises(UnknownKey):
            unseal(sealed, context="f:fitted")
        _use(monkeypatch, KEY_A)
        altered = sealed[:-1] + bytes([sealed[-1] ^ 1])
        with pytest.raises(SealError) as caught:
            unseal(altered, context="f:fitted")
        assert not isinstance(caught.value, UnknownKey)  # names our key: corrupt

        nonce = os.urandom(12)
        legacy = (
            LEGACY_MAGIC
            + nonce
            + AESGCM(base64.b64decode(KEY_A)).encrypt(nonce, b"old state", b"f:batch:1")
        )
        assert unseal(legacy, context="f:batch:1") == b"old state"
        upgraded = reseal(legacy, context="f:batch:1")  # same key, new format
        assert upgraded is not None
        assert upgraded.startswith(MAGIC)
        assert reseal(upgraded, context="f:batch:1") is None
        _use(monkeypatch, KEY_B)
        with pytest.raises(SealError) as caught:
            unseal(legacy, context="f:batch:1")
        assert not isinstance(caught.value, UnknownKey)  # a legacy value names no key
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
