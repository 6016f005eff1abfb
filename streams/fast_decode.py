"""Fast, conservative read paths for the records the log holds most of: ``MemoryAdded``
(:class:`FastMemoryDecoder`) and the turns, ``MessageObserved`` (:func:`decode_turn`).

Why: the projector and replay read every record of the log, and the general path
(JSON into Python objects, then pydantic with twenty-odd Python validator calls)
costs ~40 µs of interpreter time per ``MemoryAdded``, most of a projector's budget.
Nearly every record on the log is in the canonical form the SDK writes, and for those
``msgspec`` can parse and type-check the bytes in C in one pass, leaving only the
rules that need Python (text limits and control characters, the content hash, times
in UTC, the vector's values) — those are the model's own rule objects, called here.

The contract is one-sided, so the shortcut can never admit what the model refuses:
:meth:`FastMemoryDecoder.decode` returns a record's values only when the record
certainly is a valid ``MemoryAdded`` v2 with a vector of the projector's embedding
model, or with no vector at all (a memory an agent added without one, or one whose
extraction could not embed it: the projector embeds the content), and the values
are those :func:`~memstream.streams.serializer.decode_record` would give. Anything
unusual (an older schema version, another event type, a time in an uncommon ISO
form, ``50.0`` for an integer, an explicit ``null`` where the model has a default,
another model's vector, odd headers, any JSON the C parser dislikes) returns
``None``, and the caller takes the general path, which also produces the exact error
for the dead-letter topic. :func:`decode_turn` keeps the same contract for turns.
``tests/streams/test_fast_decode.py`` and ``tests/streams/test_fast_decode_turns.py``
prove it on generated valid and corrupted records.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, TypeVar, get_args

import msgspec
from annotated_types import Ge, Le
import numpy as np
from pydantic import BaseModel

from memstream.domain.access import is_system_producer
from memstream.domain.content import content_hash
from memstream.domain.events import (
    Identifier,
    Label,
    MemoryAdded,
    MemoryText,
    MemoryType,
    MessageObserved,
    MessageText,
    Name,
    Note,
    Provenance,
    Refs,
    Scene,
    Scope,
    ShortText,
    lenient_entity_kind,
)
from memstream.domain.log import MemoryAddedFields
from memstream.streams.serializer import (
    CONTENT_TYPE_JSON,
    HEADER_CONTENT_TYPE,
    HEADER_SCHEMA_VERSION,
    HEADER_TYPE,
    MAX_RECORD_BYTES,
)

__all__ = ["FastMemoryDecoder", "MemoryAddedFields", "decode_turn"]



def _ids_pattern() -> re.Pattern[str]:
    """Identifiers as the model's ``Identifier`` (its character class and length,
    taken from it), checked for a whole record in one match of the ids joined by
    newlines (:func:`_ids_ok`): faster than a pattern per field."""
    rule = get_args(Identifier)[1]
    chars = rule.pattern.removeprefix("^").removesuffix("+$")
    one = f"{chars}{{{rule.min_length},{rule.max_length}}}"
    return re.compile(rf"{one}(?:\n{one})*")


_IDS = _ids_pattern()


def _ids_ok(ids: list[str]) -> bool:
    """Whether every one of ``ids`` is a valid ``Identifier``. The joined text must
    hold exactly the joining newlines: an id carrying its own newline would otherwise
    pass as two valid ids."""
    joined = "\n".join(ids)
    return joined.count("\n") == len(ids) - 1 and _IDS.fullmatch(joined) is not None


# The one ISO 8601 shape the SDK writes: date, time, up to microseconds, ``Z`` or
# ``+hh:mm``. Other forms the model accepts take the general path.
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?(?:Z|[+-]\d{2}:\d{2})")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _priority_rule() -> tuple[int, int, int]:
    """The model's own bounds and default of ``priority`` (so the two cannot drift)."""
    field = MemoryAdded.model_fields["priority"]
    ge: Any = next(m.ge for m in field.metadata if isinstance(m, Ge))
    le: Any = next(m.le for m in field.metadata if isinstance(m, Le))
    return int(ge), int(le), int(field.default)


