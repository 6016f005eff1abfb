"""Value rules of the event fields: identifiers, bounded clean text, numbers, UTC
times, JSON objects, and the one-line error every refusal carries.

Each rule is an ``Annotated`` type, so the models, the published JSON Schemas and the
fast decoder (``memstream.codec.fast_decode``) all read it from one place.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BeforeValidator,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    JsonValue,
    Strict,
    StringConstraints,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic.types import AllowInfNan
from pydantic_core import core_schema

MAX_MESSAGE_CHARS = 32_000
"""Longest L0 conversation turn (``MessageObserved.content``), in Unicode code points."""
MAX_MEMORY_CHARS = 8_000
"""Longest memory, reflection or decision text, in Unicode code points."""

IDENTIFIER_PATTERN = r"^[A-Za-z0-9_.:@/+=\-]+$"
Identifier = Annotated[
    str,
    StringConstraints(min_length=1, max_length=128, pattern=IDENTIFIER_PATTERN),
]
"""An id: 1..128 characters of letters, digits and ``_.:@/+=-`` (no spaces, no controls)."""

# --- small reusable value rules -------------------------------------------------------

# C0 controls except tab, LF, CR, plus lone surrogates (unencodable as UTF-8).
_BAD_MULTILINE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff]")
_BAD_ONE_LINE = re.compile("[\x00-\x1f\ud800-\udfff]")
# The same sets as JSON Schema (ECMA-262 and Python ``re`` read these escapes alike).
_BAD_MULTILINE_JS = "[\\u0000-\\u0008\\u000B\\u000C\\u000E-\\u001F\\uD800-\\uDFFF]"
_BAD_ONE_LINE_JS = "[\\u0000-\\u001F\\uD800-\\uDFFF]"


def show(value: Any, limit: int = 60) -> str:
    """A short, one-line rendering of untrusted input for error messages."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # e.g. an int too long to print
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bad_character(value: str, multiline: bool) -> str | None:
    match = (_BAD_MULTILINE if multiline else _BAD_ONE_LINE).search(value)
    if match is None:
        return None
    code = ord(match.group())
    if 0xD800 <= code <= 0xDFFF:
        return f"holds an unpaired surrogate U+{code:04X} at position {match.start()} (not valid Unicode)"
    allowed = (
        "only tab, newline and carriage return are allowed"
        if multiline
        else "a one-line field allows no control characters"
    )
    return f"holds control character U+{code:04X} at position {match.start()} ({allowed})"


