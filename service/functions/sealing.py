"""Encryption at rest of released functions' secret state (threats.md §6: GP noise values and
the fitted function are secret; encrypted, never logged).

AES-256-GCM with the key ``CURATOR_STATE_KEY`` (base64 of 32 bytes). Each value names the key
that sealed it (``key_id``, an HMAC of a label: public), so a process without that key knows its
configuration is at fault, not the value, and does not close the function (``UnknownKey``).
Keys are rotated by moving the old one to ``CURATOR_STATE_KEY_PREVIOUS`` (still used to open,
never to seal) and running ``python -m service.functions.rotate``, which re-seals every value
under the new key; the old key can then be dropped. Each sealed value carries a fresh random
96-bit nonce and is bound to its row by associated data (function id and row), so rows cannot
be swapped or moved between functions undetected. A value that names a configured key and does
not decrypt is corrupt state (the function is closed, never silently re-created).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from service.config import get_settings

# DPCS2: magic, the sealing key's id, nonce, ciphertext. DPCS1 (before key rotation existed):
# magic, nonce, ciphertext; still opened, by trying every configured key.
MAGIC = b"DPCS2"
LEGACY_MAGIC = b"DPCS1"
KEY_ID_BYTES = 8
NONCE_BYTES = 12


class SealError(ValueError):
    """A sealed value is malformed or does not authenticate under the configured key."""


class UnknownKey(SealError):
    """The value names a sealing key this process is not configured with: the configuration is
    wrong (or a rotation is half rolled out), not the value."""


def _decode(value: str) -> bytes:
    key = base64.b64decode(value.strip())
    if len(key) != 32:
        raise SealError("CURATOR_STATE_KEY must be base64 of 32 bytes")
    return key


def key_id(key: bytes) -> bytes:
    """A public name of a key (it reveals nothing about it): HMAC-SHA256(key, label)[:8]."""
    return hmac.new(key, b"dp-curator state key id", hashlib.sha256).digest()[:KEY_ID_BYTES]


def _key() -> bytes:
    return _decode(get_settings().state_key)


def _keys() -> tuple[bytes, ...]:
    """The current key, then the previous ones (``CURATOR_STATE_KEY_PREVIOUS``)."""
    settings = get_settings()
    return tuple(_decode(k) for k in (settings.state_key, *settings.previous_state_keys))


def seal(plaintext: bytes, *, context: str) -> bytes:
    key = _key()
    kid = key_id(key)
    nonce = os.urandom(NONCE_BYTES)
    return MAGIC + kid + nonce + AESGCM(key).encrypt(nonce, plaintext, context.encode())


def _open(sealed: bytes, context: str, keys: tuple[bytes, ...]) -> bytes:
    if sealed.startswith(MAGIC) and len(sealed) >= len(MAGIC) + KEY_ID_BYTES + NONCE_BYTES + 16:
        kid = sealed[len(MAGIC) : len(MAGIC) + KEY_ID_BYTES]
        start = len(MAGIC) + KEY_ID_BYTES
        candidates = [k for k in keys if hmac.compare_digest(key_id(k), kid)]
        if not candidates:
            raise UnknownKey("the value was sealed under a key this process is not given")
    elif sealed.startswith(LEGACY_MAGIC) and len(sealed) >= len(LEGACY_MAGIC) + NONCE_BYTES + 16:
        start = len(LEGACY_MAGIC)
        candidates = list(keys)
    else:
        raise SealError("not a sealed value")
    nonce = sealed[start : start + NONCE_BYTES]
    body = sealed[start + NONCE_BYTES :]
    for key in candidates:
        try:
            return AESGCM(key).decrypt(nonce, body, context.encode())
        except InvalidTag:
            continue
    raise SealError("the value does not authenticate")


def unseal(sealed: bytes, *, context: str) -> bytes:
    """The plaintext of a value sealed under the current key or a previous one. Raises
    ``UnknownKey`` for a value sealed under a key not configured here, ``SealError`` for one
    that is malformed or altered."""
    return _open(sealed, context, _keys())


def reseal(sealed: bytes, *, context: str) -> bytes | None:
    """The value sealed under the current key in the current format, or None if it already is
    (key rotation). Raises ``SealError`` (``UnknownKey``) if no configured key opens it."""
    plaintext = unseal(sealed, context=context)
    if sealed.startswith(MAGIC) and sealed[len(MAGIC) : len(MAGIC) + KEY_ID_BYTES] == key_id(
        _key()
    ):
        return None
    return seal(plaintext, context=context)
