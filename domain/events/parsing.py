"""Reading and building events: the one read path (:func:`parse_event`, which upcasts
older schema versions first), the one constructor writers use (:func:`build_event`), and
pydantic's errors as one readable line."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import ValidationError

from memstream.domain.events.models import CURRENT_SCHEMA_VERSIONS, EVENT_TYPES, EventBase
from memstream.domain.events.values import IDENTIFIER_PATTERN, EventValidationError, show
from memstream.domain.upcasting import upcast

E = TypeVar("E", bound=EventBase)

# --- error messages -------------------------------------------------------------------

_MAX_ERRORS_SHOWN = 3
_ISO_EXAMPLE = "e.g. 2025-01-31T09:30:00Z"


def _explain(err: Any) -> str:
    """One pydantic error -> a short human sentence (the field path is added by the caller)."""
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    value = err.get("input")
    msg = str(err.get("msg", "invalid"))
    if kind == "missing":
        return "missing"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "timezone_aware":
        return f"needs a UTC offset (naive date-times are ambiguous), {_ISO_EXAMPLE}"
    if kind in ("datetime_parsing", "datetime_from_date_parsing", "datetime_type", "datetime_object_invalid"):
        return f"is not an ISO 8601 date-time, {_ISO_EXAMPLE}"
    if kind in ("uuid_parsing", "uuid_type", "uuid_version"):
        return "is not a UUID"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        bound = {"greater_than_equal": ">=", "less_than_equal": "<=", "greater_than": ">", "less_than": "<"}[kind]
        limit = next(iter(ctx.values()), "?")
        return f"must be {bound} {limit}, got {show(value, 40)}"
    if kind == "string_too_long":
        size = len(value) if isinstance(value, str) else "?"
        return f"is {size} characters; the limit is {ctx.get('max_length')}"
    if kind == "string_too_short":
        return "is empty"
    if kind == "string_pattern_mismatch" and ctx.get("pattern") == IDENTIFIER_PATTERN:
        return "is not an id (1-128 characters of letters, digits and _.:@/+=-; no spaces or control characters)"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be an integer, got {type(value).__name__}"
    if kind in ("float_type", "float_parsing"):
        if isinstance(value, int) and not isinstance(value, bool):
            return "is out of range for a 64-bit float"
        return f"must be a number, got {type(value).__name__}"
    if kind in ("bool_type", "bool_parsing"):
        return f"must be true or false, got {type(value).__name__}"
    if kind in ("string_type",):
        return f"must be a string, got {type(value).__name__}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be a JSON object, got {type(value).__name__}"
    if kind in ("tuple_type", "list_type"):
        return f"must be a JSON array, got {type(value).__name__}"
    if kind == "finite_number":
        return "must be a finite number"
    if kind in ("recursion_loop", "recursion_depth_exceeded"):
        return "is nested too deeply"
    if kind == "invalid_key":
        return "field names must be strings"
    return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")


_MAX_LOC_PARTS = 4


def _location(loc: tuple[Any, ...]) -> str:
    """``("metadata", "a", "dict", ...)`` -> ``metadata.a.dict...``: short, one line."""
    parts = []
    for part in loc[:_MAX_LOC_PARTS]:
        text = part if isinstance(part, str) else str(part) if isinstance(part, int) else show(part)
        parts.append(text if len(text) <= 60 else text[:57] + "...")
    tail = "..." if len(loc) > _MAX_LOC_PARTS else ""
    return ".".join(parts) + tail or "event"


def describe_validation_error(exc: ValidationError) -> str:
    """pydantic's report as the one line memstream shows everywhere: the first problems,
    each as ``field.path: short sentence`` (used for events, and by the interfaces for
    any input checked with this module's types)."""
    errors = exc.errors()
    parts = [f"{_location(tuple(e.get('loc', ())))}: {_explain(e)}" for e in errors[:_MAX_ERRORS_SHOWN]]
    more = len(errors) - _MAX_ERRORS_SHOWN
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def parse_event(raw: Any, *, require_envelope: bool = False) -> EventBase:
    """The one read path for events: check the type, upcast an older schema version to
    the current one, then validate. Raises :class:`EventValidationError` (one line) and
    nothing else, whatever ``raw`` is.

    With ``require_envelope`` (the path for records read back from the log) the
    event must carry its own ``event_id`` and ``occurred_at``, and a missing
    ``recorded_at`` is taken to equal ``occurred_at``: filled in by the reader they
    would differ on every read, and a replay must rebuild exactly the same view. The
    default (lenient) path is for producers building a new event, where the defaults
    are assigned once, before the event is written.
    """
    if not isinstance(raw, dict):
        raise EventValidationError(f"event must be a JSON object, got {type(raw).__name__}")
    etype = raw.get("type")
    if not isinstance(etype, str) or etype not in EVENT_TYPES:
        raise EventValidationError(
            f"unknown event type {show(etype)} (known: {', '.join(sorted(EVENT_TYPES))})"
        )
    if "scope" not in raw or raw["scope"] is None or raw["scope"] == {}:
        raise EventValidationError("scope: missing (every event needs a scope with a team_id)")
    try:
        upgraded = upcast(raw, CURRENT_SCHEMA_VERSIONS[etype])
    except ValueError as exc:
        raise EventValidationError(str(exc)) from None
    if require_envelope:
        for name in ("event_id", "occurred_at"):
            if upgraded.get(name) is None:
                raise EventValidationError(f"{name}: missing (a record on the log must carry its own)")
        if upgraded.get("recorded_at") is None:
            upgraded = {**upgraded, "recorded_at": upgraded["occurred_at"]}
    try:
        return EVENT_TYPES[etype].model_validate(upgraded)
    except ValidationError as exc:
        raise EventValidationError(describe_validation_error(exc)) from None
    except RecursionError:
        raise EventValidationError("event is nested too deeply") from None



def build_event(cls: type[E], /, **fields: Any) -> E:
    """The one constructor every writer (HTTP, MCP, SDK, CLI, producer) builds a new
    event of type ``cls`` with: ``fields`` as plain values (JSON-like, or the models'
    own types), ``None`` meaning "not given" (the model's default applies). It takes
    the read path, :func:`parse_event`, so a new event obeys exactly the rules a
    reader applies; ``event_id`` and the times default to fresh values once, here.
    Raises :class:`EventValidationError` (one line)."""
    etype: str = cls.model_fields["type"].default
    raw = {k: v for k, v in fields.items() if v is not None}
    raw.update(type=etype, schema_version=CURRENT_SCHEMA_VERSIONS[etype])
    event = parse_event(raw)
    if not isinstance(event, cls):  # pragma: no cover - parse_event dispatches on type
        raise EventValidationError(f"type: expected {cls.__name__}, got {event.type}")
    return event