@dataclass(frozen=True)
class TextRule:
    """A string rule: length bound, no forbidden characters, optionally non-blank.

    A marker for ``Annotated[str, TextRule(...)]``: it adds one validator and publishes
    the same constraints in the JSON Schema, so the schema and the model agree.
    """

    max_chars: int
    multiline: bool = True
    required: bool = True
    per_item: bool = True
    """False: the rule is checked by the enclosing tuple's validator (:meth:`check_all`),
    all items at once; the item's schema still publishes the rule."""

    def __call__(self, value: str) -> str:
        if self.required and not value.strip():
            raise ValueError("is empty (it needs at least one non-whitespace character)")
        if len(value) > self.max_chars:
            raise ValueError(f"is {len(value)} characters; the limit is {self.max_chars}")
        problem = _bad_character(value, self.multiline)
        if problem:
            raise ValueError(problem)
        return value

    def check_all(self, values: tuple[str, ...]) -> tuple[str, ...]:
        """The rule over every item, in a few C-level passes over the whole tuple;
        only a tuple that fails is walked item by item for the message. Provenance
        lists carry dozens of refs per event, and a Python call per ref was a fifth of
        the projector's decoding of a memory event (docs/benchmarks-history.md)."""
        if not values:
            return values
        bad = _BAD_MULTILINE if self.multiline else _BAD_ONE_LINE
        if (
            max(map(len, values)) <= self.max_chars
            and bad.search("".join(values)) is None
            and (not self.required or all(map(str.strip, values)))
        ):
            return values
        for index, value in enumerate(values):
            try:
                self(value)
            except ValueError as exc:
                raise ValueError(f"item {index} {exc}") from None
        return values

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        if not self.per_item:
            return handler(source)
        return core_schema.no_info_after_validator_function(self, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        js = handler(schema)
        js["maxLength"] = self.max_chars
        if self.required:
            js["minLength"] = 1
            js["pattern"] = "\\S"
        js["not"] = {"pattern": _BAD_MULTILINE_JS if self.multiline else _BAD_ONE_LINE_JS}
        return js


@dataclass(frozen=True)
class SchemaNote:
    """Adds documentation-only keywords to a type's JSON Schema."""

    extra: tuple[tuple[str, Any], ...]

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        js = handler(schema)
        js.update(dict(self.extra))
        return js


# Field types of the models (text fields: limit, one-line or not, blank allowed or not).
MessageText = Annotated[str, TextRule(MAX_MESSAGE_CHARS)]
MemoryText = Annotated[str, TextRule(MAX_MEMORY_CHARS)]
OptionalMemoryText = Annotated[str, TextRule(MAX_MEMORY_CHARS, required=False)]
Note = Annotated[str, TextRule(2000, required=False)]
Scene = Annotated[str, TextRule(500, required=False)]
Name = Annotated[str, TextRule(200, multiline=False)]
Label = Annotated[str, TextRule(200, multiline=False, required=False)]
Ref = Annotated[str, TextRule(512, multiline=False)]
_REF_ITEM = TextRule(512, multiline=False, per_item=False)
Refs = Annotated[tuple[Annotated[str, _REF_ITEM], ...], AfterValidator(_REF_ITEM.check_all)]
"""A tuple of refs, checked as a whole (same rule as :data:`Ref`)."""
ShortText = Annotated[str, TextRule(512, multiline=False, required=False)]


def _number_input(value: Any) -> Any:
    """Numbers must arrive as numbers: ``"50"`` or ``true`` for a priority is a producer
    bug worth reporting, not a value to coerce. Integral floats (``50.0``, as some JSON
    libraries write them) and numpy scalars are accepted."""
    if isinstance(value, (bool, str, bytes, bytearray)):
        raise ValueError(f"must be a number, got {type(value).__name__}")
    return value


Number = BeforeValidator(_number_input)
"""Put it *last* in ``Annotated[...]``: it still runs first, and the bounds before it stay
in the JSON Schema as ``minimum``/``maximum``."""
StrictBool = Annotated[bool, Strict()]
FiniteFloat = Annotated[float, AllowInfNan(False), Number]
"""A JSON number (ints accepted), never a string or boolean, never NaN or infinite."""


def _datetime_input(value: Any) -> Any:
    """Refuse numbers and numeric strings: pydantic would read them as epoch seconds or
    milliseconds by magnitude, and a guess is not a fact worth keeping forever."""
    if isinstance(value, (bool, int, float)) or (
        isinstance(value, str) and _NUMERIC.fullmatch(value.strip())
    ):
        raise ValueError(
            "must be an ISO 8601 date-time with a UTC offset (e.g. 2025-01-31T09:30:00Z), not a number"
        )
    return value


_NUMERIC = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _to_utc(value: datetime) -> datetime:
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:
        raise ValueError("is out of the representable range once converted to UTC") from None


UtcDatetime = Annotated[AwareDatetime, BeforeValidator(_datetime_input), AfterValidator(_to_utc)]
"""A timezone-aware time, stored in UTC; naive times and numbers are refused."""


def _json_items(value: Any) -> Iterator[Any]:
    """Every node of a JSON tree (objects' keys included), depth first, without
    recursion: a tree nested a thousand levels deep must not overflow the stack."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        yield item
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def has_lone_surrogate(value: Any) -> bool:
    """Whether a string anywhere in a JSON tree (keys included) holds an unpaired UTF-16
    surrogate: not valid Unicode, and not encodable as UTF-8. The model refuses such
    text; the serializer checks decoded record bodies with the same walk."""
    return any(isinstance(item, str) and _SURROGATE.search(item) for item in _json_items(value))


def _check_json_tree(value: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """pydantic's ``JsonValue`` admits NaN, infinities and lone surrogates; JSON does not.

    The C encoder refuses both (a non-finite number; a lone surrogate once encoded to
    UTF-8) and walks a small tree several times faster than the generator below, which
    then runs only for a refused or very deep tree, to find the reason.
    """
    if not value:
        return value
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
        return value
    except (ValueError, UnicodeEncodeError, RecursionError, TypeError):
        pass
    for item in _json_items(value):
        if isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError("holds a non-finite number (JSON has no NaN or Infinity)")
        elif isinstance(item, str):
            if _SURROGATE.search(item):
                raise ValueError("holds an unpaired surrogate (not valid Unicode)")
    return value


_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_TUPLE_DEPTH = 64


def _tuples_to_lists(value: Any, depth: int = 0) -> Any:
    """Python callers may build metadata with tuples; JSON reads them back as arrays, so
    they are stored as lists from the start (an event equals its own round trip)."""
    if depth > _MAX_TUPLE_DEPTH:
        return value  # far deeper than any sane metadata; validation reports it
    if isinstance(value, tuple):
        return [_tuples_to_lists(v, depth + 1) for v in value]
    if isinstance(value, list) and any(isinstance(v, (tuple, list, dict)) for v in value):
        return [_tuples_to_lists(v, depth + 1) for v in value]
    if isinstance(value, dict) and any(isinstance(v, (tuple, list, dict)) for v in value.values()):
        return {k: _tuples_to_lists(v, depth + 1) for k, v in value.items()}
    return value


JsonObject = Annotated[
    dict[str, JsonValue], AfterValidator(_check_json_tree), BeforeValidator(_tuples_to_lists)
]
"""A JSON object: string keys, JSON values, finite numbers."""


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC (naive datetimes are rejected everywhere).

    Only used as the default of an envelope's times when a producer builds an event;
    domain logic never reads the clock (it takes ``now`` as an argument).
    """
    return datetime.now(timezone.utc)


JSON_TYPE_VALIDATORS = frozenset({_number_input, _datetime_input, _to_utc, _tuples_to_lists, _check_json_tree})
"""Validators that refuse nothing a typed JSON reader refuses already when it reads
JSON numbers as numbers, times as text it parses to UTC itself and objects as JSON:
the fast decoder (``memstream.codec.fast_decode``) skips them and runs every other."""


def new_event_id() -> uuid.UUID:
    """A fresh random (version 4) event id, the idempotency key of an event."""
    return uuid.uuid4()


class EventValidationError(ValueError):
    """An event that cannot be accepted; ``reason`` is one readable line."""

    def __init__(self, reason: str) -> None:
        reason = _one_line(reason)
        super().__init__(reason)
        self.reason = reason


def _one_line(text: str) -> str:
    """Escape control characters so a reason always prints as one line."""
    return _BAD_ONE_LINE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else "?", text)

