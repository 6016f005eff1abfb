"""The wire format: the only place where events become Kafka records and records become events.

Why one module: every producer (the Python SDK, the CLI, the worker, a Java or Go
client following ``schemas/``) and every reader must agree byte for byte, and a record
that cannot be read must fail the same way everywhere, with one readable reason, so
the consumer can route it to the dead-letter topic instead of crashing on it.

The format:

* **value**: the event as compact UTF-8 JSON (``model_dump(mode="json")``, no spaces,
  field order of the model, non-ASCII kept as UTF-8). Encoding is deterministic:
  ``encode(decode(encode(e))) == encode(e)``. NaN and infinities are refused (other
  languages cannot read them), as are lone UTF-16 surrogates (not valid Unicode).
* **headers**: ``memstream-type`` (e.g. ``MemoryAdded``), ``memstream-schema-version``
  (decimal, e.g. ``2``) and ``content-type: application/json``, so routers and tools can
  inspect a record without parsing its body. Headers are optional on read (a plain
  console producer sends none); when present they must agree with the body.
* **key**: ``team_id/user_id`` (:func:`record_key`): all events of one memory space share
  a partition (Kafka's murmur2 partitioner, identical in Java and Python), so they stay
  ordered.
* **size**: a record value is at most :data:`MAX_RECORD_BYTES` (1 MiB, Kafka's default
  ``message.max.bytes``) on both paths, so nothing is written that cannot be read.

Reading runs :func:`memstream.domain.events.parse_event`, which upcasts older
``schema_version``s, so readers only ever see current models.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_core import PydanticSerializationError

from memstream.domain.events import EventBase, EventValidationError, Scope, has_lone_surrogate, parse_event

__all__ = [
    "HEADER_TYPE",
    "HEADER_SCHEMA_VERSION",
    "HEADER_CONTENT_TYPE",
    "CONTENT_TYPE_JSON",
    "MAX_RECORD_BYTES",
    "DecodeError",
    "EncodeError",
    "EncodedRecord",
    "record_key",
    "encode_event",
    "event_headers",
    "decode_record",
    "decode_json_body",
    "header_value",
]

HEADER_TYPE = "memstream-type"
HEADER_SCHEMA_VERSION = "memstream-schema-version"
HEADER_CONTENT_TYPE = "content-type"
CONTENT_TYPE_JSON = "application/json"

MAX_RECORD_BYTES = 1_048_576
"""Largest accepted record value, in bytes (Kafka's default ``message.max.bytes``)."""

# Only JSON escapes can smuggle a lone surrogate into a decoded str (raw UTF-8 input
# cannot hold one), so the costly walk over the parsed object runs only when the text
# holds such an escape.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class DecodeError(ValueError):
    """A record that is not a valid memstream event.

    ``reason`` is one line meant for people and for the dead-letter header;
    ``kind`` is a short stable category (``empty``, ``too-large``, ``not-utf8``,
    ``not-json``, ``not-object``, ``bad-header``, ``header-mismatch``, ``invalid``)
    for metrics and tests.
    """

    def __init__(self, reason: str, kind: str = "invalid") -> None:
        reason = " ".join(reason.split())  # guarantee one line
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


class EncodeError(ValueError):
    """An event that cannot be put on the wire (too large, NaN, invalid Unicode)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class EncodedRecord:
    """What a producer sends: key, value and headers, ready for any Kafka client."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]


def record_key(scope: Scope) -> bytes:
    """The record key of a memory space, ``b"team/user"``.

    The key routes, it does not identify: equal spaces must give equal keys (so one
    space stays on one partition, in order), nothing more. Ids may themselves hold
    ``/``, so two spaces can share a key and a partition, which is harmless; readers
    take the scope from the body, never by splitting the key. The agent is left out on
    purpose: every agent of a user writes into the same ordered space.
    """
    space: str = scope.space
    return space.encode("utf-8")


def event_headers(event: EventBase) -> list[tuple[str, bytes]]:
    """The record headers describing ``event`` (type, schema version, content type):
    a new list each time, of headers made once per event type and version."""
    key = (event.type, event.schema_version)
    made = _HEADERS.get(key)
    if made is None:
        made = _HEADERS[key] = (
            (HEADER_TYPE, event.type.encode("ascii")),
            (HEADER_SCHEMA_VERSION, str(event.schema_version).encode("ascii")),
            (HEADER_CONTENT_TYPE, CONTENT_TYPE_JSON.encode("ascii")),
        )
    return list(made)


_HEADERS: dict[tuple[str, int], tuple[tuple[str, bytes], ...]] = {}


def encode_event(event: EventBase, *, max_bytes: int = MAX_RECORD_BYTES) -> EncodedRecord:
    """Encode ``event`` as a record. Deterministic: equal events give equal bytes.

    Raises :class:`EncodeError` for a value over ``max_bytes``, a non-finite number
    (e.g. NaN in ``metadata``) or a lone surrogate in a string.
    """
    # pydantic's own JSON writer (in Rust) makes the same compact UTF-8 text three times
    # faster than ``json.dumps`` over ``model_dump``. It writes a non-finite number as a
    # bare ``NaN``/``Infinity`` token (the models' ``ser_json_inf_nan``), which no
    # reader accepts: any record whose bytes hold one of those words, and any the
    # writer refuses, is encoded the careful way, which says exactly what is wrong
    # (only events built without validation can hold such values).
    try:
        value: bytes | None = type(event).__pydantic_serializer__.to_json(event)
    except PydanticSerializationError:
        value = None
    if value is None or b"NaN" in value or b"Infinity" in value:
        value = _encode_checked(event)
    if len(value) > max_bytes:
        raise EncodeError(
            f"{event.type} {event.event_id} is {len(value)} bytes encoded; the limit is {max_bytes}"
        )
    return EncodedRecord(key=record_key(event.scope), value=value, headers=event_headers(event))


def _encode_checked(event: EventBase) -> bytes:
    body = event.model_dump(mode="json")
    try:
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:
        raise EncodeError(f"{event.type} {event.event_id}: {exc}") from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise EncodeError(
            f"{event.type} {event.event_id}: a string holds a lone UTF-16 surrogate (not valid Unicode)"
        ) from None


def header_value(headers: Sequence[tuple[str, bytes | None]] | None, name: str) -> bytes | None:
    """The value of header ``name`` (case-sensitive, as Kafka headers are).

    Kafka allows repeated headers; repeated *different* values of one of our headers
    make the record ambiguous, so they raise :class:`DecodeError`.
    """
    found: bytes | None = None
    seen = False
    for key, value in headers or ():
        if key != name:
            continue
        if value is None:
            raise DecodeError(f"header {name} has no value", "bad-header")
        if seen and value != found:
            raise DecodeError(f"header {name} is repeated with different values", "bad-header")
        found, seen = bytes(value), True
    return found


def _header_text(headers: Sequence[tuple[str, bytes | None]] | None, name: str) -> str | None:
    raw = header_value(headers, name)
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise DecodeError(f"header {name} is not UTF-8", "bad-header") from None


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed (JSON has no NaN or Infinity)")


_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_reject_constant)
"""One decoder for every record (``json.loads`` with hooks builds a new one per call)."""


