"""How hybrid search reads: one wait on LanceDB's event loop for the vector and BM25
lists (the query embedded meanwhile) with the versions of ``memories`` and
``messages``; then, together, every read their candidates need that the space's
:class:`SearchCache` does not hold at those versions (the candidates' sessions, their
rows, the source turns of session-less candidates, the first hop of their
successors); then the statistics of the entities the query names.

Rows are looked up by id as ``<id> IN (...) AND pk IN (...)``
(``LanceStore.ids_where``): the id column's BTree finds them and the scoped key
confines them to the space, without the space predicate (which in a large space
costs more than the lookup)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from memstream.domain.access import agent_pin
from memstream.domain.content import normalize_content
from memstream.domain.events import Scope
from memstream.domain.ranking import query_mentions
from memstream.projections.schema import ENTITIES, MEMORIES, MESSAGES
from memstream.projections.search import queries as q
from memstream.projections.search import vectors as search_vectors
from memstream.projections.search.cache import (
    TURN_COLUMNS,
    SearchCache,
    SpaceKey,
    Version,
    space_key,
    table_identity,
    turns_of,
)
from memstream.projections.search.facts import entity_stats
from memstream.projections.search.results import LIST_COLUMNS, READ_COLUMNS, rows_of
from memstream.projections.search.turns import SessionMemories, SessionTurns, Turn
from memstream.projections.search.vectors import SpaceVectors, read_space_vectors
from memstream.projections.search.view import Successors, Unknown, View
from memstream.projections.store import LanceStore, gather_all, in_list, space_where

__all__ = ["Gathered", "candidates", "MAX_TURNS", "TURN_COLUMNS"]

_R = TypeVar("_R")

MAX_TURNS = 20_000
"""Most turns (and memories) read for the candidates' sessions at once. A read cut
here is used by its search but not cached: the cache holds whole sessions only."""


async def read_versions(store: LanceStore) -> tuple[Version, Version, Version]:
    """The versions of ``memories``, ``messages`` and ``entities`` this search reads at
    (see ``search_cache.Version``; with a ``read_consistency_interval``, asking is what
    makes the handles look for newer commits, as a query would). Asked together while
    the query is embedded: the entity statistics need theirs after the lists."""
    root = str(store.root)
    dirs = [table_identity(root, name) for name in (MEMORIES, MESSAGES, ENTITIES)]
    asked = await gather_all([q.native(store, name).version() for name in (MEMORIES, MESSAGES, ENTITIES)])
    memories, messages, entities = ((*d, int(v)) for d, v in zip(dirs, asked))
    return memories, messages, entities


@dataclass
class Gathered:
    """What :func:`candidates` brings back: the two lists in rank order (``memory_id``
    with the cosine distance, and with the BM25 score), the candidates' rows (``pk ->
    row``, vector list first), the sessions and session-less source turns of the
    candidates (conversational ranking), the entity keys the query names among them
    and their statistics, and the view the rest of the search reads from."""

    vector: list[tuple[str, float]]
    text: list[tuple[str, float]]
    rows: dict[str, dict[str, Any]]
    sessions: list[str]
    loose: list[str]
    entity_keys: set[str]
    entity_stats: tuple[dict[str, int], int] | None
    view: View


def _scores(table: pa.Table | None, column: str) -> list[tuple[str, float]]:
    """``(memory_id, score)`` of a list, in its order."""
    if table is None:
        return []
    ids = table.column("memory_id").to_pylist()
    return [(mid, float(v)) for mid, v in zip(ids, table.column(column).to_pylist())]


def _by_session(
    rows: Sequence[_R], session_of: Callable[[_R], str | None], sessions: Iterable[str]
) -> dict[str, list[_R]]:
    """``rows`` per session among ``sessions`` (in the read's order)."""
    out: dict[str, list[_R]] = {s: [] for s in sessions}
    for row in rows:
        group = out.get(session_of(row) or "")
        if group is not None:
            group.append(row)
    return out


def _turn_session(turn: Turn) -> str | None:
    return turn.session_id


def _row_session(row: Mapping[str, Any]) -> str | None:
    return row.get("session_id")


async def lists(
    store: LanceStore,
    embed: Callable[[], Awaitable[list[float]]],
    refine: int | None,
    text_query: str,
    where: str,
    n: int,
    columns: Sequence[str],
    kept: tuple[SearchCache, SpaceKey, Scope] | None = None,
) -> tuple[pa.Table, pa.Table | None, tuple[Version, Version, Version], bool]:
    """The vector and BM25 lists (``columns`` of each candidate), the versions of
    ``memories``, ``messages`` and ``entities``, and whether both lists came from the
    space's kept vectors and text index (``kept``: where they may serve, see
    ``vectors``; such lists hold only ``memory_id``, ``session_id``,
    ``source_message_ids``). ``embed`` awaits the query's vector, embedded in a worker
    thread (an endpoint's round trip, or a local model, costs milliseconds): meanwhile
    the versions are asked, the space's kept index is found, carried or read and its
    BM25 list ranked; without one, LanceDB's BM25 list runs meanwhile."""
    table = q.native(store, MEMORIES)
    embedding = asyncio.ensure_future(embed())
    versions = asyncio.ensure_future(read_versions(store))
    space = asyncio.ensure_future(_space_vectors(store, kept, versions)) if kept is not None else None
    text = None if kept is not None else asyncio.ensure_future(q.text_query(table, text_query, where, n, columns))
    try:
        vectors = await space if space is not None else None
        ttable = vectors.text.best(text_query, n) if vectors is not None and text_query.strip() else None
        vector = await embedding
    except BaseException:
        for pending in (text, versions, space):
            if pending is not None:
                pending.cancel()
        # the embedding is not a read: it is waited for, not cancelled
        await asyncio.gather(*(p for p in (embedding, text, versions, space) if p is not None), return_exceptions=True)
        raise
    if vectors is not None:
        return vectors.nearest(vector, n), ttable, await versions, True
    if text is None:  # a space too large to keep: LanceDB's BM25 list after all
        text = asyncio.ensure_future(q.text_query(table, text_query, where, n, columns))
    vtable, ttable, read = await gather_all([q.vector_query(table, vector, where, n, refine, columns), text, versions])
    return vtable, ttable, read, False


async def _space_vectors(
    store: LanceStore, kept: tuple[SearchCache, SpaceKey, Scope], versions: Awaitable[tuple[Version, Version, Version]]
) -> SpaceVectors | None:
    """The space's vectors at the version this search reads ``memories`` at: kept,
    carried from a kept version (:func:`carried_vectors`), or read now; and kept
    (``None``: a space too large to keep)."""
    cache, key, scope = kept
    memories, _, _ = await versions
    hit = cache.vectors.get(key, memories)
    if hit is not None:
        return hit
    old = cache.vectors.latest(key)
    read = None
    if old is not None:
        read = await asyncio.to_thread(carried_vectors, cache, str(store.root), scope, old, memories)
    if read is None:
        read = await read_space_vectors(store, scope, memories)
    if read is not None:
        cache.vectors.keep(key, read)
    return read


def carried_vectors(
    cache: SearchCache, root: str, scope: Scope, old: SpaceVectors, version: Version
) -> SpaceVectors | None:
    """``old`` (vectors and text index) brought to ``version`` with what the commits
    since wrote in the space (their rows as ``table_changes`` kept them), in the order
    a read at ``version`` gives (rows written since come last); ``None`` when that
    cannot be told (a delete, as the forget's, among them: read the space again).
    Reads the steps it has not seen yet: call it off the event loop."""
    if not isinstance(old.version, tuple):
        return None
    changes = cache.changes(root, MEMORIES, old.version, version)
    if changes is None:
        return None
    changed = changes.of(scope.team_id, scope.user_id)
    if changed is None:
        return dataclasses.replace(old, version=version)
    if changed.rows is None:
        return None
    rows = changed.rows
    pin = agent_pin(scope)
    if pin:
        rows = rows.filter(pc.equal(rows.column("agent_id"), pin))
    rows = rows.select(["memory_id", "session_id", "source_message_ids", "content", "vector"])
    carried = old.carried(version, changed.ids, rows)
    return carried if len(carried) <= search_vectors.SPACE_MAX_VECTORS else None


async def fill(
    store: LanceStore,
    scope: Scope,
    view: View,
    listed: Mapping[str, tuple[str | None, Sequence[str]]],
    sessions: Sequence[str],
    loose: Sequence[str],
) -> None:
    """Read, together, what the candidates (``listed``: memory id -> session, source
    turns) need and ``view`` does not hold: the sessions' turns and memories (a
    session read whole gives its candidates' rows too), the other candidates' rows,
    the session-less source turns (``loose``); and file it in the view."""
    turn_reads = [s for s in sessions if view.turns_of(s) is None]
    member_reads = [s for s in sessions if view.memories_of(s) is None]
    covered = set(member_reads)
    row_reads = [m for m, (s, _) in listed.items() if not isinstance(view.memory(m), dict) and s not in covered]
    turn_lookups = [m for m in loose if isinstance(view.turn(m), Unknown)]
    space = space_where(scope)
    jobs: dict[str, Awaitable[Any]] = {}
    if turn_reads:
        where = f"{space} AND {in_list('session_id', turn_reads)}"
        jobs["turns"] = q.scan(q.native(store, MESSAGES), where, TURN_COLUMNS, MAX_TURNS)
    if member_reads:
        where = f"{space} AND {in_list('session_id', member_reads)}"
        jobs["members"] = q.scan(q.native(store, MEMORIES), where, READ_COLUMNS, MAX_TURNS)
    if row_reads:
        jobs["rows"] = q.by_ids(store, MEMORIES, scope, "memory_id", row_reads, READ_COLUMNS)
    if turn_lookups:
        jobs["loose"] = q.by_ids(store, MESSAGES, scope, "message_id", turn_lookups, TURN_COLUMNS)
    if not jobs:
        return
    done = dict(zip(jobs, await gather_all(list(jobs.values()))))
    if "turns" in done:  # a read cut at MAX_TURNS serves this search only
        groups = _by_session(turns_of(done["turns"]), _turn_session, turn_reads)
        sessions_read = {s: SessionTurns(g) for s, g in groups.items()}
        view.file_turns((), sessions=sessions_read, keep=done["turns"].num_rows < MAX_TURNS)
    if "members" in done:
        rows = rows_of(done["members"], scope)
        members = {s: SessionMemories(g) for s, g in _by_session(rows, _row_session, member_reads).items()}
        view.file_memories(rows, sessions=members, keep=done["members"].num_rows < MAX_TURNS)
    if "rows" in done:
        rows = rows_of(done["rows"], scope)
        found = {r["memory_id"] for r in rows}
        view.file_memories(rows, [m for m in row_reads if m not in found])
    if "loose" in done:
        turns = turns_of(done["loose"])
        seen = {t.message_id for t in turns}
        view.file_turns(turns, [m for m in turn_lookups if m not in seen])


async def candidates(
    cache: SearchCache,
    store: LanceStore,
    scope: Scope,
    embed: Callable[[], Awaitable[list[float]]],
    refine: int | None,
    query: str,
    text_query: str,
    where: str,
    n: int,
    *,
    conversational: bool,
    successor_filters: Sequence[str] | None,
    entities: bool = True,
) -> tuple[Gathered, Successors | None]:
    """The vector and BM25 lists (:func:`lists`), then every read their candidates
    need that the space's cache cannot answer (:func:`fill`), then the statistics of
    the entities the query names and the successors' first hop, in one wait.
    ``successor_filters``: the filters successors must pass (``None``: successors are
    not followed); ``entities``: whether the entity boost needs the statistics."""
    root = str(store.root)
    whole = cache.lists_need_rows(root, scope)
    # the space's kept vectors serve where LanceDB's flat search would give the same list
    kept = (cache, space_key(root, scope), scope) if refine is None and where == space_where(scope) else None
    vtable, ttable, (mv, tv, ev), from_kept = await lists(
        store, embed, refine, text_query, where, n, READ_COLUMNS if whole else LIST_COLUMNS, kept
    )
    entry = cache.entry_of(root, scope)
    if entry is None or not entry.current(mv, tv):  # carrying it forward reads the tables' steps
        entry = await asyncio.to_thread(cache.space_cache, root, scope, mv, tv)
    view = View(cache, entry, mv, tv)
    # the candidates: memory id -> (session, source turns), vector list first
    listed: dict[str, tuple[str | None, Sequence[str]]] = {}
    for part in (vtable, ttable):
        if part is not None:
            cols = zip(*(part.column(c).to_pylist() for c in ("memory_id", "session_id", "source_message_ids")))
            for mid, session, sources in cols:
                listed.setdefault(mid, (session, sources or ()))
    sessions = sorted({s for s, src in listed.values() if s and src}) if conversational else []
    loose = sorted({m for s, src in listed.values() if not s for m in src}) if conversational else []
    fresh = {s for s in sessions if view.memories_of(s) is None}
    entry.row_misses = sum(1 for m, (s, _) in listed.items() if not isinstance(view.memory(m), dict) and s not in fresh)
    if whole:
        view.file_memories(
            [
                *(rows_of(vtable.drop_columns(["_distance"]), scope) if not from_kept else []),
                *(rows_of(ttable.drop_columns(["_score"]), scope) if ttable is not None and not from_kept else []),
            ]
        )
    rows = await _candidate_rows(store, scope, view, listed, sessions, loose)
    named = query if entities else ""  # no boost: no entity the query names is looked up
    keys, stats, successors = await _follow(cache, store, scope, named, rows, view, ev, successor_filters)
    gathered = Gathered(
        _scores(vtable, "_distance"), _scores(ttable, "_score"), rows, sessions, loose, keys, stats, view
    )
    return gathered, successors


async def _candidate_rows(
    store: LanceStore,
    scope: Scope,
    view: View,
    listed: Mapping[str, tuple[str | None, Sequence[str]]],
    sessions: Sequence[str],
    loose: Sequence[str],
) -> dict[str, dict[str, Any]]:
    """The candidates' rows (``pk -> row``, in list order), read with what they need."""
    await fill(store, scope, view, listed, sessions, loose)
    late = [m for m in listed if not isinstance(view.memory(m), dict)]
    if late:  # only when a session read was cut at MAX_TURNS, or a write landed meanwhile
        view.file_memories(rows_of(await q.by_ids(store, MEMORIES, scope, "memory_id", late, READ_COLUMNS), scope))
    rows: dict[str, dict[str, Any]] = {}
    for mid in listed:
        row = view.memory(mid)
        if isinstance(row, dict):
            rows[row["pk"]] = row
    return rows


async def _follow(
    cache: SearchCache,
    store: LanceStore,
    scope: Scope,
    query: str,
    rows: Mapping[str, Mapping[str, Any]],
    view: View,
    entities_version: Version,
    successor_filters: Sequence[str] | None,
) -> tuple[set[str], tuple[dict[str, int], int] | None, Successors | None]:
    """What needs the candidates' rows, read together: the statistics of the entities
    the query names among them (at ``entities_version``), and the first hop of their
    successors."""
    names = {e["name"] for r in rows.values() for e in (r.get("entities") or ())}
    keys = {normalize_content(m) for m in query_mentions(query, names)}
    successors = None if successor_filters is None else Successors(store, scope, successor_filters, view)
    follow: list[Awaitable[Any]] = []
    if keys:
        follow.append(entity_stats(cache, store, scope, keys, view.memories_version, entities_version))
    if successors is not None:
        first_hop = successors.wanted(rows)
        if first_hop:
            follow.append(successors.read(first_hop))
    stats = (await gather_all(follow))[0] if follow else None
    return keys, (stats if keys else None), successors
