"""A fast, conservative read path for the record the log holds most of: ``MemoryAdded``.

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
model, and the values are those :func:`~memstream.streams.serializer.decode_record`
would give. Anything unusual (an older schema version, another event type, a time in
an uncommon ISO form, ``50.0`` for an integer, an explicit ``null`` where the model
has a default, another model's vector, odd headers, any JSON the C parser dislikes)
returns ``None``, and the caller takes the general path, which also produces the
exact error for the dead-letter topic. ``tests/streams/test_fast_decode.py`` proves
the contract on generated valid and corrupted records.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, get_args

import msgspec
from annotated_types import Ge, Le
import numpy as np
from pydantic import ValidationError

from memstream.domain.content import content_hash
from memstream.domain.events import (
    Identifier,
    MemoryAdded,
    MemoryText,
    MemoryType,
    Name,
    Provenance,
    Scene,
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

__all__ = ["FastMemoryDecoder", "MemoryAddedFields"]



def _ids_pattern() -> re.Pattern[str]:
    """Identifiers as the model's ``Identifier`` (its character class and length,
    taken from it), checked for a whole record in one match of the ids joined by
    newlines (no id can hold one): faster than a pattern per field."""
    rule = get_args(Identifier)[1]
    chars = rule.pattern.removeprefix("^").removesuffix("+$")
    one = f"{chars}{{{rule.min_length},{rule.max_length}}}"
    return re.compile(rf"{one}(?:\n{one})*")


_IDS = _ids_pattern()
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


class _MemoryAdded(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    type: Literal["MemoryAdded"]
    schema_version: Literal[2]
    event_id: str
    occurred_at: str
    recorded_at: str | None = None
    scope: _Scope
    session_id: str | None = None
    task_id: str | None = None
    causation_id: str | None = None
    correlation_id: str | None = None
    producer: str | None = None
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
    embedding: _Embedding  # required here: without a vector the projector embeds (general path)
    provenance: dict[str, Any] | None = None


_DECODER = msgspec.json.Decoder(_MemoryAdded)


def _rule(annotated: Any) -> Any:
    """The validator object inside one of the model's ``Annotated[str, rule]`` types."""
    return get_args(annotated)[1]


_MEMORY_TEXT = _rule(MemoryText)
_SCENE = _rule(Scene)
_NAME = _rule(Name)
_SHORT_TEXT = _rule(ShortText)
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


class FastMemoryDecoder:
    """Decodes canonical ``MemoryAdded`` records carrying a vector of ``model``."""

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

    def decode(self, value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None) -> MemoryAddedFields | None:
        """The record's values, or ``None`` when the general path must decide."""
        if not self.enabled or value is None or len(value) > MAX_RECORD_BYTES:
            return None
        for key, header in headers or ():
            want = _CANONICAL_HEADERS.get(key)
            if want is not None and header != want:
                return None
        try:
            wire = _DECODER.decode(value)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        try:
            return self._check(wire)
        except _Unsure:
            return None
        except (ValueError, TypeError, RecursionError):  # defensive: unusual input is not ours
            return None

    def _check(self, w: _MemoryAdded) -> MemoryAddedFields:
        scope = w.scope
        ids = [scope.team_id, scope.user_id, scope.agent_id, w.memory_id, *w.source_message_ids]
        for optional in (w.session_id, w.task_id, w.causation_id, w.correlation_id):
            if optional is not None:
                ids.append(optional)
        if not _IDS.fullmatch("\n".join(ids)) or not _UUID.fullmatch(w.event_id):
            raise _Unsure
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
        if emb.model != self.model or emb.dim != self.dim or len(emb.data) != self._data_bytes:
            raise _Unsure  # another model's vector: the projector embeds the text itself
        provenance = None
        if w.provenance is not None:
            try:
                provenance = Provenance.model_validate(w.provenance).model_dump(mode="json")
            except (ValidationError, RecursionError):
                raise _Unsure from None
        return MemoryAddedFields(  # positional: the fastest way to build it
            w.event_id, occurred_at, recorded_at, scope.team_id, scope.user_id, scope.agent_id,
            w.session_id, w.memory_id, w.content, expected_hash, memory_type, w.priority, w.scene,
            w.source_message_ids, timestamp, start, end, entities, w.metadata, provenance, emb.data,
        )

    def vectors(self, items: Sequence[MemoryAddedFields]) -> tuple[np.ndarray, np.ndarray]:
        """The vectors of ``items`` as an ``(n, dim)`` float32 matrix and a mask of the
        rows whose values are all finite. Rows outside the mask belong to the general
        path (the model refuses them)."""
        n, dim = len(items), self.dim
        if n == 0:
            return np.zeros((0, dim), dtype=np.float32), np.zeros(0, dtype=bool)
        raw = b"".join(item.embedding_data for item in items)
        matrix = np.frombuffer(raw, dtype="<f4").reshape(n, dim).astype(np.float32, copy=False)
        return matrix, np.asarray(np.isfinite(matrix).all(axis=1), dtype=bool)
