"""A fast, conservative reader of canonical records, derived from the event models.

The general path (JSON into Python objects, then pydantic) costs tens of µs of
interpreter time per ``MemoryAdded``, and the projector reads every record of the log.
Here ``msgspec`` parses and types the bytes in C. Its structs are generated at import
from the pydantic models' fields (names, types, bounds, defaults); the rules that need
Python (text limits, field and model validators) are the models' own objects, called
here. Nothing is mirrored by hand: a field added to a model is read here unchanged, and
a rule of a kind this module cannot derive stops the import with ``TypeError``.

The contract is one-sided: :meth:`FastDecoder.decode` returns an event's
:func:`~memstream.codec.values.event_values`, as a :class:`~memstream.codec.values.ValuesRecord`, only when the record certainly is a valid
current-version event, and ``None`` for anything unusual (an older schema version, a
time in an uncommon ISO form, ``50.0`` for an integer, ``null`` where the model has a
default, odd headers...), for the general path to decide (and to give the exact
dead-letter reason).
"""

from __future__ import annotations

import types
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Literal, NamedTuple, Union, cast, get_args, get_origin

import msgspec
import numpy as np
from annotated_types import Ge, Gt, Le, Lt
from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, JsonValue, Strict, StringConstraints
from pydantic.types import AllowInfNan

from memstream.codec.value_checks import UUID, Check, Pattern, Unsure, chain, finite, optional, utc
from memstream.codec.values import SCOPE_FIELD, ValuesRecord, record_type, vector_field
from memstream.codec.wire import CONTENT_TYPE_JSON, HEADER_CONTENT_TYPE, HEADER_SCHEMA_VERSION, HEADER_TYPE, MAX_RECORD_BYTES
from memstream.domain.access import is_system_producer
from memstream.domain.events import (
    JSON_TYPE_VALIDATORS,
    WIRE_REQUIRED_FIELDS,
    EventBase,
    MemoryAdded,
    Name,
    SchemaNote,
    TextRule,
)

__all__ = ["FastDecoder", "FastMemory", "FastMemoryDecoder"]

def _cannot(what: Any) -> TypeError:
    return TypeError(f"the fast decoder cannot derive a reader for {what!r}; teach memstream.codec.fast_decode")


@dataclass(frozen=True)
class _Shape:
    """How one type is read: its msgspec type, and the check that turns the decoded
    value into its plain value (``None``: kept as decoded)."""

    wire: Any
    check: Check | None = None
    optional: bool = False
    """``None`` is allowed and skips ``check``."""

    def full_check(self) -> Check | None:
        """``check``, skipping ``None`` when the type is optional."""
        return optional(self.check) if self.optional else self.check


def _rules(metadata: Sequence[Any]) -> tuple[dict[str, Any], list[Check], list[Check]]:
    """Constraints msgspec checks in C, and the Python checks before and after the
    type's own, from ``Annotated`` metadata."""
    meta: dict[str, Any] = {}
    before: list[Check] = []
    after: list[Check] = []
    for m in metadata:
        if isinstance(m, (Ge, Gt, Le, Lt)):
            key = type(m).__name__.lower()
            meta[key] = getattr(m, key)
        elif isinstance(m, StringConstraints):
            if m.min_length is not None:
                meta["min_length"] = m.min_length
            if m.max_length is not None:
                meta["max_length"] = m.max_length
            if m.pattern is not None:
                after.append(Pattern(str(m.pattern)))
        elif isinstance(m, TextRule):
            if m.per_item:
                after.append(m)
        elif isinstance(m, (SchemaNote, Strict)) or (isinstance(m, AllowInfNan) and not m.allow_inf_nan):
            continue
        elif isinstance(m, (BeforeValidator, AfterValidator)):
            if m.func not in JSON_TYPE_VALIDATORS:
                (before if isinstance(m, BeforeValidator) else after).append(cast(Check, m.func))
        else:
            raise _cannot(m)
    return meta, before, after


