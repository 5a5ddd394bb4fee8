"""Encryption at rest of released functions' secret state (threats.md §6: GP noise values and
the fitted function are secret; encrypted, never logged).

AES-256-GCM with the key ``CURATOR_STATE_KEY`` (base64 of 32 bytes). Keys are rotated by moving
the old one to ``CURATOR_STATE_KEY_PREVIOUS`` (still tried when opening, never used to seal) and
running ``python -m service.functions.rotate``, which re-seals every value under the new key; the
old key can then be dropped. Each sealed value carries a
fresh random 96-bit nonce and is bound to its row by associated data (function id and row), so
rows cannot be swapped or moved between functions undetected. A value that does not decrypt is
treated as corrupt state (the function is closed, never silently re-created).
"""

from __future__ import annotations

import base64
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from service.config import get_settings

MAGIC = b"DPCS1"
NONCE_BYTES = 12


class SealError(ValueError):
    """A sealed value is malformed or does not authenticate under the configured key."""


def _decode(value: str) -> bytes:
    key = base64.b64decode(value)
    if len(key) != 32:
        raise SealError("CURATOR_STATE_KEY must be base64 of 32 bytes")
    return key


def _key() -> bytes:
    return _decode(get_settings().state_key)


def _keys() -> tuple[bytes, ...]:
    """The current key, then the previous ones (``CURATOR_STATE_KEY_PREVIOUS``)."""
    settings = get_settings()
    return tuple(_decode(k) for k in (settings.state_key, *settings.previous_state_keys))


def seal(plaintext: bytes, *, context: str) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return MAGIC + nonce + AESGCM(_key()).encrypt(nonce, plaintext, context.encode())


def _open(sealed: bytes, context: str, keys: tuple[bytes, ...]) -> bytes:
    if not sealed.startswith(MAGIC) or len(sealed) < len(MAGIC) + NONCE_BYTES + 16:
        raise SealError("not a sealed value")
    nonce = sealed[len(MAGIC) : len(MAGIC) + NONCE_BYTES]
    body = sealed[len(MAGIC) + NONCE_BYTES :]
    for key in keys:
        try:
            return AESGCM(key).decrypt(nonce, body, context.encode())
        except InvalidTag:
            continue
    raise SealError("the value does not authenticate")


def unseal(sealed: bytes, *, context: str) -> bytes:
    """The plaintext of a value sealed under the current key or a previous one."""
    return _open(sealed, context, _keys())


def reseal(sealed: bytes, *, context: str) -> bytes | None:
    """The value sealed under the current key, or None if it already is (key rotation).
    Raises ``SealError`` if no configured key opens it."""
    try:
        _open(sealed, context, (_key(),))
        return None
    except SealError:
        pass
    return seal(unseal(sealed, context=context), context=context)
