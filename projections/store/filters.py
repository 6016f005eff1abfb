"""The filter text every scoped LanceDB read is built from: quoted values, the memory
space's isolation predicate, ``IN`` lists kept short, lookups by scoped key."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from memstream.domain.access import ReadScope, agent_pin
from memstream.domain.events import Scope
from memstream.projections.schema import scoped_key

__all__ = [
    "StoreError",
    "EmbedderMismatchError",
    "ScopeRequiredError",
    "IN_LIST_CHUNK",
    "quote",
    "require_scope",
    "space_where",
    "chunked",
    "in_list",
    "ids_where",
]

IN_LIST_CHUNK = 1_000
"""Longest ``IN (...)`` list sent in one filter."""


class StoreError(RuntimeError):
    """The table set on disk cannot be used as configured (e.g. another dimension)."""


class EmbedderMismatchError(StoreError):
    """The memories table holds vectors of another embedding model than the one
    configured: vectors of two models are never compared or mixed in one table."""


class ScopeRequiredError(ValueError):
    """A read without a memory space: isolation is a precondition, never widened."""


def quote(value: str) -> str:
    """A SQL string literal for a LanceDB filter: single quotes doubled (LanceDB's
    parser takes backslashes literally). Identifiers cannot hold quotes at all, but
    entity names and free text can, so every value goes through here."""
    if "\x00" in value:
        raise ValueError("a filter value cannot contain NUL")
    return "'" + value.replace("'", "''") + "'"


def require_scope(scope: Scope | ReadScope | None) -> Scope | ReadScope:
    """The scope itself, or :class:`ScopeRequiredError` if there is none to isolate by."""
    if scope is None:
        raise ScopeRequiredError("a scope (team_id and user_id) is required")
    if not getattr(scope, "team_id", None) or not getattr(scope, "user_id", None):
        raise ScopeRequiredError("a scope needs a non-empty team_id and user_id")
    return scope


def space_where(scope: Scope | ReadScope | None) -> str:
    """The isolation predicate every scoped read starts with: the space, and the agent
    when the read is pinned to one (``memstream.domain.access``)."""
    s = require_scope(scope)
    where = f"team_id = {quote(s.team_id)} AND user_id = {quote(s.user_id)}"
    agent = agent_pin(s)
    return where if agent is None else f"{where} AND agent_id = {quote(agent)}"


def chunked(items: Sequence[Any], size: int = IN_LIST_CHUNK) -> Iterator[Sequence[Any]]:
    """``items`` in slices of at most ``size``: keeps every ``IN (...)`` filter short."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


def in_list(column: str, values: Iterable[str]) -> str:
    """``column IN ('a', 'b', ...)`` with every value quoted (see :func:`quote`)."""
    return f"{column} IN ({', '.join(quote(v) for v in values)})"


def ids_where(scope: Scope | ReadScope, id_column: str, ids: Sequence[str]) -> str:
    """The filter for the rows of the scope's space whose ``id_column`` (the id the
    table's ``pk`` is scoped from: ``memory_id``, ``message_id``...) is in ``ids``:
    ``<id_column> IN (...) AND pk IN (<the scoped keys>)``. The id column's BTree
    finds the rows; the scoped key (``team|user|id``) confines them to the space
    exactly, so no ``team_id`` / ``user_id`` predicate is needed, and none is used (in
    a large space their indexes each return every row of the space, which costs more
    than the lookup). A read pinned to an agent adds its ``agent_id``."""
    s = require_scope(scope)
    keys = [scoped_key(s.team_id, s.user_id, i) for i in ids]
    where = f"{in_list(id_column, ids)} AND {in_list('pk', keys)}"
    agent = agent_pin(s)
    return where if agent is None else f"{where} AND agent_id = {quote(agent)}"