_PRIORITY_MIN, _PRIORITY_MAX, _PRIORITY_DEFAULT = _priority_rule()


class _Scope(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    team_id: str
    user_id: str = "default"
    agent_id: str = "default"


class _Entity(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: str
    kind: str = "other"


class _Embedding(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    model: str
    dim: int
    data: bytes  # msgspec reads base64 as strictly as the codec (tested)


def _provenance_methods() -> frozenset[str]:
    """The model's own ``Provenance.method`` values."""
    return frozenset(get_args(Provenance.model_fields["method"].annotation))


class _Provenance(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``Provenance`` as the canonical writer puts it on the wire (the same fields and
    defaults; ``tests/streams/test_fast_decode.py`` checks they cannot drift)."""

    method: str = "agent"
    prompt_id: str | None = None
    prompt_version: str | None = None
    prompt_sha256: str | None = None
    model: str | None = None
    input_refs: list[str] = msgspec.field(default_factory=list)
    output_refs: list[str] = msgspec.field(default_factory=list)
    # msgspec reads JSON integers as floats here, as the model does; never a boolean,
    # a string or a non-finite value.
    latency_ms: Annotated[float, msgspec.Meta(ge=0)] | None = None
    token_usage: dict[str, Annotated[int, msgspec.Meta(ge=0)]] = msgspec.field(default_factory=dict)
    status: str = "ok"
    decisions: list[dict[str, Any]] = msgspec.field(default_factory=list)
    note: str | None = None


class _Envelope(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The fields every event carries (``EventBase``), as the wire holds them."""

    event_id: str
    occurred_at: str
    recorded_at: str | None = None
    scope: _Scope
    session_id: str | None = None
    task_id: str | None = None
    causation_id: str | None = None
    correlation_id: str | None = None
    producer: str | None = None


class _MemoryAdded(_Envelope, forbid_unknown_fields=True, kw_only=True):
    type: Literal["MemoryAdded"]
    schema_version: Literal[2]
    memory_id: str
    content: str
    content_hash: str = ""
    memory_type: str = "episodic"
    priority: Annotated[int, msgspec.Meta(ge=_PRIORITY_MIN, le=_PRIORITY_MAX)] = _PRIORITY_DEFAULT
    scene: str | None = None
    source_message_ids: list[str] = msgspec.field(default_factory=list)
    timestamp: str | None = None
    timestamp_start: str | None = None
    timestamp_end: str | None = None
    entities: list[_Entity] = msgspec.field(default_factory=list)
    # Any JSON object: msgspec refuses NaN, out-of-range numbers, lone surrogates and
    # invalid UTF-8, so what it returns is what the model's JSON rules admit.
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    # Without a vector (an agent's memory, or an extraction that could not embed) the
    # projector embeds the content.
    embedding: _Embedding | None = None
    provenance: _Provenance | None = None


_DECODER = msgspec.json.Decoder(_MemoryAdded)


def _rule(annotated: Any) -> Any:
    """The validator object inside one of the model's ``Annotated[str, rule]`` types."""
    return get_args(annotated)[1]


_MEMORY_TEXT = _rule(MemoryText)
_SCENE = _rule(Scene)
_NAME = _rule(Name)
_SHORT_TEXT = _rule(ShortText)
_LABEL = _rule(Label)
_NOTE = _rule(Note)
_REFS = get_args(Refs)[1].func  # the whole-tuple check of the refs
_METHODS = _provenance_methods()
_CANONICAL_TYPES = frozenset(t.value for t in MemoryType)
_CANONICAL_HEADERS = {
    HEADER_TYPE: b"MemoryAdded",
    HEADER_SCHEMA_VERSION: b"2",
    HEADER_CONTENT_TYPE: CONTENT_TYPE_JSON.encode("ascii"),
}


class _Unsure(Exception):
    """Internal: this record is for the general path to judge."""


def _text(rule: Any, value: str) -> None:
    try:
        rule(value)
    except ValueError:
        raise _Unsure from None


def _utc(value: str) -> datetime:
    if not _TIME.fullmatch(value):
        raise _Unsure
    try:
        return datetime.fromisoformat(value).astimezone(timezone.utc)
    except (ValueError, OverflowError):
        raise _Unsure from None


def _utc_cached(value: str, seen: dict[str, datetime]) -> datetime:
    found = seen.get(value)
    if found is None:
        found = seen[value] = _utc(value)
    return found


_W = TypeVar("_W", bound="_Envelope")
_R = TypeVar("_R")


def _canonical_type(headers: Sequence[tuple[str, bytes | None]] | None, canonical: dict[str, bytes]) -> bool | None:
    """``None`` when one of our headers differs from its ``canonical`` value (the
    record is for the general path), else whether the type header was there (other
    headers are ignored, as the general path ignores them)."""
    typed = False
    for key, header in headers or ():
        want = canonical.get(key)
        if want is not None:
            if header != want:
                return None
            typed = typed or key == HEADER_TYPE
    return typed


def _decoded(value: bytes | None, max_bytes: int, decoder: "msgspec.json.Decoder[_W]", check: Callable[[_W], _R]) -> _R | None:
    """``check`` of the record the C parser typed, or ``None`` (the general path
    decides) for anything the parser or the check is unsure of."""
    if value is None or len(value) > max_bytes:
        return None
    try:
        wire = decoder.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    try:
        return check(wire)
    except _Unsure:
        return None
    except (ValueError, TypeError, RecursionError):  # defensive: unusual input is not ours
        return None


def _check_envelope(w: "_Envelope", own_ids: list[str]) -> None:
    """The envelope's ids (and the event's ``own_ids``) are identifiers and its event
    id a canonical UUID, else :class:`_Unsure`."""
    scope = w.scope
    ids = [scope.team_id, scope.user_id, scope.agent_id, *own_ids]
    for optional in (w.session_id, w.task_id, w.causation_id, w.correlation_id):
        if optional is not None:
            ids.append(optional)
    if not _ids_ok(ids) or not _UUID.fullmatch(w.event_id):
        raise _Unsure


def _provenance(p: _Provenance) -> dict[str, Any]:
    """``Provenance.model_validate(...).model_dump(mode="json")`` of a provenance the
    C parser typed, with the model's own text and JSON rules: validating it through the
    model was half the fast path's time (measured, the extractor's events)."""
    if p.method not in _METHODS:
        raise _Unsure
    for label in (p.prompt_id, p.prompt_version, p.prompt_sha256, p.model):
        if label is not None:
            _text(_LABEL, label)
    _text(_LABEL, p.status)
    if p.note is not None:
        _text(_NOTE, p.note)
    for key in p.token_usage:
        _text(_LABEL, key)
    try:
        _REFS(tuple(p.input_refs))
        _REFS(tuple(p.output_refs))
    except ValueError:
        raise _Unsure from None
    return {
        "method": p.method,
        "prompt_id": p.prompt_id,
        "prompt_version": p.prompt_version,
        "prompt_sha256": p.prompt_sha256,
        "model": p.model,
        "input_refs": p.input_refs,
        "output_refs": p.output_refs,
        "latency_ms": p.latency_ms,
        "token_usage": p.token_usage,
        "status": p.status,
        "decisions": p.decisions,  # JSON objects as the C parser admits them (see metadata)
        "note": p.note,
    }


class FastMemoryDecoder:
    """Decodes canonical ``MemoryAdded`` records carrying a vector of ``model``, or
    none."""

    def __init__(self, model: str, dim: int) -> None:
        self.model = model
        self.dim = dim
        self._data_bytes = dim * 4
        try:
            _NAME(model)
            self.enabled = True
        except ValueError:  # the model refuses such a model name: nothing can match
            self.enabled = False

    @classmethod
    def for_projector(cls, projector: Any, enabled: bool = True) -> "FastMemoryDecoder | None":
        """The decoder matching a projector's embedder and table dimension, or ``None``
        when turned off or when the projector has no such pair (a stand-in)."""
        embedder = getattr(projector, "embedder", None)
        store = getattr(projector, "store", None)
        if not enabled or embedder is None or store is None:
            return None
        return cls(str(embedder.model_id), int(store.embedding_dim))

    def decode(
        self, value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None, *, trusted: bool = False
    ) -> MemoryAddedFields | None:
        """The record's values, or ``None`` when the general path must decide. A record
        not ``trusted`` (signed by the worker) whose producer names a part of the
        worker is left to the general path, which dead-letters it."""
        if not self.enabled or _canonical_type(headers, _CANONICAL_HEADERS) is None:
            return None
        return _decoded(value, MAX_RECORD_BYTES, _DECODER, self._check_trusted if trusted else self._check)

    def _check(self, w: _MemoryAdded) -> MemoryAddedFields:
        if w.producer is not None and is_system_producer(w.producer):
            raise _Unsure
        return self._check_trusted(w)

    def _check_trusted(self, w: _MemoryAdded) -> MemoryAddedFields:
        scope = w.scope
        _check_envelope(w, [w.memory_id, *w.source_message_ids])
        occurred_at = _utc(w.occurred_at)
        # Producers usually repeat one time in several fields: parse each text once.
        times = {w.occurred_at: occurred_at}
        recorded_at = occurred_at if w.recorded_at is None else _utc_cached(w.recorded_at, times)
        if w.producer is not None:
            _text(_SHORT_TEXT, w.producer)
        _text(_MEMORY_TEXT, w.content)
        expected_hash = content_hash(w.content)
        if w.content_hash and w.content_hash != expected_hash:
            raise _Unsure
        memory_type = w.memory_type
        if memory_type not in _CANONICAL_TYPES:
            try:
                memory_type = MemoryType.parse(memory_type).value
            except ValueError:
                raise _Unsure from None
        if w.scene is not None:
            _text(_SCENE, w.scene)
        timestamp = None if w.timestamp is None else _utc_cached(w.timestamp, times)
        start = None if w.timestamp_start is None else _utc_cached(w.timestamp_start, times)
        end = None if w.timestamp_end is None else _utc_cached(w.timestamp_end, times)
        if start and end and end < start:
            raise _Unsure
        entities = []
        for ent in w.entities:
            _text(_NAME, ent.name)
            entities.append((ent.name, lenient_entity_kind(ent.kind)))
        emb = w.embedding
        if emb is None:
            data = b""  # no vector: the projector embeds the content
        elif emb.model != self.model or emb.dim != self.dim or len(emb.data) != self._data_bytes:
            raise _Unsure  # another model's vector: the projector embeds the text itself
        else:
            data = emb.data
        provenance = None if w.provenance is None else _provenance(w.provenance)
        return MemoryAddedFields(  # positional: the fastest way to build it
            w.event_id, occurred_at, recorded_at, scope.team_id, scope.user_id, scope.agent_id,
            w.session_id, w.memory_id, w.content, expected_hash, memory_type, w.priority, w.scene,
            w.source_message_ids, timestamp, start, end, entities, w.metadata, provenance, data,
        )

    def vectors(self, items: Sequence[MemoryAddedFields]) -> tuple[np.ndarray, np.ndarray]:
        """The vectors of ``items`` as an ``(n, dim)`` float32 matrix and a mask of the
        rows whose values are all finite. Rows outside the mask belong to the general
        path (the model refuses them). An item without a vector has a row of zeros (in
        the mask), for the reader to fill once it has embedded the content."""
        n, dim = len(items), self.dim
        if n == 0:
            return np.zeros((0, dim), dtype=np.float32), np.zeros(0, dtype=bool)
        zeros = bytes(self._data_bytes)
        raw = b"".join(item.embedding_data or zeros for item in items)
        # A writable copy: the rows of unembedded items are filled in later.
        matrix = np.frombuffer(raw, dtype="<f4").reshape(n, dim).astype(np.float32)
        return matrix, np.asarray(np.isfinite(matrix).all(axis=1), dtype=bool)


# --------------------------------------------------------------------------------------
# MessageObserved: the other record every projector and extractor reads
# --------------------------------------------------------------------------------------


class _MessageObserved(_Envelope, forbid_unknown_fields=True, kw_only=True):
    type: Literal["MessageObserved"]
    schema_version: Literal[1]
    message_id: str
    role: str = "user"
    speaker: str | None = None
    content: str
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)  # as for MemoryAdded


_TURN_DECODER = msgspec.json.Decoder(_MessageObserved)
_MESSAGE_TEXT = _rule(MessageText)
_ROLES = frozenset(get_args(MessageObserved.model_fields["role"].annotation))
_TURN_HEADERS = {
    HEADER_TYPE: b"MessageObserved",
    HEADER_SCHEMA_VERSION: b"1",
    HEADER_CONTENT_TYPE: CONTENT_TYPE_JSON.encode("ascii"),
}


def decode_turn(
    value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None, *, max_bytes: int = MAX_RECORD_BYTES
) -> MessageObserved | None:
    """A canonical ``MessageObserved`` record as the event
    :func:`~memstream.streams.serializer.decode_record` would return (equal, field for
    field), or ``None`` when the general path must decide: the same one-sided contract
    as :class:`FastMemoryDecoder`. The event is built without a second validation
    (:func:`_built`) from values checked here by the model's own rules. Every turn is
    read by the extractor and the projector; through the model, a turn cost about
    16 µs of interpreter time, here about 9 (measured on the LoCoMo turns)."""
    # Every record a reader of ``messages`` sees comes here first: one without the
    # type header is not worth a parse that would mostly fail.
    if not _canonical_type(headers, _TURN_HEADERS):
        return None
    return _decoded(value, max_bytes, _TURN_DECODER, _turn)


def _turn(w: _MessageObserved) -> MessageObserved:
    scope = w.scope
    _check_envelope(w, [w.message_id])
    if w.role not in _ROLES:
        raise _Unsure
    occurred_at = _utc(w.occurred_at)
    recorded_at = occurred_at if w.recorded_at is None or w.recorded_at == w.occurred_at else _utc(w.recorded_at)
    if w.producer is not None:
        _text(_SHORT_TEXT, w.producer)
    if w.speaker is not None:
        _text(_LABEL, w.speaker)
    _text(_MESSAGE_TEXT, w.content)
    return _built(MessageObserved, {
        "type": "MessageObserved",
        "schema_version": 1,
        "event_id": uuid.UUID(w.event_id),
        "occurred_at": occurred_at,
        "recorded_at": recorded_at,
        "scope": _built(Scope, {"team_id": scope.team_id, "user_id": scope.user_id, "agent_id": scope.agent_id}),
        "session_id": w.session_id,
        "task_id": w.task_id,
        "causation_id": w.causation_id,
        "correlation_id": w.correlation_id,
        "producer": w.producer,
        "message_id": w.message_id,
        "role": w.role,
        "speaker": w.speaker,
        "content": w.content,
        "metadata": w.metadata,
    })


_M = TypeVar("_M", bound=BaseModel)


def _plain(cls: type[BaseModel]) -> bool:
    """Whether ``cls`` holds nothing but its fields (no private attributes, no
    ``model_post_init``, no extra fields): what :func:`_built` can make."""
    return (
        not cls.__private_attributes__
        and not cls.__pydantic_post_init__
        and cls.model_config.get("extra") != "allow"
    )


_PLAIN = {cls: _plain(cls) for cls in (MessageObserved, Scope)}


def _built(cls: type[_M], values: dict[str, Any]) -> _M:
    """``cls.model_construct(**values)`` for a plain model given every field, in a
    quarter of its time: the instance state ``model_construct`` itself writes (its
    field loop is the cost). ``values`` must hold every field of ``cls`` (the
    contract tests compare the result with the validated event)."""
    if not _PLAIN.get(cls, False):
        return cls.model_construct(**values)
    m = cls.__new__(cls)
    object.__setattr__(m, "__dict__", values)
    object.__setattr__(m, "__pydantic_fields_set__", set(values))
    object.__setattr__(m, "__pydantic_extra__", None)
    object.__setattr__(m, "__pydantic_private__", None)
    return m