def _shape(annotation: Any, metadata: Sequence[Any] = ()) -> _Shape:
    """The reader of one field type (``metadata``: its ``Annotated`` extras)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *extras = get_args(annotation)
        return _shape(base, [*extras, *metadata])
    if origin in (Union, types.UnionType):
        args = get_args(annotation)
        rest = [a for a in args if a is not type(None)]
        if len(args) != 2 or len(rest) != 1:
            raise _cannot(annotation)
        inner = _shape(rest[0], metadata)
        return _Shape(Union[inner.wire, None], inner.full_check(), optional=True)
    meta, before, after = _rules(metadata)
    if origin is Literal:
        wire, own = annotation, None
    elif origin is tuple:
        wire, own = _tuple_shape(annotation)
    elif origin is dict:
        wire, own = _dict_shape(annotation)
    elif isinstance(annotation, type):
        wire, own = _class_shape(annotation)
    elif annotation is JsonValue:
        wire, own = Any, None
    else:
        raise _cannot(annotation)
    if meta:
        wire = Annotated[wire, msgspec.Meta(**meta)]
    return _Shape(wire, chain([*before, *([own] if own else []), *after]))


def _tuple_shape(annotation: Any) -> tuple[Any, Check | None]:
    args = get_args(annotation)
    if len(args) != 2 or args[1] is not Ellipsis:
        raise _cannot(annotation)
    item = _shape(args[0])
    pattern = item.check
    if isinstance(pattern, Pattern) and not item.optional:
        return _generic(list, item.wire), (lambda v: pattern.all(v) if v else v)
    check = item.full_check()
    return _generic(list, item.wire), (None if check is None else (lambda v: [check(x) for x in v]))


def _dict_shape(annotation: Any) -> tuple[Any, Check | None]:
    key, value = (_shape(a) for a in get_args(annotation))
    kc, vc = key.full_check(), value.full_check()
    if kc is None and vc is None:
        return _generic(dict, key.wire, value.wire), None
    kc = kc or (lambda k: k)
    vc = vc or (lambda v: v)
    return _generic(dict, key.wire, value.wire), (lambda d: {kc(k): vc(v) for k, v in d.items()})


def _generic(origin: Any, *args: Any) -> Any:
    """``list[t]`` / ``dict[k, v]`` of types known only at run time."""
    return origin[args[0] if len(args) == 1 else args]


def _enum_check(cls: type[Enum]) -> Check:
    allowed = frozenset(m.value for m in cls)

    def check(v: Any) -> Any:
        v = v.value if isinstance(v, Enum) else v
        if v not in allowed:
            raise Unsure
        return v

    return check


def _class_shape(cls: type) -> tuple[Any, Check | None]:
    if issubclass(cls, BaseModel):
        reader = _ModelReader(cls)
        return reader.struct, reader.values
    if issubclass(cls, Enum):
        return str, _enum_check(cls)
    if cls is AwareDatetime or issubclass(cls, datetime):
        return str, utc
    if cls is uuid.UUID:
        return str, UUID
    if cls is float:
        return float, finite
    if cls in (str, int, bool):
        return cls, None
    raise _cannot(cls)


def _field_validators(cls: type[BaseModel], name: str) -> list[Check]:
    """``cls``'s ``mode="before"`` field validators of ``name`` (bound methods)."""
    found = []
    for dec in cls.__pydantic_decorators__.field_validators.values():
        if name in dec.info.fields:
            if dec.info.mode != "before":
                raise _cannot(f"{cls.__name__}.{dec.cls_var_name} (mode {dec.info.mode})")
            found.append(dec.func)
    return found


def _canonical_first(annotation: Any, validators: list[Check], check: Check | None) -> Check | None:
    """For an enum field whose validators leave every canonical value as it is (tried
    here, at import), a check that passes canonical values without running them."""
    if not (validators and isinstance(annotation, type) and issubclass(annotation, Enum)) or check is None:
        return check
    allowed = frozenset(m.value for m in annotation)
    try:
        if any(check(v) != v for v in allowed):
            return check
    except (ValueError, TypeError, Unsure):
        return check
    full = check
    return lambda v: v if v in allowed else full(v)


def _model_validators(cls: type[BaseModel]) -> list[Check]:
    found = []
    for dec in cls.__pydantic_decorators__.model_validators.values():
        if dec.info.mode != "after":
            raise _cannot(f"{cls.__name__}.{dec.cls_var_name} (mode {dec.info.mode})")
        found.append(dec.func)
    return found


_CONTAINER_FACTORIES = {dict: dict, list: list, tuple: list}


