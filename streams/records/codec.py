"""The record codec: the one path from a Kafka record to an event or a dead letter.

Reading is route check (:func:`screen`) -> verify -> open -> upcast -> decode -> gate,
and ends as a :class:`PositionedEvent`, a :class:`DeadLetter` with a one-line reason,
or None (a record of a forgotten subject, skipped and counted). Every reader of the log
goes through it: the projector feed and replay (per batch, :mod:`record_batches`, whose
fast decoder is a strategy of the same decode step), the SDK consumer, the extractor,
the reflector, the sealer's screening and the CLI tail. Every byte is hostile: nothing
here raises on a record, whatever its value, key or headers.

Verification comes before anything acts: a ``SubjectForgotten`` drops keys only once
its signature is checked (:mod:`memstream.streams.sealing.key_records`), a system event is
believed only with the worker's signature (checked on the sealed bytes, before they
are opened), and a reader's own markers (``memstream-opened``) can never come from Kafka.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from memstream.codec.wire import (
    HEADER_CONTENT_TYPE,
    HEADER_SCHEMA_VERSION,
    HEADER_TYPE,
    MAX_RECORD_BYTES,
    DecodeError,
    decode_record,
)
from memstream.domain.access import client_content_problem, system_claim
from memstream.domain.log import LogPosition, PositionedEvent
from memstream.sealing import TamperedRecord
from memstream.streams.dead_letters.publisher import DeadLetter
from memstream.streams.records.inflation_bound import refusal
from memstream.streams.trust.legacy_trust import LegacyTrust, trusted_before
from memstream.streams.sealing.sealed_records import OPENED_HEADER, UNOPENED_HEADER, RecordOpener
from memstream.streams.trust.worker_identity import HEADER as SIGNATURE_HEADER

__all__ = [
    "screen",
    "refused_letter",
    "read_record",
    "decode_or_dead_letter",
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "MAX_KEY_BYTES",
]

Headers = Sequence[tuple[str, bytes | None]]

RESERVED_HEADERS = frozenset({OPENED_HEADER, UNOPENED_HEADER})
"""Headers only a reader adds to a record it holds: never believed from Kafka."""
_ONCE = frozenset({HEADER_TYPE, HEADER_SCHEMA_VERSION, HEADER_CONTENT_TYPE, SIGNATURE_HEADER})
MAX_HEADERS = 64
MAX_HEADER_BYTES = 64 * 1024
MAX_KEY_BYTES = 64 * 1024


def screen(key: Any, headers: Any) -> str | None:
    """The route check: why a record read from Kafka is refused before any other step
    reads it (None: it goes on). Total: any key and headers give an answer."""
    if key is not None and not isinstance(key, (bytes, bytearray)):
        return "record key is not bytes"
    if key is not None and len(key) > MAX_KEY_BYTES:
        return f"record key of {len(key)} bytes (at most {MAX_KEY_BYTES})"
    if not headers:
        return None
    try:
        pairs = list(headers)
    except TypeError:
        return "record headers are not a list"
    if len(pairs) > MAX_HEADERS:
        return f"{len(pairs)} headers (at most {MAX_HEADERS})"
    size = 0
    seen: set[str] = set()
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[0], str):
            return "a header is not a (name, value) pair"
        name, value = pair
        if value is not None and not isinstance(value, (bytes, bytearray)):
            return f"header {name[:64]!r} has a value that is not bytes"
        size += len(name) + len(value or b"")
        if name in RESERVED_HEADERS:
            return f"header {name!r} is set by memstream's readers only, never by a record in Kafka"
        if name in _ONCE:
            if value is None:
                return f"header {name!r} has no value"
            if name in seen:
                return f"header {name!r} appears more than once"
            seen.add(name)
    if size > MAX_HEADER_BYTES:
        return f"headers of {size} bytes (at most {MAX_HEADER_BYTES})"
    return None


def _kept_headers(headers: Any) -> tuple[tuple[str, bytes], ...]:
    """The well-formed headers of a refused record, as its dead letter keeps them."""
    try:
        return tuple(
            (k, bytes(v) if v is not None else b"")
            for k, v in headers or ()
            if isinstance(k, str) and (v is None or isinstance(v, (bytes, bytearray)))
        )
    except (TypeError, ValueError):
        return ()


def refused_letter(reason: str, topic: str, partition: int, offset: int, key: Any, value: Any, headers: Any, stage: str = "decode") -> DeadLetter:
    """The dead letter of a refused record: its bytes and well-formed headers kept as read."""
    return DeadLetter(reason, topic, partition, offset, value, key if isinstance(key, (bytes, type(None))) else None, _kept_headers(headers), stage)


def read_record(
    opener: RecordOpener | None,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Headers | None,
    *,
    trusted: Callable[[bytes | None, Sequence[tuple[str, bytes]] | None], bool] | None = None,
    legacy_trust: LegacyTrust | None = None,
    max_bytes: int = MAX_RECORD_BYTES,
) -> PositionedEvent | DeadLetter | None:
    """One record through every step: screen, open (``opener``, with sealing on),
    verify and decode. None: sealed under a forgotten key (skipped, counted by the
    opener)."""
    refused = screen(key, headers)
    if refused is not None:
        return refused_letter(refused, topic, partition, offset, key, value, headers)
    if opener is not None:
        try:
            opened = opener.open(value, headers)  # type: ignore[arg-type]
        except TamperedRecord as exc:
            return refused_letter(str(exc), topic, partition, offset, key, value, headers)
        if opened is None:
            return None
        value, headers = opened
    return decode_or_dead_letter(
        topic, partition, offset, key, value, headers, trusted=trusted, legacy_trust=legacy_trust, max_bytes=max_bytes,  # type: ignore[arg-type]
    )


def decode_or_dead_letter(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]] | None,
    *,
    max_bytes: int = MAX_RECORD_BYTES,
    trusted: Callable[[bytes | None, Sequence[tuple[str, bytes]] | None], bool] | None = None,
    legacy_trust: LegacyTrust | None = None,
) -> PositionedEvent | DeadLetter:
    """Decode one record; anything unusable becomes a :class:`DeadLetter` (never raises).

    ``trusted``: the worker's producer
    identity check (``memstream.streams.trust.worker_identity.verifier``); with it, a system
    event (``memstream.domain.access.system_claim``) from a record it does not
    accept is a dead letter, unless ``legacy_trust`` (:mod:`memstream.streams.trust.legacy_trust`)
    puts its position in the unsigned past the operator trusts. The marker of a batch refused for inflating past the bound
    (:mod:`memstream.streams.records.inflation_bound`) is a dead letter with that reason."""
    refused = refusal(value, headers)
    if refused is not None:
        return DeadLetter(refused, topic, partition, offset, None, key, tuple((k, v or b"") for k, v in headers or ()), "decode")
    item = _decode_one(topic, partition, offset, key, value, headers, max_bytes)
    if trusted is None or isinstance(item, DeadLetter):
        return item
    claim = system_claim(item.event)
    problem = (
        f"{claim}; the record does not carry the worker's producer identity"
        if claim is not None
        else _refused(client_content_problem(item.event))
    )
    if problem is None or trusted(value, headers):
        return item
    if claim is not None and trusted_before(legacy_trust, topic, partition, offset):
        return item
    return refused_letter(problem, topic, partition, offset, key, value, headers)


def _refused(problem: str | None) -> str | None:
    return None if problem is None else f"a client memory refused by the quality gate: {problem}"


def _decode_one(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]] | None,
    max_bytes: int,
) -> PositionedEvent | DeadLetter:
    try:
        event = decode_record(value, headers, max_bytes=max_bytes)
    except DecodeError as exc:
        return refused_letter(exc.reason, topic, partition, offset, key, value, headers)
    return PositionedEvent(position=LogPosition(topic=topic, partition=partition, offset=offset), event=event)
