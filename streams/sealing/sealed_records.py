"""Sealing and opening Kafka records: the bridge between events and ``memstream.sealing``.

Writers seal an event's JSON under its subject's key (:func:`seal_value`); a record
they sign carries the worker signature of the *sealed* value, so no keyed hash of the
plaintext outlives a forgotten key. Readers open each record before decoding it
(:class:`RecordOpener`): a record sealed under a forgotten key is skipped and counted,
never dead-lettered (it is not bad input, it is shredded input). ``SubjectForgotten``
is the one event written in plaintext: it holds scope ids only, and must stay readable
after the keys it names are gone.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from memstream.domain.events import EventBase, Scope
from memstream.sealing import (
    DataKey,
    Keyring,
    SealedHeader,
    Subject,
    UnreadableRecord,
    is_sealed,
    open_sealed,
    seal,
)
from memstream.streams.trust.worker_identity import HEADER as SIGNATURE_HEADER, signature

__all__ = [
    "subject_of",
    "header_of",
    "seal_value",
    "ingress_header",
    "RecordOpener",
    "OpenCounts",
    "PLAIN_TYPES",
    "UNOPENED_HEADER",
    "OPENED_HEADER",
    "NotAnEvent",
]

UNOPENED_HEADER = "memstream-unopened"
"""Marks, in a reader's batch, a sealed record it could not open (value None; the
header's value empty for a forgotten key, else the reason it did not open)."""

OPENED_HEADER = "memstream-opened"
"""Added to a record a reader opened (its value the key id, hex): a dead letter made of
it is sealed again under that key (``streams.deadletter.seal_dead_letter``)."""

PLAIN_TYPES = frozenset({"SubjectForgotten"})
"""Event types written unsealed (they carry no personal content)."""

Headers = Sequence[tuple[str, bytes]]


class NotAnEvent(ValueError):
    """An ingress record without the envelope needed to seal it (scope, id, type)."""


def subject_of(scope: Scope) -> Subject:
    return Subject(scope.team_id, scope.user_id)


def header_of(event: EventBase) -> SealedHeader:
    """The plain header of ``event`` (ids and times as objects: msgspec writes UUIDs
    and RFC 3339 times itself, which is most of the cost of sealing otherwise)."""
    s = event.scope
    return SealedHeader(
        event.event_id,  # type: ignore[arg-type]
        event.type,
        event.schema_version,
        s.team_id,
        s.user_id,
        s.agent_id,
        event.occurred_at,  # type: ignore[arg-type]
        event.recorded_at,  # type: ignore[arg-type]
    )


def seal_value(key: DataKey, header: SealedHeader, plain: bytes) -> bytes:
    return seal(plain, header, key)


class _Scope(msgspec.Struct):
    team_id: str
    user_id: str = "default"
    agent_id: str = "default"


class _Envelope(msgspec.Struct):
    type: str
    scope: _Scope
    event_id: str
    schema_version: int = 1
    occurred_at: str | None = None
    recorded_at: str | None = None


_ENVELOPE = msgspec.json.Decoder(_Envelope)


def ingress_header(value: bytes | None) -> SealedHeader:
    """The plain header of a plaintext ingress record (its envelope only; the full
    validation happens where the sealed record is read, as for any event)."""
    try:
        env = _ENVELOPE.decode(value or b"")
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise NotAnEvent(f"cannot seal: {str(exc)[:200]}") from None
    s = env.scope
    return SealedHeader(env.event_id, env.type, env.schema_version, s.team_id, s.user_id, s.agent_id, env.occurred_at, env.recorded_at)


def signed_for(worker_key: bytes, value: bytes, headers: Headers) -> list[tuple[str, bytes]]:
    return [*(h for h in headers if h[0] != SIGNATURE_HEADER), (SIGNATURE_HEADER, signature(worker_key, value))]


@dataclass
class OpenCounts:
    """What a reader skipped: records of forgotten subjects, and of keys never seen."""

    forgotten: int = 0
    unknown_key: int = 0
    by_subject: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def skipped(self) -> int:
        return self.forgotten + self.unknown_key


class RecordOpener:
    """Opens sealed records for a reader; plaintext passes through unchanged.

    With ``worker_key``, a record whose signature is valid for its sealed value leaves
    with a signature of its plaintext, so the readers' identity check (which sees the
    opened value) is the same check as before sealing existed.
    """

    def __init__(self, keyring: Keyring | None, *, worker_key: bytes | None = None) -> None:
        self.keyring = keyring
        self._worker_key = worker_key
        self.counts = OpenCounts()

    def open(self, value: bytes | None, headers: Headers | None) -> tuple[bytes | None, Headers | None] | None:
        """``(value, headers)`` to decode, or None for a record to skip (counted).
        Raises ``TamperedRecord`` for a sealed record that does not open."""
        if not is_sealed(value):
            return value, headers
        assert value is not None
        if self.keyring is None:
            raise UnreadableRecord(value[4:20], False)
        try:
            plain = open_sealed(value, self.keyring)
        except UnreadableRecord as exc:
            if exc.forgotten:
                self.counts.forgotten += 1
            else:
                self.counts.unknown_key += 1
            return None
        if self._worker_key is not None and headers:
            sig = next((v for k, v in headers if k == SIGNATURE_HEADER), None)
            if sig is not None and hmac.compare_digest(sig, signature(self._worker_key, value)):
                headers = signed_for(self._worker_key, plain, headers)
        return plain, [*(headers or ()), (OPENED_HEADER, value[4:20].hex().encode("ascii"))]
