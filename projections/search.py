"""Hybrid search over the memories table, inside one memory space, always.

:func:`search` is memstream's ranking; :func:`vector_search`, :func:`text_search` and
:func:`rrf_search` are the simple baselines on the same tables (the benchmarks compare
against them, and the extractor uses the first two for candidate recall).

Isolation is a precondition, not a filter applied afterwards: every query to LanceDB
carries ``team_id = ... AND user_id = ...`` as a *prefilter* (applied before the
nearest-neighbour or BM25 top-k is taken, so another tenant's rows can neither be
returned nor crowd out this tenant's results). A call without a scope, or with an
empty team or user, raises :class:`ScopeRequiredError`; it is never widened. Values are
quoted with ``memstream.projections.store.quote`` (identifiers cannot hold quotes, but
entity names and free text can). The agent of an event ``Scope`` does not narrow the
search (agents of one user share the user's memory space; ``SearchFilters.agent_id``
narrows); a pinned ``ReadScope`` (``memstream.domain.access``: an agent-pinned key, an
MCP bank with an agent) confines every read, the conversational context's included,
to its agent's rows, and has cache entries of its own.

How :func:`search` ranks (the constants and formulas live in
``memstream.domain.ranking``):

1. up to ``candidates`` (default ``max(30, 3k)``) memories by vector similarity
   (cosine, exact below the vector index threshold) for the query as written, and as
   many by BM25 over ``content`` (LanceDB's FTS index; rows written since the last
   optimize are scanned flat, so they are found too) for its content words
   (``lexical_query``), both under the same prefilter. The L0 turns the candidates
   were drawn from are read from the ``messages`` table; when the query names one of
   their speakers, the BM25 leg runs again without that name (it becomes a prior);
2. score fusion of the two lists (``fused``; weighted RRF with ``fusion="rrf"``);
3. neighbouring turns: each memory receives a share of the fused score of the memory
   drawn from the turn before its source turn (more when that turn asks a question)
   and of the one after it, found through the ``messages`` table in log order within
   the session (``context``); memories found only this way join the candidates (they
   pass the same prefilter);
4. a superseded or duplicate candidate pulls in the memory that replaced it (when it
   passes the filters), which inherits the candidate's fusion score if its own is
   lower: a query that matches an old fact finds the new one;
5. the speaker prior (the query names the source turn's speaker) and the time prior
   (the query asks when, the memory states a time) multiply ``fused + context``
   (``prior``), then recency, supersession penalty and entity boost; then every
   superseded or duplicate memory is capped just below its successor;
6. the optional ``reranker`` sees every candidate in that order and returns the list to
   cut at ``k``.

Memories written without source turns (straight through the SDK) simply get no
context and no speaker prior. ``RankingWeights(fusion="rrf", query_processing=False,
context_forward=0, context_forward_statement=0, context_backward=0, speaker_weight=0,
temporal_weight=0)`` is the plain hybrid ranking (LoCoMo's "before").

An empty query lists instead of searching: the memories that pass the filters (e.g.
everything known about ``--entity NAME``), newest first, at most
``BROWSE_LIMIT`` of them scored by recency and supersession only.

How :func:`search` reads (latency is the point of this layout): one wait on LanceDB's
event loop, through the tables' asynchronous handles (the same plans the synchronous
builders run, without their per-query schema round trips): the vector and BM25 lists
together, with the versions of ``memories`` and ``messages``; then, together, every
read their candidates need that the space's cache (``memstream.projections.
search_cache``) does not hold at those versions: the candidates' sessions (every turn,
every memory), their rows, the source turns of candidates outside any session, the
first hop of their successors; then the statistics of the entities the query names.
The cache holds whole sessions and rows by id per memory space and table version, so
a table that moved is read again and nothing new is ever hidden; once it holds a
space's rows, the two lists read only ids (``_LIST_COLUMNS``). Results are the same
with a cold cache or a warm one. Rows are looked up by id as ``<id> IN (...)
AND pk IN (...)`` (``LanceStore.ids_where``): the BTree on the id column finds them
and the scoped key (``team|user|id``) confines them to the space, without the space
predicate, which in a large space costs more than the lookup (the ``team_id`` and
``user_id`` indexes each return every row of the space). Measured on LoCoMo (2
cores): about 20 ms per search with every context read per search, 8 with the cache.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from lancedb.background_loop import LOOP
from lancedb.query import ColumnOrdering, FullTextOperator, MatchQuery

from memstream.domain.content import normalize_content
from memstream.domain.events import MemoryType, Scope
from memstream.domain.priority import priority_factor
from memstream.domain.ranking import (
    asks_for_time,
    lexical_query,
    mentions_time,
    prior_factor,
    propagate_context,
    score_fusion,
    RankingWeights,
    entity_boost,
    entity_idf,
    final_score,
    normalised_rrf,
    order_after_successors,
    query_mentions,
    recency_score,
    supersession_factor,
)
from memstream.projections import search_cache
from memstream.projections.embedder import Embedder, embed_query
from memstream.projections.schema import ENTITIES, MEMORIES, MESSAGES, scoped_key
from memstream.projections.search_cache import (
    Line,
    SessionMemories,
    SessionTurns,
    SpaceCache,
    Turn,
    Version,
    SpaceKey,
    space_key,
    step,
    table_identity,
)
from memstream.projections.store import (
    VECTOR_REFINE_FACTOR,
    LanceStore,
    ScopeRequiredError,
    chunked,
    in_list,
    quote,
    require_scope,
    space_where,
)

__all__ = [
    "SearchFilters",
    "ScoreParts",
    "SearchResult",
    "ScopeRequiredError",
    "Reranker",
    "RESULT_COLUMNS",
    "BROWSE_LIMIT",
    "build_where",
    "search",
    "vector_search",
    "text_search",
    "rrf_search",
]

RESULT_COLUMNS: tuple[str, ...] = (
    "pk",
    "memory_id",
    "team_id",
    "user_id",
    "agent_id",
    "session_id",
    "content",
    "content_hash",
    "memory_type",
    "priority",
    "scene",
    "timestamp",
    "timestamp_start",
    "timestamp_end",
    "source_message_ids",
    "entities",
    "entity_keys",
    "created_at",
    "superseded_by",
    "canonical_id",
    "status",
)
BROWSE_LIMIT = 1_000
_SUCCESSOR_HOPS = 3
_READ_COLUMNS: tuple[str, ...] = tuple(c for c in RESULT_COLUMNS if c not in ("pk", "team_id", "user_id"))
"""What search reads of a memory row: :data:`RESULT_COLUMNS` but the key and the space,
which every row read in a space has by construction (see :func:`_rows_of`) and which
would cost a column read each, in every list and lookup."""
_LIST_COLUMNS: tuple[str, ...] = ("memory_id", "session_id", "source_message_ids")
"""What :func:`search`'s two lists read when the space's cache is expected to hold the
candidates' rows: enough to plan the reads of their sessions and source turns. Half
the cost of reading whole rows with the lists (measured on LoCoMo, 2 cores)."""


@dataclass(frozen=True)
class SearchFilters:
    """Narrow a search inside its memory space.

    ``time_from`` / ``time_to`` (inclusive, timezone-aware) keep a memory when its point
    time is in range, or its activity interval (``timestamp_start`` .. ``timestamp_end``;
    a missing end means still going on, a missing start means since ever) overlaps the
    range; a memory with neither is judged by ``created_at``. ``include_superseded=False`` drops superseded memories
    and duplicates (their rows stay; they are only not returned). ``entity`` keeps the
    memories that name the entity (normalised name)."""

    memory_types: tuple[MemoryType, ...] = ()
    time_from: datetime | None = None
    time_to: datetime | None = None
    session_id: str | None = None
    agent_id: str | None = None
    include_superseded: bool = True
    entity: str | None = None

    def __post_init__(self) -> None:
        for name in ("time_from", "time_to"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise ValueError(f"{name} must be timezone-aware")
        if self.time_from and self.time_to and self.time_to < self.time_from:
            raise ValueError("time_to is before time_from")


@dataclass(frozen=True)
class ScoreParts:
    """Why a result ranks where it does. ``vector``: cosine similarity (None when the
    vector search did not retrieve it); ``text``: BM25 score (None when full text did
    not); ``fused``: normalised weighted RRF; ``recency``: ``0.5 ** (age/half-life)``;
    ``supersession``: penalty factor (1.0 when current); ``entity``: the entity boost;
    ``final``: the score after the successor cap (before any reranker); ``context``:
    the score received from neighbouring turns; ``prior``: the speaker and time prior
    (1.0 = none). See ``memstream.domain.ranking`` 5-8. ``priority``: the factor of
    the memory's priority (``memstream.domain.priority``; 1.0 at priority 50)."""

    vector: float | None
    text: float | None
    fused: float
    recency: float
    supersession: float
    entity: float
    final: float
    context: float = 0.0
    prior: float = 1.0
    priority: float = 1.0