class _Embedding(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The vector field (``EmbeddingPayload``); ``data`` is base64 on the wire, which
    msgspec decodes as strictly as the codec (tested)."""

    model: str
    dim: int
    data: bytes


def _struct_field(cls: type[BaseModel], name: str, info: Any, wire: Any, top: bool) -> tuple[Any, ...]:
    """One msgspec struct field: name, type and the model's default (none for what
    the wire must carry, see :class:`_ModelReader`)."""
    if info.is_required() or (top and name in WIRE_REQUIRED_FIELDS):
        return (name, wire)
    if info.default_factory is not None:
        factory = _CONTAINER_FACTORIES.get(info.default_factory)
        return (name, wire) if factory is None else (name, wire, msgspec.field(default_factory=factory))
    default = info.default
    if isinstance(default, (tuple, list, dict)):
        if default:
            raise _cannot(f"{cls.__name__}.{name} default {default!r}")
        return (name, wire, msgspec.field(default_factory=_CONTAINER_FACTORIES[type(default)]))
    return (name, wire, default.value if isinstance(default, Enum) else default)


class _View:
    """What a model validator is given: the values as attributes."""


class _ModelReader:
    """A model's msgspec struct and the check of its values, generated from its fields.

    Wire rules of events (``top``): the envelope fields of ``WIRE_REQUIRED_FIELDS`` are
    required; ``recorded_at`` may be absent (it is then ``occurred_at``, as
    ``parse_event`` reads it); any other field whose default is made by a function
    (an id, a time) is required too, since a reader must never invent one. The vector
    field is read by :class:`FastMemoryDecoder`, not here."""

    def __init__(
        self, cls: type[BaseModel], *, top: bool = False, skip: str | None = None, flatten: str | None = None
    ) -> None:
        self.cls = cls
        self.skip = skip
        self.names = [n for n in cls.model_fields if n != skip]
        fields: list[tuple[Any, ...]] = []
        self.always: list[tuple[str, Check]] = []  # checked whatever the value
        self.unless_none: list[tuple[str, Check]] = []  # checked unless None
        self.patterned: dict[str, tuple[Pattern, list[str]]] = {}  # one joined match per pattern
        for name, info in cls.model_fields.items():
            if name == skip:
                continue
            shape = _shape(info.annotation, info.metadata)
            validators = _field_validators(cls, name)
            optional = shape.optional and not validators  # a validator sees None too
            check = chain([*validators, *([c] if (c := shape.check if optional else shape.full_check()) else [])])
            check = _canonical_first(info.annotation, validators, check)
            wire = shape.wire
            if top and name == "recorded_at":  # absent: occurred_at (see the class docstring)
                wire, optional = Union[wire, None], True
                fields.append((name, wire, None))
            else:
                fields.append(_struct_field(cls, name, info, wire, top))
            if isinstance(check, Pattern):
                self.patterned.setdefault(check.pattern, (check, []))[1].append(name)
            elif check is not None:
                (self.unless_none if optional else self.always).append((name, check))
        self.validators = _model_validators(cls)
        self.struct = msgspec.defstruct(
            f"{cls.__name__}Wire", fields, kw_only=True, forbid_unknown_fields=True, module=__name__
        )
        self.record = record_type(cls) if top else None  # type: ignore[arg-type]  # top models are events (hashable classes)
        self.values = self._generate_values(flatten)
        """The plain values of a decoded struct, checked by the model's rules."""

    def _generate_values(self, flatten: str | None) -> Callable[[Any], Any]:
        """The check of a decoded struct as one straight-line function, generated here
        from the model's fields (as ``dataclasses`` generates ``__init__``): the
        projector reads every record through it (costs in docs/benchmarks-history.md). The model field ``flatten`` (a model without validators) is read in line: its
        values take its place in the result, and its patterns join ours."""
        code = _Code()
        inner: _ModelReader | None = None
        for name in self.names:
            sub = self.cls.model_fields[name].annotation if name == flatten else None
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                inner = _ModelReader(sub)
                if inner.validators:
                    raise _cannot(f"{sub.__name__} read in line with model validators")
                code.read(f"w.{name}", inner, prefix=f"{name}__")
            else:
                code.read_field("w", name, name)
        code.check(self, prefix="", skip=flatten if inner is not None else None)
        if inner is not None:
            code.check(inner, prefix=f"{flatten}__")
        code.validators = tuple(self.validators)
        return code.compile(self.cls.__name__, self.record)


