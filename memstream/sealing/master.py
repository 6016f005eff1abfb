"""The master key and the one small interface that wraps data keys with it.

A data key never leaves a process unwrapped: what the key topic holds is the data key
sealed (AES-256-GCM) under the master key, bound to the key record's own key (subject
and key id) as associated data, so a wrapped key copied to another subject does not
open. A KMS replaces :class:`AesGcmKeyWrapper` by implementing :class:`KeyWrapper`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "KeyWrapper",
    "AesGcmKeyWrapper",
    "MasterKeyError",
    "decode_master_key",
    "new_master_key",
    "read_master_key_file",
    "write_master_key_file",
]

MASTER_KEY_BYTES = 32
_NONCE_BYTES = 12


class MasterKeyError(RuntimeError):
    """The master key is missing, malformed or not the one that wrapped the stored keys."""


class KeyWrapper(Protocol):
    """Wraps and unwraps data keys. ``key_id`` names the wrapping key (stored beside each
    wrapped key) so a node holding another master key says so instead of failing later."""

    @property
    def key_id(self) -> str: ...

    def wrap(self, data_key: bytes, bound_to: bytes) -> bytes: ...

    def unwrap(self, wrapped: bytes, bound_to: bytes) -> bytes:
        """The data key; raises :class:`MasterKeyError` when this wrapper did not wrap it."""
        ...


class AesGcmKeyWrapper:
    """Data keys wrapped with AES-256-GCM under a local master key."""

    def __init__(self, master_key: bytes) -> None:
        if len(master_key) != MASTER_KEY_BYTES:
            raise MasterKeyError(f"a master key is {MASTER_KEY_BYTES} bytes, got {len(master_key)}")
        self._aead = AESGCM(master_key)
        # A fingerprint, not the key: HMAC under the key of a fixed label.
        self._key_id = hmac.new(master_key, b"memstream master key id", hashlib.sha256).hexdigest()[:16]

    @property
    def key_id(self) -> str:
        return self._key_id

    def wrap(self, data_key: bytes, bound_to: bytes) -> bytes:
        nonce = os.urandom(_NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, data_key, bound_to)

    def unwrap(self, wrapped: bytes, bound_to: bytes) -> bytes:
        try:
            return self._aead.decrypt(wrapped[:_NONCE_BYTES], wrapped[_NONCE_BYTES:], bound_to)
        except InvalidTag:
            raise MasterKeyError("a stored data key does not open with this master key") from None


def new_master_key() -> bytes:
    return secrets.token_bytes(MASTER_KEY_BYTES)


def decode_master_key(text: str, *, source: str) -> bytes:
    """A base64 master key (32 bytes); ``source`` names where it came from in the error."""
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise MasterKeyError(f"{source}: not a master key (base64 of 32 bytes)") from None
    if len(key) != MASTER_KEY_BYTES:
        raise MasterKeyError(f"{source}: not a master key (base64 of 32 bytes, got {len(key)} bytes)")
    return key


def read_master_key_file(path: Path) -> bytes | None:
    """The master key stored at ``path``, or None when there is no such file."""
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise MasterKeyError(f"{path}: cannot read the master key ({exc})") from None
    return decode_master_key(text, source=str(path))


def write_master_key_file(path: Path, key: bytes) -> bytes:
    """Store ``key`` at ``path`` with mode 0600, unless another process made the file
    first: then its key wins and is returned. Written aside and linked into place, so
    no reader ever sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(base64.b64encode(key).decode("ascii") + "\n")
    try:
        os.link(aside, path)
    except FileExistsError:
        found = read_master_key_file(path)
        if found is None:
            raise MasterKeyError(f"{path}: vanished while being created") from None
        return found
    finally:
        aside.unlink()
    return key