@dataclass(frozen=True)
class SearchResult:
    memory_id: str
    content: str
    memory_type: str
    priority: int
    source_message_ids: tuple[str, ...]
    team_id: str
    user_id: str
    agent_id: str
    session_id: str | None
    timestamp: datetime | None
    timestamp_start: datetime | None
    timestamp_end: datetime | None
    created_at: datetime
    superseded_by: str | None
    canonical_id: str | None
    status: str
    entities: tuple[tuple[str, str], ...]
    scene: str | None
    content_hash: str
    score: float
    parts: ScoreParts


Reranker = Callable[[str, list[SearchResult]], list[SearchResult]]


# ------------------------------------------------------------------------------ filters
def _ts(value: datetime) -> str:
    return "TIMESTAMP " + quote(value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))


def _time_where(lo: datetime | None, hi: datetime | None) -> str | None:
    if lo is None and hi is None:
        return None

    def bounds(col: str) -> list[str]:
        out = []
        if lo is not None:
            out.append(f"{col} >= {_ts(lo)}")
        if hi is not None:
            out.append(f"{col} <= {_ts(hi)}")
        return out

    point = " AND ".join(["timestamp IS NOT NULL", *bounds("timestamp")])
    interval_parts = ["(timestamp_start IS NOT NULL OR timestamp_end IS NOT NULL)"]
    if hi is not None:
        interval_parts.append(f"(timestamp_start IS NULL OR timestamp_start <= {_ts(hi)})")
    if lo is not None:
        interval_parts.append(f"(timestamp_end IS NULL OR timestamp_end >= {_ts(lo)})")
    interval = " AND ".join(interval_parts)
    fallback = " AND ".join(
        ["timestamp IS NULL", "timestamp_start IS NULL", "timestamp_end IS NULL", *bounds("created_at")]
    )
    return f"(({point}) OR ({interval}) OR ({fallback}))"


def build_where(scope: Scope | None, filters: SearchFilters | None = None) -> str:
    """The LanceDB prefilter for a scoped search: the space first, then the filters."""
    return " AND ".join([space_where(scope), *_filter_parts(filters)])


def _filter_parts(filters: SearchFilters | None) -> list[str]:
    """The predicates of ``filters`` alone (no space): what a lookup by scoped key
    adds so that it keeps exactly the rows the search's prefilter keeps."""
    parts: list[str] = []
    f = filters or SearchFilters()
    if f.memory_types:
        parts.append(in_list("memory_type", [MemoryType(t).value for t in f.memory_types]))
    if f.session_id is not None:
        parts.append(f"session_id = {quote(f.session_id)}")
    if f.agent_id is not None:
        parts.append(f"agent_id = {quote(f.agent_id)}")
    if not f.include_superseded:
        parts.append("superseded_by IS NULL AND canonical_id IS NULL")
    if f.entity is not None:
        key = normalize_content(f.entity)
        if not key:
            raise ValueError("entity filter is empty")
        parts.append(f"array_has(entity_keys, {quote(key)})")
    tw = _time_where(f.time_from, f.time_to)
    if tw:
        parts.append(tw)
    return parts


# ------------------------------------------------------------------------------ retrieval
_T = TypeVar("_T")
_R = TypeVar("_R")


def _native(store: LanceStore, name: str) -> Any:
    """The table's asynchronous handle (LanceDB's ``AsyncTable``): the very handle the
    synchronous table wraps, so reads see the same version and consistency settings.
    Queries built on it run the same plans as the synchronous builders (which
    translate to it), without their two or three schema round trips per query, and
    several of them can be awaited together."""
    table = store.table(name)
    native = getattr(table, "_table", None)
    if native is None or not hasattr(native, "query"):
        raise TypeError(f"{type(table).__name__} has no asynchronous handle (lancedb changed?)")
    return native


def _wait(work: Awaitable[_T]) -> _T:
    """Run ``work`` on LanceDB's background event loop and wait for it (what every
    synchronous LanceDB call does). Never call a synchronous LanceDB API inside it."""

    async def run() -> _T:
        return await work

    return LOOP.run(run())