class _Code:
    """The source of a generated ``values`` function, and the objects it calls."""

    def __init__(self) -> None:
        self.reads: list[str] = []
        self.checks: list[str] = []
        self.out: list[tuple[str, str]] = []  # (key, local variable)
        self.patterns: dict[str, tuple[Pattern, list[str]]] = {}  # one joined match each
        self.scope: dict[str, Any] = {"_View": _View, "Unsure": Unsure}
        self.validators: tuple[Check, ...] = ()
        self.first_time: str | None = None  # the first time field checked

    def read_field(self, source: str, name: str, var: str) -> None:
        if not name.isidentifier():
            raise _cannot(f"field name {name!r}")
        self.reads.append(f"    {var} = {source}.{name}")
        self.out.append((name, var))

    def read(self, source: str, reader: "_ModelReader", prefix: str) -> None:
        self.reads.append(f"    {prefix}w = {source}")
        for name in reader.names:
            self.read_field(f"{prefix}w", name, prefix + name)

    def check(self, reader: "_ModelReader", prefix: str, skip: str | None = None) -> None:
        for pattern, names in reader.patterned.values():
            self.patterns.setdefault(pattern.pattern, (pattern, []))[1].extend(prefix + n for n in names)
        for name, check in reader.always:
            if name != skip:
                self._check_one(prefix + name, check, "")
        for name, check in reader.unless_none:
            if name != skip:
                self._check_one(prefix + name, check, f"if {prefix + name} is not None: ")

    def _check_one(self, var: str, check: Check, guard: str) -> None:
        """The line checking ``var``. A time equal to an earlier time field of the record
        (``recorded_at`` is mostly ``occurred_at``) takes that field's parsed value."""
        self.scope[f"c_{var}"] = check
        call = f"c_{var}({var})"
        if check is utc:
            if self.first_time is None:
                self.first_time = var
                self.checks.append(f"    {var}__raw = {var}")
            else:
                call = f"{self.first_time} if {var} == {self.first_time}__raw else {call}"
        self.checks.append(f"    {guard}{var} = {call}")

    def source(self, record: bool) -> str:
        """A record (``record_type``) of the values, or for a nested model a dict."""
        lines = list(self.reads)
        for i, (pattern, names) in enumerate(self.patterns.values()):
            if len(names) == 1:
                self.scope[f"p{i}"] = pattern.one.fullmatch
                lines.append(f"    if {names[0]} is not None and not p{i}({names[0]}): raise Unsure")
            else:
                self.scope[f"p{i}"] = pattern
                lines.append(f"    p{i}.all([v for v in ({', '.join(names)},) if v is not None])")
        lines += self.checks
        if record:
            lines.append("    out = new(Record)")
            lines += [f"    out.{key} = {var}" for key, var in self.out]
            view = "out"
        else:
            lines.append("    out = {" + ", ".join(f"{key!r}: {var}" for key, var in self.out) + "}")
            lines += ["    view = _View()", "    object.__setattr__(view, '__dict__', out)  # reads and writes go to out"]
            view = "view"
        if self.validators:
            self.scope["validators"] = self.validators
            lines.append(f"    for validator in validators: validator({view})")
        return "def values(w):\n" + "\n".join([*lines, "    return out"]) + "\n"

    def compile(self, name: str, record: type[ValuesRecord] | None) -> Callable[[Any], Any]:
        if record is not None and tuple(key for key, _ in self.out) != record.names:
            raise _cannot(f"{name}: its values and {record.__name__} differ")
        self.scope.update(Record=record, new=object.__new__)
        exec(compile(self.source(record is not None), f"<{name} reader>", "exec"), self.scope)
        return cast(Callable[[Any], Any], self.scope["values"])


