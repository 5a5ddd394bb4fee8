"""Encryption at rest of released functions' secret state (threats.md §6: GP noise values and
the fitted function are secret; encrypted, never logged).

AES-256-GCM with the key ``CURATOR_STATE_KEY`` (base64 of 32 bytes). Each sealed value carries a
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


def _key() -> bytes:
    key = base64.b64decode(get_settings().state_key)
    if len(key) != 32:
        raise SealError("CURATOR_STATE_KEY must be base64 of 32 bytes")
    return key


def seal(plaintext: bytes, *, context: str) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return MAGIC + nonce + AESGCM(_key()).encrypt(nonce, plaintext, context.encode())


def unseal(sealed: bytes, *, context: str) -> bytes:
    if not sealed.startswith(MAGIC) or len(sealed) < len(MAGIC) + NONCE_BYTES + 16:
        raise SealError("not a sealed value")
    nonce = sealed[len(MAGIC) : len(MAGIC) + NONCE_BYTES]
    try:
        return AESGCM(_key()).decrypt(nonce, sealed[len(MAGIC) + NONCE_BYTES :], context.encode())
    except InvalidTag:
        raise SealError("the value does not authenticate") from None
