"""The sealed record: what the kept-forever topics hold instead of an event's JSON.

Layout (bytes)::

    b"\\x00MS\\x01" | key id (16) | header length (2, big-endian) | header (JSON)
                  | nonce (12) | AES-256-GCM(event JSON)

The header stays readable for routing, ordering and audit: event id, type, schema
version, scope ids and times (:class:`SealedHeader`). Everything else, the whole event
body, is the ciphertext. Everything before the nonce is the associated data, so the
ciphertext is bound to its event id and scope: a header changed or a body moved to
another record does not open. The leading zero byte makes a sealed value impossible to
mistake for JSON.
"""

from __future__ import annotations

import os

import msgspec
from cryptography.exceptions import InvalidTag

from memstream.sealing.keyring import KID_BYTES, DataKey, Keyring

__all__ = [
    "SEALED_MAGIC",
    "SealedHeader",
    "UnreadableRecord",
    "TamperedRecord",
    "seal",
    "is_sealed",
    "sealed_kid",
    "sealed_header",
    "open_sealed",
]

SEALED_MAGIC = b"\x00MS\x01"
_KID_AT = len(SEALED_MAGIC)
_LEN_AT = _KID_AT + KID_BYTES
_HEADER_AT = _LEN_AT + 2
_NONCE_BYTES = 12


class SealedHeader(msgspec.Struct, frozen=True):
    """The plain part of a sealed record (a msgspec struct: encoded once per event)."""

    event_id: str
    type: str
    schema_version: int
    team_id: str
    user_id: str
    agent_id: str
    occurred_at: str | None = None
    recorded_at: str | None = None

    def encode(self) -> bytes:
        return _encode_header(self)


_encode_header = msgspec.json.Encoder().encode
_decode_header = msgspec.json.Decoder(SealedHeader).decode


class UnreadableRecord(Exception):
    """A sealed record whose key this node does not hold: forgotten, or never known."""

    def __init__(self, kid: bytes, forgotten: bool) -> None:
        self.kid = kid
        self.forgotten = forgotten
        super().__init__(f"sealed under key {kid.hex()}, which is {'forgotten' if forgotten else 'unknown'}")


class TamperedRecord(ValueError):
    """A sealed record that does not open under its own key: altered, or not sealed."""


def seal(plain: bytes, header: SealedHeader | bytes, key: DataKey) -> bytes:
    """``plain`` (an event's JSON) sealed under ``key``; ``header`` may come encoded."""
    head = header if isinstance(header, bytes) else header.encode()
    if len(head) > 0xFFFF:
        raise ValueError("sealed header longer than 65535 bytes")
    aad = b"".join((SEALED_MAGIC, key.kid, len(head).to_bytes(2, "big"), head))
    nonce = os.urandom(_NONCE_BYTES)
    return b"".join((aad, nonce, key.aead.encrypt(nonce, plain, aad)))


def is_sealed(value: bytes | None) -> bool:
    return value is not None and value[:_KID_AT] == SEALED_MAGIC


def sealed_kid(value: bytes) -> bytes:
    return bytes(value[_KID_AT:_LEN_AT])


def _header_end(value: bytes) -> int:
    if len(value) < _HEADER_AT:
        raise TamperedRecord("sealed record cut short")
    end = _HEADER_AT + int.from_bytes(value[_LEN_AT:_HEADER_AT], "big")
    if len(value) < end + _NONCE_BYTES + 16:
        raise TamperedRecord("sealed record cut short")
    return end


def sealed_header(value: bytes) -> SealedHeader:
    """The plain header of a sealed record (no key needed)."""
    try:
        return _decode_header(value[_HEADER_AT : _header_end(value)])
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise TamperedRecord("sealed record with an unreadable header") from None


def open_sealed(value: bytes, keyring: Keyring) -> bytes:
    """The event JSON inside a sealed record. Raises :class:`UnreadableRecord` when the
    key is not held (a forgotten subject), :class:`TamperedRecord` when it does not open."""
    kid = sealed_kid(value)
    key = keyring.by_kid(kid)
    if key is None:
        raise UnreadableRecord(kid, keyring.was_forgotten(kid))
    end = _header_end(value)
    nonce_end = end + _NONCE_BYTES
    try:
        return key.aead.decrypt(value[end:nonce_end], value[nonce_end:], value[:end])
    except InvalidTag:
        raise TamperedRecord("sealed record does not open under its key: altered") from None
