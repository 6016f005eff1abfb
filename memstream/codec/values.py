"""An event as flat plain values: the shape every projection row is built from.

``event_values(e)`` holds one entry per field of the event's model, in the model's
order, with the scope's three ids in place of ``scope`` and without the vector field
(``embedding``, carried apart as a float32 matrix). Values are as the model holds them
but plain: times stay ``datetime`` in UTC, ``event_id`` is canonical text, enums their
values, tuples lists, nested models their JSON dumps. The fast decoder gives exactly
this for the records it accepts (``tests/codec/test_fast_decode.py``).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import Enum
from collections.abc import Callable, Iterable
from functools import cache
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel

from memstream.domain.events import EmbeddingPayload, EventBase, Scope

__all__ = [
    "SCOPE_FIELD", "SCOPE_COLUMNS", "Values", "ValuesRecord", "event_values", "plain", "record_type", "tuples_of",
    "value_names", "vector_field",
]

Values = dict[str, Any]
SCOPE_FIELD = "scope"
SCOPE_COLUMNS: tuple[str, ...] = tuple(Scope.model_fields)


@cache
def vector_field(cls: type[EventBase]) -> str | None:
    """The name of ``cls``'s embedding field, if it has one (at most one)."""
    found = [n for n, f in cls.model_fields.items() if _is_payload(f.annotation)]
    return found[0] if found else None


def _is_payload(annotation: Any) -> bool:
    return annotation is EmbeddingPayload or EmbeddingPayload in getattr(annotation, "__args__", ())


@cache
def value_names(cls: type[EventBase]) -> tuple[str, ...]:
    """The keys of ``event_values`` for an event of ``cls``, in order."""
    skip = vector_field(cls)  # type: ignore[arg-type]  # classes are hashable
    names: list[str] = []
    for name in cls.model_fields:
        if name == SCOPE_FIELD:
            names.extend(SCOPE_COLUMNS)
        elif name != skip:
            names.append(name)
    return tuple(names)


class ValuesRecord:
    """``event_values`` as attributes (see :func:`record_type`): what the fast
    decoder gives, cheaper to build and read than a dict of two dozen keys."""

    __slots__ = ()
    names: tuple[str, ...] = ()

    if TYPE_CHECKING:  # the slots are the event's value names, made at run time

        def __getattr__(self, name: str) -> Any: ...

        def __setattr__(self, name: str, value: Any) -> None: ...

    def as_dict(self) -> Values:
        return {name: getattr(self, name) for name in self.names}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.as_dict() == cast(ValuesRecord, other).as_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dict it stands for

    def __reduce__(self) -> tuple[Any, ...]:
        # The class is made at run time: a decoder process sends its event class and
        # the values, and the receiver rebuilds the record (``record_type`` is cached).
        return (_rebuilt_record, (getattr(self, "_event"), tuple(getattr(self, n) for n in self.names)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.as_dict()!r})"


@cache
def record_type(cls: type[EventBase]) -> type[ValuesRecord]:
    """The :class:`ValuesRecord` of ``cls``: one slot per name of ``value_names``."""
    names = value_names(cls)  # type: ignore[arg-type]  # classes are hashable
    return type(f"{cls.__name__}Values", (ValuesRecord,), {"__slots__": names, "names": names, "_event": cls})


@cache
def tuples_of(record: type[ValuesRecord], names: tuple[str, ...]) -> Callable[[Iterable[ValuesRecord]], list[tuple[Any, ...]]]:
    """A function giving, for records of ``record``, the tuple of each one's ``names``
    values: generated, so that each read is a plain slot read (``operator.attrgetter``
    looks every name up on the type, which costs more than building the table)."""
    unknown = [n for n in names if n not in record.names or not n.isidentifier()]
    if unknown:
        raise ValueError(f"{record.__name__} has no values {unknown}")
    body = ", ".join(f"r.{n}" for n in names)
    scope: dict[str, Any] = {}
    exec(compile(f"def tuples(records):\n    return [({body},) for r in records]\n", f"<{record.__name__} tuples>", "exec"), scope)
    return cast(Callable[[Iterable[ValuesRecord]], list[tuple[Any, ...]]], scope["tuples"])


def _rebuilt_record(cls: type[EventBase], values: tuple[Any, ...]) -> ValuesRecord:
    record = object.__new__(record_type(cls))  # type: ignore[arg-type]  # classes are hashable
    for name, value in zip(record.names, values):
        setattr(record, name, value)
    return record


def plain(value: Any) -> Any:
    """One field's value as plain data (see the module docstring)."""
    if value is None or isinstance(value, (str, int, float, datetime, dict)):
        return value.value if isinstance(value, Enum) else value
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    raise TypeError(f"no plain form for {type(value).__name__}")


def event_values(event: EventBase) -> Values:
    """``event`` as flat plain values (see the module docstring)."""
    cls = type(event)
    skip = vector_field(cls)  # type: ignore[arg-type]  # classes are hashable
    out: Values = {}
    for name in cls.model_fields:
        value = getattr(event, name)
        if name == SCOPE_FIELD:
            for key in SCOPE_COLUMNS:
                out[key] = getattr(value, key)
        elif name != skip:
            out[name] = plain(value)
    return out