async def _vector_query(
    table: Any,
    vector: Sequence[float],
    where: str,
    limit: int,
    refine: int | None,
    columns: Sequence[str] = _READ_COLUMNS,
) -> pa.Table:
    """The ``limit`` nearest memories by cosine distance under the prefilter ``where``
    (re-ranked on the full vectors, ``refine`` times as many, with an IVF_PQ index):
    ``columns`` and ``_distance``."""
    q = (
        table.query()
        .limit(limit)
        .select([*columns, "_distance"])
        .where(where)
        .nearest_to(list(vector))
        .distance_range(None, None)
        .distance_type("cosine")
    )
    if refine is not None:
        q = q.refine_factor(refine)
    return await q.column("vector").to_arrow()


async def _text_query(
    table: Any, query: str, where: str, limit: int, columns: Sequence[str] = _READ_COLUMNS
) -> pa.Table | None:
    """The ``limit`` best BM25 matches of ``query`` under the prefilter ``where``:
    ``columns`` and ``_score`` (``None`` for a blank query: nothing to match)."""
    if not query.strip():
        return None
    q = table.query().limit(limit).select([*columns, "_score"]).where(where)
    return await q.nearest_to_text(_match(query), None).to_arrow()


async def _scan(table: Any, where: str, columns: Sequence[str], limit: int | None = None) -> pa.Table:
    """A filtered read (all matches unless ``limit``), as ``LanceStore.rows``."""
    q = table.query()
    if limit is not None:
        q = q.limit(limit)
    return await q.select(list(columns)).where(where).to_arrow()


async def _by_ids(
    store: LanceStore,
    name: str,
    scope: Scope,
    id_column: str,
    ids: Sequence[str],
    columns: Sequence[str],
    extra: Sequence[str] = (),
) -> pa.Table:
    """The rows of the scope's space whose ``id_column`` is in ``ids`` (and that pass
    the ``extra`` predicates), through the id column's BTree
    (:meth:`LanceStore.ids_where`)."""
    table = _native(store, name)
    reads = [
        _scan(table, " AND ".join([store.ids_where(scope, id_column, chunk), *extra]), columns)
        for chunk in chunked(list(ids))
    ]
    parts = await _all(reads)
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def _rows_of(table: pa.Table, scope: Scope) -> list[dict[str, Any]]:
    """The row dicts of a read of :data:`_READ_COLUMNS` in the scope's space, with the
    columns it leaves out: ``team_id`` / ``user_id``, the space's (every row read under
    the space's prefilter or by its scoped keys has them), and ``pk``,
    ``scoped_key(team_id, user_id, memory_id)`` (how every memory row is keyed, see
    ``memstream.projections.schema``)."""
    team, user = scope.team_id, scope.user_id
    rows: list[dict[str, Any]] = table.to_pylist()
    for r in rows:
        r["pk"] = scoped_key(team, user, r["memory_id"])
        r["team_id"] = team
        r["user_id"] = user
    return rows


def _vector_rows(
    store: LanceStore, scope: Scope, vector: Sequence[float], where: str, limit: int
) -> list[dict[str, Any]]:
    refine = VECTOR_REFINE_FACTOR if store.has_vector_index() else None
    table: pa.Table = _wait(_vector_query(_native(store, MEMORIES), vector, where, limit, refine))
    return _rows_of(table, scope)


def _match(query: str) -> MatchQuery:
    """The BM25 query: the text's terms OR-ed (a memory matching some of the words
    still scores), no fuzziness; never parsed as a query language, so quotes and
    operators in user text are just characters."""
    return MatchQuery(
        query,
        "content",
        boost=1.0,
        fuzziness=0,
        max_expansions=50,
        operator=FullTextOperator.OR,
        prefix_length=0,
        document_granularity=None,
    )


def _text_rows(store: LanceStore, scope: Scope, query: str, where: str, limit: int) -> list[dict[str, Any]]:
    table = _wait(_text_query(_native(store, MEMORIES), query, where, limit))
    return _rows_of(table, scope) if table is not None else []