class FastDecoder:
    """Reads canonical records of one event type ``cls`` (current schema version) into
    their :func:`~memstream.codec.values.event_values`, without the vector field."""

    def __init__(self, cls: type[EventBase]) -> None:
        self.cls = cls
        self.vector = vector_field(cls)  # type: ignore[arg-type]  # classes are hashable
        etype, version = cls.model_fields["type"].default, cls.model_fields["schema_version"].default
        self.headers = {
            HEADER_TYPE: etype.encode("ascii"),
            HEADER_SCHEMA_VERSION: str(version).encode("ascii"),
            HEADER_CONTENT_TYPE: CONTENT_TYPE_JSON.encode("ascii"),
        }
        self.reader = _ModelReader(cls, top=True, skip=self.vector, flatten=SCOPE_FIELD)
        self.struct: Any = self.reader.struct
        if self.vector is not None:
            self.struct = msgspec.defstruct(
                f"{cls.__name__}WireWithVector",
                [(self.vector, Union[_Embedding, None], None)],
                bases=(self.reader.struct,), kw_only=True, forbid_unknown_fields=True, module=__name__,
            )
        self._decoder = msgspec.json.Decoder(self.struct)

    def headers_ok(self, headers: Sequence[tuple[str, bytes | None]] | None) -> bool:
        """Whether none of our headers differs from its canonical value (others are
        ignored, as the general path ignores them)."""
        for key, value in headers or ():
            want = self.headers.get(key)
            if want is not None and value != want:
                return False
        return True

    def wire(self, value: bytes | None) -> Any:
        """The record typed by msgspec, or ``None``."""
        if value is None or len(value) > MAX_RECORD_BYTES:
            return None
        try:
            return self._decoder.decode(value)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None

    def values(self, wire: Any) -> ValuesRecord | None:
        """The checked, flat values of a typed record, or ``None``."""
        try:
            out = self.reader.values(wire)
        except (Unsure, ValueError, TypeError, AttributeError, OverflowError, RecursionError):
            return None
        if out.recorded_at is None:
            out.recorded_at = out.occurred_at
        return out

    def decode(self, value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None) -> ValuesRecord | None:
        """The values of a canonical record of this type, or ``None``."""
        if not self.headers_ok(headers):
            return None
        wire = self.wire(value)
        return None if wire is None else self.values(wire)


class FastMemory(NamedTuple):
    """A ``MemoryAdded`` read on the fast path."""

    values: ValuesRecord
    """:func:`~memstream.codec.values.event_values` of the event as a record (no vector)."""
    vector: bytes
    """Little-endian float32 (``dim * 4`` bytes), or empty when the event carries no
    vector (the reader embeds its content)."""


class FastMemoryDecoder:
    """Reads canonical ``MemoryAdded`` records carrying a vector of ``model`` (of
    ``dim`` values), or none; a vector of another model is for the general path."""

    def __init__(self, model: str, dim: int) -> None:
        self.model = model
        self.dim = dim
        self._data_bytes = dim * 4
        self._events = _MEMORIES
        try:
            get_args(Name)[1](model)
            self.enabled = True
        except ValueError:  # the model refuses such a model name: nothing can match
            self.enabled = False

    def __reduce__(self) -> tuple[Any, ...]:
        # Sent to the decoder process as (model, dim): the generated reader is rebuilt
        # there at import, never pickled.
        return (type(self), (self.model, self.dim))

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
    ) -> FastMemory | None:
        """The record's values and vector, or ``None`` when the general path must
        decide. A record not ``trusted`` (signed by the worker) whose producer names a
        part of the worker is left to the general path, which dead-letters it."""
        events = self._events
        if not self.enabled or not events.headers_ok(headers):
            return None
        wire = events.wire(value)
        if wire is None:
            return None
        emb = wire.embedding
        if emb is None:
            vector = b""  # no vector: the projector embeds the content
        elif emb.model != self.model or emb.dim != self.dim or len(emb.data) != self._data_bytes:
            return None  # another model's vector: the general path decides
        else:
            vector = emb.data
        if not trusted and wire.producer is not None and is_system_producer(wire.producer):
            return None
        values = events.values(wire)
        return None if values is None else FastMemory(values, vector)

    def vectors(self, items: Sequence[FastMemory]) -> tuple[np.ndarray, np.ndarray]:
        """The vectors of ``items`` as an ``(n, dim)`` float32 matrix and a mask of the
        rows whose values are all finite. Rows outside the mask belong to the general
        path (the model refuses them). An item without a vector has a row of zeros (in
        the mask), for the reader to fill once it has embedded the content."""
        n, dim = len(items), self.dim
        if n == 0:
            return np.zeros((0, dim), dtype=np.float32), np.zeros(0, dtype=bool)
        zeros = bytes(self._data_bytes)
        raw = b"".join(item.vector or zeros for item in items)
        # A writable copy: the rows of unembedded items are filled in later.
        matrix = np.frombuffer(raw, dtype="<f4").reshape(n, dim).astype(np.float32)
        return matrix, np.asarray(np.isfinite(matrix).all(axis=1), dtype=bool)


_MEMORIES = FastDecoder(MemoryAdded)