def decode_json_body(value: bytes | bytearray | memoryview | None, *, max_bytes: int = MAX_RECORD_BYTES) -> dict[str, Any]:
    """Bytes -> JSON object, with the checks every memstream reader shares.

    Split out of :func:`decode_record` so tools (the CLI's ``produce``) report exactly
    the same reasons as the consumer does.
    """
    if value is None:
        raise DecodeError("record has no value (a tombstone is not an event)", "empty")
    if len(value) > max_bytes:
        raise DecodeError(f"record is {len(value)} bytes; the limit is {max_bytes}", "too-large")
    data = bytes(value)
    if not data.strip():
        raise DecodeError("record value is empty", "empty")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"not UTF-8: invalid byte at position {exc.start}", "not-utf8") from None
    try:
        body = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise DecodeError(
            f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", "not-json"
        ) from None
    except RecursionError:
        raise DecodeError("not JSON: nested too deeply", "not-json") from None
    except ValueError as exc:  # our number hooks, or an integer with too many digits
        raise DecodeError(f"not JSON: {exc}", "not-json") from None
    if not isinstance(body, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(body), "a number"
        )
        raise DecodeError(f"not a JSON object: the value is {kind}", "not-object")
    if _SURROGATE_ESCAPE.search(text) and has_lone_surrogate(body):
        raise DecodeError("not valid Unicode: a string holds a lone UTF-16 surrogate", "not-json")
    return body


def _check_headers(body: dict[str, Any], headers: Sequence[tuple[str, bytes | None]] | None) -> None:
    if not headers:
        return
    content_type = _header_text(headers, HEADER_CONTENT_TYPE)
    if content_type is not None:
        media = content_type.split(";", 1)[0].strip().lower()
        if media != CONTENT_TYPE_JSON:
            raise DecodeError(
                f"header {HEADER_CONTENT_TYPE} is {content_type[:80]!r}, expected {CONTENT_TYPE_JSON}",
                "header-mismatch",
            )
    htype = _header_text(headers, HEADER_TYPE)
    if htype is not None and htype != body.get("type"):
        raise DecodeError(
            f"header {HEADER_TYPE} {htype[:80]!r} disagrees with the body's type {body.get('type')!r:.80}",
            "header-mismatch",
        )
    hversion = _header_text(headers, HEADER_SCHEMA_VERSION)
    if hversion is not None:
        text = hversion.strip()
        if not text.isascii() or not text.isdigit() or len(text) > 9:
            raise DecodeError(
                f"header {HEADER_SCHEMA_VERSION} {hversion[:40]!r} is not a positive integer",
                "bad-header",
            )
        body_version = body.get("schema_version", 1)
        if isinstance(body_version, bool) or body_version != int(text):
            raise DecodeError(
                f"header {HEADER_SCHEMA_VERSION} {text} disagrees with the body's schema_version {body_version!r:.40}",
                "header-mismatch",
            )


def decode_record(
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]] | None = None,
    *,
    max_bytes: int = MAX_RECORD_BYTES,
    require_envelope: bool = True,
) -> EventBase:
    """Record value (+ optional headers) -> the current event model.

    Raises :class:`DecodeError` and nothing else, whatever the bytes: a consumer can
    route any failure to the dead-letter topic with ``reason`` and go on.

    ``require_envelope`` (the default, for records read from the log) insists on the
    record's own ``event_id`` and ``occurred_at``: defaults filled in by a reader would
    differ on every replay. Producers validating *new* input (``memstream produce``)
    pass False, and the defaults are then fixed once, when the event is encoded.
    """
    body = decode_json_body(value, max_bytes=max_bytes)
    if "type" not in body:  # named first: a header cannot agree with a type that is missing
        raise DecodeError(
            'invalid event: missing field "type" (the event type, e.g. "MemoryAdded"; see schemas/)', "invalid"
        )
    _check_headers(body, headers)
    try:
        return parse_event(body, require_envelope=require_envelope)
    except EventValidationError as exc:
        raise DecodeError(exc.reason, "invalid") from None
    except RecursionError:
        raise DecodeError("invalid event: nested too deeply", "invalid") from None
    except Exception as exc:  # noqa: BLE001 - a poison record must never crash a consumer
        raise DecodeError(f"invalid event: {type(exc).__name__}: {exc}", "invalid") from None