def _both_lists(
    store: LanceStore,
    embedder: Embedder,
    scope: Scope,
    query: str,
    where: str,
    n: int,
    text_query: str | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The vector and BM25 candidate lists, both queries awaited together in one wait.
    ``text_query`` (default ``query``) is what the BM25 leg searches."""
    vector = _query_vector(embedder, store, query)
    refine = VECTOR_REFINE_FACTOR if store.has_vector_index() else None
    table = _native(store, MEMORIES)
    text = query if text_query is None else text_query

    async def both() -> tuple[pa.Table, pa.Table | None]:
        v, t = await _all([_vector_query(table, vector, where, n, refine), _text_query(table, text, where, n)])
        return v, t

    vtable, ttable = _wait(both())
    return _rows_of(vtable, scope), (_rows_of(ttable, scope) if ttable is not None else [])


def _check_dim(embedder: Embedder, store: LanceStore) -> None:
    if embedder.dim != store.embedding_dim:
        raise ValueError(
            f"the embedder makes {embedder.dim}-dimension vectors; the store holds {store.embedding_dim}"
        )
    store.check_vector_model(embedder.model_id)


def _query_vector(embedder: Embedder, store: LanceStore, query: str) -> list[float]:
    _check_dim(embedder, store)
    return embed_query(embedder, query).tolist()


def _result(row: Mapping[str, Any], score: float, parts: ScoreParts) -> SearchResult:
    return SearchResult(
        memory_id=row["memory_id"],
        content=row["content"],
        memory_type=row["memory_type"],
        priority=int(row["priority"]),
        source_message_ids=tuple(row.get("source_message_ids") or ()),
        team_id=row["team_id"],
        user_id=row["user_id"],
        agent_id=row["agent_id"],
        session_id=row.get("session_id"),
        timestamp=row.get("timestamp"),
        timestamp_start=row.get("timestamp_start"),
        timestamp_end=row.get("timestamp_end"),
        created_at=row["created_at"],
        superseded_by=row.get("superseded_by"),
        canonical_id=row.get("canonical_id"),
        status=row.get("status") or "active",
        entities=tuple((e["name"], e["kind"]) for e in (row.get("entities") or ())),
        scene=row.get("scene"),
        content_hash=row["content_hash"],
        score=score,
        parts=parts,
    )


def _default_candidates(k: int) -> int:
    """Candidate depth of the plain baselines (``rrf_search``)."""
    return max(50, 5 * k)


def _hybrid_candidates(k: int) -> int:
    """Candidate depth of :func:`search`: each list's length before fusion. Measured
    (docs/benchmarks.md): ``max(50, 5k)`` gave LoCoMo recall@10 0.748 at 20.6 ms p50,
    ``max(30, 3k)`` 0.741 at 18.6 ms, and at 100,000 memories 35 against 30 ms per
    query; the context reads grow with every candidate's session."""
    return max(30, 3 * k)


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError("k must be at least 1")


# ------------------------------------------------------------------------------ baselines
def vector_search(
    store: LanceStore,
    embedder: Embedder,
    scope: Scope | None,
    query: str,
    k: int = 10,
    filters: SearchFilters | None = None,
    *,
    vector: Sequence[float] | None = None,
) -> list[SearchResult]:
    """Nearest neighbours by cosine similarity alone (the baseline; also the
    extractor's candidate recall, which passes its already computed ``vector``).
    ``score`` = ``parts.vector`` = ``parts.fused`` = ``parts.final`` = similarity."""
    where = build_where(scope, filters)
    _check_k(k)
    vec = list(vector) if vector is not None else _query_vector(embedder, store, query)
    out = []
    for row in _vector_rows(store, require_scope(scope), vec, where, k):
        sim = 1.0 - float(row["_distance"])
        out.append(_result(row, sim, ScoreParts(sim, None, sim, 1.0, 1.0, 0.0, sim)))
    return out


def text_search(
    store: LanceStore,
    embedder: Embedder | None,
    scope: Scope | None,
    query: str,
    k: int = 10,
    filters: SearchFilters | None = None,
) -> list[SearchResult]:
    """BM25 full text alone (the baseline). ``score`` = ``parts.text`` = BM25."""
    where = build_where(scope, filters)
    _check_k(k)
    out = []
    for row in _text_rows(store, require_scope(scope), query, where, k):
        bm25 = float(row["_score"])
        out.append(_result(row, bm25, ScoreParts(None, bm25, bm25, 1.0, 1.0, 0.0, bm25)))
    return out


def rrf_search(
    store: LanceStore,
    embedder: Embedder,
    scope: Scope | None,
    query: str,
    k: int = 10,
    filters: SearchFilters | None = None,
    *,
    rrf_k: int = 60,
    candidates: int | None = None,
) -> list[SearchResult]:
    """Plain reciprocal rank fusion (equal weights, ``rrf_k`` = 60) of the vector and
    BM25 lists: the baseline without recency, supersession or entity handling."""
    where = build_where(scope, filters)
    _check_k(k)
    n = candidates or _default_candidates(k)
    vrows, trows = _both_lists(store, embedder, require_scope(scope), query, where, n)
    rows: dict[str, dict[str, Any]] = {}
    for r in [*vrows, *trows]:
        rows.setdefault(r["pk"], r)
    vsim = {r["pk"]: 1.0 - float(r["_distance"]) for r in vrows}
    tscore = {r["pk"]: float(r["_score"]) for r in trows}
    fused = normalised_rrf(
        {"vector": [r["pk"] for r in vrows], "text": [r["pk"] for r in trows]},
        {"vector": 1.0, "text": 1.0},
        rrf_k,
    )
    order = sorted(fused, key=lambda pk: (-fused[pk], rows[pk]["memory_id"]))[:k]
    return [
        _result(
            rows[pk],
            fused[pk],
            ScoreParts(vsim.get(pk), tscore.get(pk), fused[pk], 1.0, 1.0, 0.0, fused[pk]),
        )
        for pk in order
    ]


# ------------------------------------------------------------------------------ hybrid
def _anchor_time(row: Mapping[str, Any]) -> datetime:
    for col in ("timestamp", "timestamp_end", "timestamp_start", "created_at"):
        value = row.get(col)
        if value is not None:
            return value  # type: ignore[no-any-return]
    raise ValueError("memory row without any time")


def _successor_of(row: Mapping[str, Any]) -> str | None:
    return row.get("superseded_by") or row.get("canonical_id")


class _Unknown:
    """The type of :data:`_UNKNOWN`."""


_UNKNOWN = _Unknown()
"""What :class:`_View` answers for an id it has no answer for (``None`` means: looked
up, not in the space)."""


class _View:
    """One search's view of its memory space: the cache entry of the table versions it
    started from (``memstream.projections.search_cache``), plus what this search read
    itself (filed in the entry too, unless the entry moved on or the read was cut at
    ``_MAX_TURNS``: then only here). Every row in it was read under the space's
    predicate or its scoped keys."""

    def __init__(self, entry: SpaceCache, memories_version: Version, messages_version: Version) -> None:
        self.entry = entry
        self.memories_version = memories_version
        self.messages_version = messages_version
        self.memories: dict[str, dict[str, Any] | None] = {}
        self.turns: dict[str, Turn | None] = {}
        self.session_turns: dict[str, SessionTurns] = {}
        self.session_memories: dict[str, SessionMemories] = {}

    def memory(self, memory_id: str) -> dict[str, Any] | None | _Unknown:
        if memory_id in self.memories:
            return self.memories[memory_id]
        return self.entry.memories.get(memory_id, _UNKNOWN)

    def turn(self, message_id: str) -> Turn | None | _Unknown:
        if message_id in self.turns:
            return self.turns[message_id]
        return self.entry.turns.get(message_id, _UNKNOWN)

    def turns_of(self, session: str) -> SessionTurns | None:
        return self.session_turns.get(session) or self.entry.session_turns.get(session)

    def memories_of(self, session: str) -> SessionMemories | None:
        return self.session_memories.get(session) or self.entry.session_memories.get(session)

    def file_memories(
        self,
        rows: Sequence[dict[str, Any]],
        absent: Sequence[str] = (),
        sessions: Mapping[str, SessionMemories] | None = None,
        *,
        keep: bool = True,
    ) -> None:
        """Rows read at this search's version of ``memories`` (``absent``: ids an
        unfiltered lookup did not find; ``sessions``: sessions read whole); filed in
        the cache unless ``keep`` is false."""
        for row in rows:
            self.memories[row["memory_id"]] = row
        for mid in absent:
            self.memories.setdefault(mid, None)
        if sessions:
            self.session_memories.update(sessions)
        if keep:
            search_cache.add_memories(self.entry, self.memories_version, rows, absent, sessions)

    def file_turns(
        self,
        turns: Sequence[Turn],
        absent: Sequence[str] = (),
        sessions: Mapping[str, SessionTurns] | None = None,
        *,
        keep: bool = True,
    ) -> None:
        """As :meth:`file_memories`, for turns of ``messages``."""
        for t in turns:
            self.turns[t.message_id] = t
        for mid in absent:
            self.turns.setdefault(mid, None)
        if sessions:
            self.session_turns.update(sessions)
        if keep:
            search_cache.add_turns(self.entry, self.messages_version, turns, absent, sessions)


class _Successors:
    """The successor rows read so far for one search: ``memory_id -> row``, ``None``
    for an id that was looked up and is not in the space or fails the filters. The
    first hop is resolved with the candidates' other reads; later hops, and the
    successors of memories that joined as neighbours, here on demand. Without filters
    (``extra``) the space's cache answers first and what is read is filed in it."""

    def __init__(self, store: LanceStore, scope: Scope, extra: Sequence[str], view: _View | None = None) -> None:
        self.store = store
        self.scope = scope
        self.extra = tuple(extra)
        self.view = view
        self.found: dict[str, dict[str, Any] | None] = {}

    def wanted(self, rows: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """Ids of the successors of ``rows`` that are neither candidates nor read yet."""
        team, user = self.scope.team_id, self.scope.user_id
        out: dict[str, None] = {}
        for row in rows.values():
            nxt = _successor_of(row)
            if nxt and nxt not in self.found and scoped_key(team, user, nxt) not in rows:
                out[nxt] = None
        return list(out)

    async def read(self, ids: Sequence[str]) -> None:
        cached = self.view if self.view is not None and not self.extra else None
        unread = list(ids)
        if cached is not None:
            unread = []
            for mid in ids:
                hit = cached.memory(mid)
                if isinstance(hit, _Unknown):
                    unread.append(mid)
                else:
                    self.found[mid] = hit
        if not unread:
            return
        table = await _by_ids(self.store, MEMORIES, self.scope, "memory_id", unread, _READ_COLUMNS, self.extra)
        rows = _rows_of(table, self.scope)
        for mid in unread:
            self.found.setdefault(mid, None)
        for row in rows:
            self.found[row["memory_id"]] = row
        if cached is not None:
            cached.file_memories(rows, [m for m in unread if self.found[m] is None])

    def rows(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        """The rows of ``ids`` that exist and pass the filters (read if not yet)."""
        unread = [m for m in dict.fromkeys(ids) if m not in self.found]
        if unread:
            _wait(self.read(unread))
        return [row for row in (self.found[m] for m in ids) if row is not None]


def _pull_successors(
    successors: _Successors,
    rows: dict[str, dict[str, Any]],
    fused: dict[str, float],
) -> None:
    """Bring the successors of superseded / duplicate candidates into the candidate
    set (when they pass the filters), following up to ``_SUCCESSOR_HOPS`` links; a
    successor inherits its predecessor's fused score when that is higher than its own."""
    s = successors.scope
    frontier = list(rows)
    for _ in range(_SUCCESSOR_HOPS):
        wanted: dict[str, str] = {}  # successor pk -> predecessor pk
        ids: dict[str, str] = {}  # successor pk -> successor memory id
        for pk in frontier:
            nxt = _successor_of(rows[pk])
            if nxt:
                spk = scoped_key(s.team_id, s.user_id, nxt)
                ids[spk] = nxt
                if spk not in wanted or fused.get(pk, 0.0) > fused.get(wanted[spk], 0.0):
                    wanted[spk] = pk
        if not wanted:
            return
        missing = {pk for pk in wanted if pk not in rows}
        for r in successors.rows([ids[pk] for pk in wanted if pk in missing]):
            rows[r["pk"]] = r
        frontier = []
        for spk, pred in wanted.items():
            if spk not in rows:
                continue
            inherited = fused.get(pred, 0.0)
            if inherited > fused.get(spk, 0.0):
                fused[spk] = inherited
                frontier.append(spk)
            elif spk in missing:
                frontier.append(spk)


# ------------------------------------------------------------------------------ conversation
_TURN_COLUMNS = ("message_id", "session_id", "speaker", "content", "log_partition", "log_offset")
_MAX_TURNS = 20_000
"""Most turns (and memories) read for the candidates' sessions at once. A read cut
here is used by its search but not cached: the cache holds whole sessions only."""
SPEAKERS_TTL_S = 30.0
"""How long a memory space's list of speakers is reused for query processing (a
speaker who joins meanwhile only misses the name removal, never the speaker prior)."""
_SPEAKERS: dict[SpaceKey, tuple[float, frozenset[str]]] = {}
_SPEAKERS_LOCK = threading.Lock()
_SPEAKERS_MAX = 4096


def _space_speakers(store: LanceStore, scope: Scope) -> frozenset[str]:
    """The distinct speakers of the space's turns, cached for :data:`SPEAKERS_TTL_S`."""
    key = space_key(str(store.root), scope)
    now = time.monotonic()
    with _SPEAKERS_LOCK:
        hit = _SPEAKERS.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
    table = _wait(_scan(_native(store, MESSAGES), f"{space_where(scope)} AND speaker IS NOT NULL", ["speaker"]))
    speakers = frozenset(str(v) for v in pc.unique(table.column("speaker")).to_pylist() if v)
    with _SPEAKERS_LOCK:
        if len(_SPEAKERS) >= _SPEAKERS_MAX:
            _SPEAKERS.clear()
        _SPEAKERS[key] = (now + SPEAKERS_TTL_S, speakers)
    return speakers


def _turns_of(table: pa.Table) -> list[Turn]:
    """The turns of a ``_TURN_COLUMNS`` read."""
    columns = [table.column(c).to_pylist() for c in _TURN_COLUMNS]
    return [
        Turn(mid, session, int(partition or 0), int(offset or 0), speaker, content or "")
        for mid, session, speaker, content, partition, offset in zip(*columns)
    ]


def _sources(row: Mapping[str, Any]) -> Sequence[str]:
    return row.get("source_message_ids") or ()  # type: ignore[no-any-return]


_SPACE_FACTS_MAX = 4096
"""Most memory spaces (and entity names per space) whose counts are kept."""
_SIZES: dict[SpaceKey, tuple[Version, int]] = {}
_FREQUENCIES: dict[SpaceKey, tuple[Version, dict[str, int]]] = {}
_FACTS_LOCK = threading.Lock()


async def _space_size(store: LanceStore, scope: Scope) -> int:
    """How many memories the space holds (``LanceStore.count_memories``), counted once
    per version of the memories table (``search_cache.Version``): every search that names an entity needs it
    for the IDF, and counting a large space through its ``team_id`` / ``user_id``
    indexes costs about as much as a lookup. Kept only when no write landed while
    counting, so a count is never filed under a version it does not belong to."""
    table = _native(store, MEMORIES)
    key = space_key(str(store.root), scope)
    version = (*table_identity(key[0], MEMORIES), int(await table.version()))
    with _FACTS_LOCK:
        hit = _SIZES.get(key)
    if hit is not None and hit[0] == version:
        return hit[1]
    if hit is not None and await asyncio.to_thread(search_cache.unchanged, key[0], MEMORIES, scope, hit[0], version):
        with _FACTS_LOCK:
            _SIZES[key] = (version, hit[1])
        return hit[1]
    total = int(await table.count_rows(space_where(scope)))
    if await table.version() == version[2]:
        with _FACTS_LOCK:
            if len(_SIZES) >= _SPACE_FACTS_MAX:
                _SIZES.clear()
            _SIZES[key] = (version, total)
    return total


async def _entity_stats(store: LanceStore, scope: Scope, keys: Iterable[str]) -> tuple[dict[str, int], int]:
    """How many memories of the space name each entity, and how many there are (what
    ``LanceStore.entity_frequencies`` and ``count_memories`` return). The counts are
    kept per version of their table, like :func:`_space_size`: a conversation's
    questions keep naming its few participants."""
    names = sorted({normalize_content(n) for n in keys if normalize_content(n)})
    entities = _native(store, ENTITIES)
    key = space_key(str(store.root), scope)
    version = (*table_identity(key[0], ENTITIES), int(await entities.version()))
    with _FACTS_LOCK:
        hit = _FREQUENCIES.get(key)
    still = hit is not None and (
        hit[0] == version or await asyncio.to_thread(search_cache.unchanged, key[0], ENTITIES, scope, hit[0], version)
    )
    known = dict(hit[1]) if hit is not None and still else {}
    missing = [n for n in names if n not in known]
    space = space_where(scope)
    reads = [_scan(entities, f"{space} AND {in_list('name_key', chunk)}", ["name_key"]) for chunk in chunked(missing)]
    *tables, total = await _all([*reads, _space_size(store, scope)])
    counted = {k: 0 for k in missing}
    for tbl in tables:
        for name in tbl.column("name_key").to_pylist():
            counted[name] = counted.get(name, 0) + 1
    if still and not missing and hit is not None and hit[0] != version:
        with _FACTS_LOCK:
            _FREQUENCIES[key] = (version, hit[1])
    if missing and await entities.version() == version[2]:
        known.update(counted)
        with _FACTS_LOCK:
            if len(_FREQUENCIES) >= _SPACE_FACTS_MAX:
                _FREQUENCIES.clear()
            _FREQUENCIES[key] = (version, known if len(known) <= _SPACE_FACTS_MAX else counted)
    return {k: known.get(k, counted.get(k, 0)) for k in names}, int(total)


async def _all(work: Sequence[Awaitable[Any]]) -> list[Any]:
    """``asyncio.gather`` that, when one of them fails, cancels the others and waits
    for them before raising: no read outlives the search that started it."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _versions(store: LanceStore) -> tuple[Version, Version]:
    """The versions of ``memories`` and ``messages`` this search reads at (see
    ``search_cache.Version``; with a ``read_consistency_interval``, asking is what
    makes the handles look for newer commits, as a query would)."""
    root = str(store.root)
    memories_dir, messages_dir = table_identity(root, MEMORIES), table_identity(root, MESSAGES)
    memories, messages = await _all([_native(store, MEMORIES).version(), _native(store, MESSAGES).version()])
    return (*memories_dir, int(memories)), (*messages_dir, int(messages))


@dataclass
class _Gathered:
    """What :func:`_candidates` brings back: the two lists in rank order (``memory_id``
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
    view: _View


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


async def _lists(
    store: LanceStore,
    embed: Callable[[], list[float]],
    refine: int | None,
    text_query: str,
    where: str,
    n: int,
    columns: Sequence[str],
) -> tuple[pa.Table, pa.Table | None, Version, Version]:
    """The vector and BM25 lists (``columns`` of each candidate) and the versions of
    ``memories`` and ``messages``. The BM25 list, which needs no vector, starts first
    and runs while ``embed`` computes the query's (in a worker thread: an embedding
    endpoint's round trip, or a local model, costs milliseconds)."""
    table = _native(store, MEMORIES)
    text = asyncio.ensure_future(_text_query(table, text_query, where, n, columns))
    versions = asyncio.ensure_future(_versions(store))
    try:
        vector = await asyncio.to_thread(embed)
    except BaseException:
        for pending in (text, versions):
            pending.cancel()
        await asyncio.gather(text, versions, return_exceptions=True)
        raise
    vtable, ttable, (memories, messages) = await _all(
        [_vector_query(table, vector, where, n, refine, columns), text, versions]
    )
    return vtable, ttable, memories, messages


async def _fill(
    store: LanceStore,
    scope: Scope,
    view: _View,
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
    turn_lookups = [m for m in loose if isinstance(view.turn(m), _Unknown)]
    space = space_where(scope)
    jobs: dict[str, Awaitable[Any]] = {}
    if turn_reads:
        where = f"{space} AND {in_list('session_id', turn_reads)}"
        jobs["turns"] = _scan(_native(store, MESSAGES), where, _TURN_COLUMNS, _MAX_TURNS)
    if member_reads:
        where = f"{space} AND {in_list('session_id', member_reads)}"
        jobs["members"] = _scan(_native(store, MEMORIES), where, _READ_COLUMNS, _MAX_TURNS)
    if row_reads:
        jobs["rows"] = _by_ids(store, MEMORIES, scope, "memory_id", row_reads, _READ_COLUMNS)
    if turn_lookups:
        jobs["loose"] = _by_ids(store, MESSAGES, scope, "message_id", turn_lookups, _TURN_COLUMNS)
    if not jobs:
        return
    done = dict(zip(jobs, await _all(list(jobs.values()))))
    if "turns" in done:  # a read cut at _MAX_TURNS serves this search only
        groups = _by_session(_turns_of(done["turns"]), _turn_session, turn_reads)
        sessions_read = {s: SessionTurns(g) for s, g in groups.items()}
        view.file_turns((), sessions=sessions_read, keep=done["turns"].num_rows < _MAX_TURNS)
    if "members" in done:
        rows = _rows_of(done["members"], scope)
        members = {s: SessionMemories(g) for s, g in _by_session(rows, _row_session, member_reads).items()}
        view.file_memories(rows, sessions=members, keep=done["members"].num_rows < _MAX_TURNS)
    if "rows" in done:
        rows = _rows_of(done["rows"], scope)
        found = {r["memory_id"] for r in rows}
        view.file_memories(rows, [m for m in row_reads if m not in found])
    if "loose" in done:
        turns = _turns_of(done["loose"])
        seen = {t.message_id for t in turns}
        view.file_turns(turns, [m for m in turn_lookups if m not in seen])


async def _candidates(
    store: LanceStore,
    scope: Scope,
    embed: Callable[[], list[float]],
    refine: int | None,
    query: str,
    text_query: str,
    where: str,
    n: int,
    *,
    conversational: bool,
    successor_filters: Sequence[str] | None,
) -> tuple[_Gathered, _Successors | None]:
    """The vector and BM25 lists (:func:`_lists`), then every read their candidates
    need that the space's cache cannot answer (:func:`_fill`), then the statistics of
    the entities the query names and the successors' first hop, in one wait (see the
    module docstring). ``successor_filters``: the filters successors must pass
    (``None``: successors are not followed)."""
    root = str(store.root)
    whole = search_cache.lists_need_rows(root, scope)
    vtable, ttable, mv, tv = await _lists(
        store, embed, refine, text_query, where, n, _READ_COLUMNS if whole else _LIST_COLUMNS
    )
    entry = search_cache.entry_of(root, scope)
    if entry is None or not entry.current(mv, tv):  # carrying it forward reads the tables' steps
        entry = await asyncio.to_thread(search_cache.space_cache, root, scope, mv, tv)
    view = _View(entry, mv, tv)
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
                *_rows_of(vtable.drop_columns(["_distance"]), scope),
                *(_rows_of(ttable.drop_columns(["_score"]), scope) if ttable is not None else []),
            ]
        )
    await _fill(store, scope, view, listed, sessions, loose)
    late = [m for m in listed if not isinstance(view.memory(m), dict)]
    if late:  # only when a session read was cut at _MAX_TURNS, or a write landed meanwhile
        view.file_memories(_rows_of(await _by_ids(store, MEMORIES, scope, "memory_id", late, _READ_COLUMNS), scope))
    candidates: dict[str, dict[str, Any]] = {}
    for mid in listed:
        row = view.memory(mid)
        if isinstance(row, dict):
            candidates[row["pk"]] = row

    # the entity statistics and the successors' first hop need the rows
    names = {e["name"] for r in candidates.values() for e in (r.get("entities") or ())}
    keys = {normalize_content(m) for m in query_mentions(query, names)}
    successors = None if successor_filters is None else _Successors(store, scope, successor_filters, view)
    follow: list[Awaitable[Any]] = []
    if keys:
        follow.append(_entity_stats(store, scope, keys))
    if successors is not None:
        first_hop = successors.wanted(candidates)
        if first_hop:
            follow.append(successors.read(first_hop))
    stats = (await _all(follow))[0] if follow else None
    gathered = _Gathered(
        _scores(vtable, "_distance"), _scores(ttable, "_score"), candidates, sessions, loose, keys,
        stats if keys else None, view,
    )
    return gathered, successors


def _conversation(
    g: _Gathered,
) -> tuple[dict[str, Turn], dict[tuple[str | None, int], Line], list[SessionMemories]]:
    """What the conversational ranking sees of the candidates' turns, as the
    sessions' reads would show it: every turn of the candidates' sessions and the
    source turns of the session-less candidates (``message_id -> turn``); their lines
    in log order per session and partition; the memories of those sessions."""
    view = g.view
    turns: dict[str, Turn] = {}
    lines: dict[tuple[str | None, int], Line] = {}
    members: list[SessionMemories] = []
    for s in g.sessions:
        st = view.turns_of(s)
        if st is not None:
            turns.update(st.turns)
            lines.update(st.lines)
        sm = view.memories_of(s)
        if sm is not None:
            members.append(sm)
    extra: dict[tuple[str | None, int], Line] = {}
    for mid in g.loose:
        t = view.turn(mid)
        if isinstance(t, Turn) and mid not in turns:
            turns[mid] = t
            key = t.line_key
            if key not in extra:
                extra[key] = list(lines.get(key, ()))
            extra[key].append((t.offset, mid))
    for key, line in extra.items():
        line.sort()
        lines[key] = line
    return turns, lines, members


def _neighbours(
    rows: dict[str, dict[str, Any]],
    turns: Mapping[str, Turn],
    lines: Mapping[tuple[str | None, int], Line],
    members: Sequence[SessionMemories],
    scores: Mapping[str, float],
    join: Callable[[list[str]], list[dict[str, Any]]],
) -> tuple[dict[str, str], set[str]]:
    """``(previous, questions)`` for :func:`propagate_context` over the candidates: the
    memory drawn from the turn just before each candidate's first source turn, and the
    candidate each memory drawn from the turn just after a candidate's last source turn
    follows (same space, session and partition, in log order). Memories of the
    sessions (``members``) drawn from those turns join ``rows`` through ``join`` (which
    keeps those that pass the search's filters)."""

    def offset(t: Turn) -> int:
        return t.offset

    before: dict[str, str | None] = {}
    after: dict[str, str | None] = {}
    lasts: dict[str, Turn] = {}
    for pk, row in rows.items():
        src = sorted((turns[m] for m in _sources(row) if m in turns), key=offset)
        if src:
            first, last = src[0], src[-1]
            before[pk] = step(lines.get(first.line_key, ()), first, False)
            after[pk] = step(lines.get(last.line_key, ()), last, True)
            lasts[pk] = last
    wanted = {m for m in [*before.values(), *after.values()] if m}
    if members and wanted:
        known = {r["memory_id"] for r in rows.values()}
        ids: list[str] = []
        for sm in members:
            cited = sm.citing.keys() & wanted
            if cited:
                hit = {i for m in cited for i in sm.citing[m]}
                ids.extend(i for i in sm.memory_ids if i in hit and i not in known)
        for row in join(ids) if ids else ():
            rows.setdefault(row["pk"], row)
    by_message: dict[str, list[str]] = {}
    for pk, row in rows.items():
        for m in _sources(row):
            by_message.setdefault(m, []).append(pk)

    def best(pks: list[str]) -> str:
        return max(pks, key=lambda pk: (scores.get(pk, 0.0), pk))

    previous: dict[str, str] = {}
    for pk, prev_turn in before.items():
        if prev_turn and prev_turn in by_message:
            previous[pk] = best(by_message[prev_turn])
    for pk, next_turn in after.items():
        if not next_turn or next_turn not in by_message:
            continue
        for follower in by_message[next_turn]:
            current = previous.get(follower)
            if current is None or scores.get(pk, 0.0) > scores.get(current, 0.0):
                previous[follower] = pk
    questions = {pk for pk, t in lasts.items() if t.question}
    for pk, row in rows.items():
        if pk not in lasts:
            src = [turns[m] for m in _sources(row) if m in turns]
            if src and max(src, key=offset).question:
                questions.add(pk)
    return previous, questions


def _joiner(
    store: LanceStore, scope: Scope, view: _View, extra: Sequence[str]
) -> Callable[[list[str]], list[dict[str, Any]]]:
    """How neighbour memories join the candidates: from the view (read with their
    sessions) when the search has no filters; else only those that pass the filters,
    read by id with them (in the order asked)."""

    def from_view(ids: list[str]) -> list[dict[str, Any]]:
        return [row for row in (view.memory(m) for m in ids) if isinstance(row, dict)]

    def filtered(ids: list[str]) -> list[dict[str, Any]]:
        table = _wait(_by_ids(store, MEMORIES, scope, "memory_id", ids, _READ_COLUMNS, extra))
        got = {r["memory_id"]: r for r in _rows_of(table, scope)}
        return [got[m] for m in ids if m in got]

    return filtered if extra else from_view


def search(
    store: LanceStore,
    embedder: Embedder,
    scope: Scope | None,
    query: str,
    k: int = 10,
    filters: SearchFilters | None = None,
    *,
    now: datetime | None = None,
    reranker: Reranker | None = None,
    weights: RankingWeights | None = None,
    candidates: int | None = None,
) -> list[SearchResult]:
    """memstream's hybrid search in the scope's memory space (see the module
    docstring). Raises :class:`ScopeRequiredError` without a scope."""
    scope = require_scope(scope)
    where = build_where(scope, filters)
    _check_k(k)
    w = weights or RankingWeights()
    now = now or datetime.now(timezone.utc)
    n = candidates or _hybrid_candidates(k)
    extra = _filter_parts(filters)
    follow = not filters or filters.include_superseded
    successors: _Successors | None = None

    rows: dict[str, dict[str, Any]] = {}
    vsim: dict[str, float] = {}
    tscore: dict[str, float] = {}
    context: dict[str, float] = {}
    priors: dict[str, float] = {}
    early_keys: set[str] = set()
    stats: tuple[dict[str, int], int] | None = None
    if query.strip():
        # the speakers the query names move from the BM25 query to the speaker prior
        named = query_mentions(query, _space_speakers(store, scope)) if w.query_processing else set()
        text_query = lexical_query(query, named) if w.query_processing else query
        context_on = w.context_forward > 0 or w.context_forward_statement > 0 or w.context_backward > 0
        conversational = context_on or w.speaker_weight > 0 or w.temporal_weight > 0
        _check_dim(embedder, store)
        refine = VECTOR_REFINE_FACTOR if store.has_vector_index() else None
        # one wait: both lists (the query embedded meanwhile), then what their
        # candidates need that the space's cache does not hold
        g, successors = _wait(
            _candidates(
                store, scope, lambda: _query_vector(embedder, store, query), refine, query, text_query, where, n,
                conversational=conversational, successor_filters=extra if follow else None,
            )
        )
        rows = g.rows
        team, user = scope.team_id, scope.user_id
        vpks = [scoped_key(team, user, mid) for mid, _ in g.vector]
        tpks = [scoped_key(team, user, mid) for mid, _ in g.text]
        vsim = {pk: 1.0 - distance for pk, (_, distance) in zip(vpks, g.vector)}
        tscore = {pk: score for pk, (_, score) in zip(tpks, g.text)}
        early_keys = g.entity_keys
        stats = g.entity_stats
        if w.fusion == "score":
            fused = score_fusion(tscore, vsim, w.text_weight, w.fusion_vector_weight, w.vector_scaling)
        else:
            fused = normalised_rrf(
                {"vector": vpks, "text": tpks}, {"vector": w.vector_weight, "text": w.text_weight}, w.rrf_k
            )
        if conversational:
            turns, lines, members = _conversation(g)
            if context_on and turns:
                join = _joiner(store, scope, g.view, extra)
                previous, questions = _neighbours(rows, turns, lines, members, fused, join)
                context = propagate_context(fused, previous, questions, w)
            speakers = {t.speaker for t in turns.values() if t.speaker}
            named_keys = {normalize_content(s) for s in query_mentions(query, speakers)}
            wants_time = asks_for_time(query)
            said_key: dict[str, str] = {}
            for pk, r in rows.items():
                said = set()
                for m in _sources(r):
                    t = turns.get(m)
                    if t is not None:
                        spoken = t.speaker or ""
                        key = said_key.get(spoken)
                        if key is None:
                            key = said_key[spoken] = normalize_content(spoken)
                        said.add(key)
                factor = prior_factor(
                    bool(named_keys & said), wants_time and mentions_time(r.get("content") or ""), w
                )
                if factor != 1.0:
                    priors[pk] = factor
        for pk in rows:
            fused.setdefault(pk, 0.0)
    else:
        listing = (
            store.table(MEMORIES)
            .search()
            .where(where)
            .select(list(RESULT_COLUMNS))
            .order_by([ColumnOrdering(column_name="created_at", ascending=False)])
            .limit(BROWSE_LIMIT)
            .to_arrow()
            .to_pylist()
        )
        rows = {r["pk"]: r for r in listing}
        fused = {pk: 1.0 for pk in rows}
        if follow:
            successors = _Successors(store, scope, extra)
    if not rows:
        return []

    if successors is not None:
        _pull_successors(successors, rows, fused)

    # entity boost: entities of the candidates that the query names, damped by IDF
    # (their statistics were read with the candidates)
    boosts: dict[str, float] = {}
    if query.strip() and early_keys:
        df, total = stats if stats is not None else ({}, 0)
        idf = {key: entity_idf(df.get(key, 1), total) for key in early_keys}
        for pk, r in rows.items():
            hits = [idf[key] for key in (r.get("entity_keys") or ()) if key in idf]
            if hits:
                boosts[pk] = entity_boost(hits, w.entity_weight)

    raw: dict[str, float] = {}
    pieces: dict[str, tuple[float, float, float, float]] = {}
    for pk, r in rows.items():
        f = fused.get(pk, 0.0)
        age = (now - _anchor_time(r)).total_seconds()
        rec = recency_score(age, w.half_life_s)
        sup = supersession_factor(bool(r.get("superseded_by")), bool(r.get("canonical_id")), w)
        ent = boosts.get(pk, 0.0)
        pieces[pk] = (f, rec, sup, ent)
        base = (f + context.get(pk, 0.0)) * priors.get(pk, 1.0)
        raw[pk] = final_score(base, rec, sup, ent, w) * priority_factor(r.get("priority"))
    successor = {}
    for pk, r in rows.items():
        nxt = _successor_of(r)
        if nxt:
            successor[pk] = scoped_key(r["team_id"], r["user_id"], nxt)
    final = order_after_successors(raw, successor)

    order = sorted(rows, key=lambda pk: (-final[pk], rows[pk]["memory_id"]))
    if reranker is None:
        if query.strip():  # a candidate with no evidence at all (score 0) never pads k
            order = [pk for pk in order if final[pk] > 0.0]
        order = order[:k]  # the reranker sees every candidate; without one, k suffice
    results = []
    for pk in order:
        f, rec, sup, ent = pieces[pk]
        parts = ScoreParts(
            vsim.get(pk), tscore.get(pk), f, rec, sup, ent, final[pk], context.get(pk, 0.0), priors.get(pk, 1.0),
            priority_factor(rows[pk].get("priority")),
        )
        results.append(_result(rows[pk], final[pk], parts))
    if reranker is not None:
        results = list(reranker(query, results))
    return results[:k]
