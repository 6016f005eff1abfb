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
entity names and free text can). The agent in ``scope`` does not narrow the search:
agents of one user share the user's memory space; ``SearchFilters.agent_id`` narrows.

How :func:`search` ranks (the constants and formulas live in
``memstream.domain.ranking``):

1. up to ``candidates`` (default ``max(50, 5k)``) memories by vector similarity
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

How :func:`search` reads (latency is the point of this layout): two waits on LanceDB,
each a set of concurrent queries on LanceDB's own event loop through the tables'
asynchronous handles (the same plans the synchronous builders run, without their
per-query schema round trips). First the vector and BM25 lists; then, together, the
candidates' sessions (turns and memories), the source turns of candidates outside any
session, the successors of superseded candidates and the entity statistics. Rows are
looked up by id as ``<id> IN (...) AND pk IN (...)``: the BTree on the id column
finds them and the scoped key (``team|user|id``) confines them to the space, without
the space predicate, which in a large space costs more than the lookup (the
``team_id`` and ``user_id`` indexes each return every row of the space).
"""

from __future__ import annotations

import asyncio
import bisect
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
from memstream.domain.ranking import (
    asks_for_time,
    is_question,
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
from memstream.projections.embedder import Embedder
from memstream.projections.schema import ENTITIES, MEMORIES, MESSAGES, scoped_key
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
    (1.0 = none). See ``memstream.domain.ranking`` 5-8."""

    vector: float | None
    text: float | None
    fused: float
    recency: float
    supersession: float
    entity: float
    final: float
    context: float = 0.0
    prior: float = 1.0


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
    table: Any, vector: Sequence[float], where: str, limit: int, refine: int | None
) -> pa.Table:
    q = (
        table.query()
        .limit(limit)
        .select([*RESULT_COLUMNS, "_distance"])
        .where(where)
        .nearest_to(list(vector))
        .distance_range(None, None)
        .distance_type("cosine")
    )
    if refine is not None:
        q = q.refine_factor(refine)
    return await q.column("vector").to_arrow()


async def _text_query(table: Any, query: str, where: str, limit: int) -> pa.Table | None:
    if not query.strip():
        return None
    q = table.query().limit(limit).select([*RESULT_COLUMNS, "_score"]).where(where)
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
    parts = await asyncio.gather(*reads)
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def _vector_rows(
    store: LanceStore, vector: Sequence[float], where: str, limit: int
) -> list[dict[str, Any]]:
    refine = VECTOR_REFINE_FACTOR if store.has_vector_index() else None
    table: pa.Table = _wait(_vector_query(_native(store, MEMORIES), vector, where, limit, refine))
    return table.to_pylist()


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


def _text_rows(store: LanceStore, query: str, where: str, limit: int) -> list[dict[str, Any]]:
    table = _wait(_text_query(_native(store, MEMORIES), query, where, limit))
    return table.to_pylist() if table is not None else []


def _both_lists(
    store: LanceStore,
    embedder: Embedder,
    query: str,
    where: str,
    n: int,
    text_query: str | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The vector and BM25 candidate lists, both queries awaited together (LanceDB
    executes them natively, so they overlap): a hybrid search costs about the slower
    of the two, not their sum. ``text_query`` (default ``query``) is what the BM25 leg
    searches."""
    vector = _query_vector(embedder, store, query)
    refine = VECTOR_REFINE_FACTOR if store.has_vector_index() else None
    table = _native(store, MEMORIES)
    text = query if text_query is None else text_query

    async def both() -> tuple[pa.Table, pa.Table | None]:
        v, t = await asyncio.gather(
            _vector_query(table, vector, where, n, refine), _text_query(table, text, where, n)
        )
        return v, t

    vtable, ttable = _wait(both())
    return vtable.to_pylist(), (ttable.to_pylist() if ttable is not None else [])


def _query_vector(embedder: Embedder, store: LanceStore, query: str) -> list[float]:
    if embedder.dim != store.embedding_dim:
        raise ValueError(
            f"the embedder makes {embedder.dim}-dimension vectors; the store holds {store.embedding_dim}"
        )
    return list(embedder.embed([query])[0])


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
    return max(50, 5 * k)


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
    for row in _vector_rows(store, vec, where, k):
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
    for row in _text_rows(store, query, where, k):
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
    vrows, trows = _both_lists(store, embedder, query, where, n)
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


class _Successors:
    """The successor rows read so far for one search: ``memory_id -> row``, ``None``
    for an id that was looked up and is not in the space or fails the filters. The
    first hop is read with the other context reads; later hops, and the successors of
    memories that joined as neighbours, are read here on demand."""

    def __init__(self, store: LanceStore, scope: Scope, extra: Sequence[str]) -> None:
        self.store = store
        self.scope = scope
        self.extra = tuple(extra)
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
        table = await _by_ids(self.store, MEMORIES, self.scope, "memory_id", ids, RESULT_COLUMNS, self.extra)
        for mid in ids:
            self.found.setdefault(mid, None)
        for row in table.to_pylist():
            self.found[row["memory_id"]] = row

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
SPEAKERS_TTL_S = 30.0
"""How long a memory space's list of speakers is reused for query processing (a
speaker who joins meanwhile only misses the name removal, never the speaker prior)."""
_SPEAKERS: dict[tuple[str, str, str], tuple[float, frozenset[str]]] = {}
_SPEAKERS_LOCK = threading.Lock()
_SPEAKERS_MAX = 4096


def _space_speakers(store: LanceStore, scope: Scope) -> frozenset[str]:
    """The distinct speakers of the space's turns, cached for :data:`SPEAKERS_TTL_S`."""
    key = (str(store.root), scope.team_id, scope.user_id)
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


class _Turn:
    """The L0 turn a memory was drawn from: who said it, where it sits in the log.
    Whether it asks something is worked out only for the turns that need it (a
    search reads whole sessions and looks at a few of their turns)."""

    __slots__ = ("message_id", "session_id", "partition", "offset", "speaker", "_content", "_question")

    def __init__(
        self, message_id: str, session_id: str | None, partition: int, offset: int, speaker: str | None, content: str
    ) -> None:
        self.message_id = message_id
        self.session_id = session_id
        self.partition = partition
        self.offset = offset
        self.speaker = speaker
        self._content = content
        self._question: bool | None = None

    @property
    def question(self) -> bool:
        if self._question is None:
            self._question = is_question(self._content)
        return self._question


def _add_turns(turns: dict[str, _Turn], table: pa.Table, *, replace: bool) -> None:
    """Add the turns of a ``_TURN_COLUMNS`` read (``replace``: over those present)."""
    columns = [table.column(c).to_pylist() for c in _TURN_COLUMNS]
    for mid, session, speaker, content, partition, offset in zip(*columns):
        if replace or mid not in turns:
            turns[mid] = _Turn(mid, session, int(partition or 0), int(offset or 0), speaker, content or "")


def _sources(row: Mapping[str, Any]) -> list[str]:
    return list(row.get("source_message_ids") or ())


def _citing(table: pa.Table, message_ids: Iterable[str]) -> list[dict[str, Any]]:
    """The rows of a memories read that were drawn from any of ``message_ids``, in
    the read's order (the filter runs in Arrow: a session holds far more memories
    than the few next to the candidates)."""
    wanted = sorted(set(message_ids))
    if not wanted or table.num_rows == 0:
        return []
    lists = table.column("source_message_ids").combine_chunks()
    hits = pc.is_in(pc.list_flatten(lists), value_set=pa.array(wanted, pa.string()))
    parents = pc.filter(pc.list_parent_indices(lists), hits)
    if len(parents) == 0:
        return []
    return table.take(pc.unique(parents)).to_pylist()


@dataclass
class _Context:
    """What the reads that depend on the candidates returned (see :class:`_Reads`); a
    field stays ``None`` when the search did not need it."""

    session_turns: pa.Table | None = None
    session_memories: pa.Table | None = None
    loose_turns: pa.Table | None = None
    entity_stats: tuple[dict[str, int], int] | None = None


def _concat(tables: Sequence[pa.Table]) -> pa.Table | None:
    if not tables:
        return None
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


class _Reads:
    """The reads that depend on the candidates, started for each candidate list as
    soon as it arrives: the BM25 list usually comes back well before the vector list,
    and the reads for its candidates then run beside the vector search.

    * conversational ranking: every turn and every memory of the candidates' sessions
      (the memories under the search's own prefilter: the neighbours of a candidate's
      turns are among them), and the source turns of the candidates outside any
      session (they still get their speaker);
    * the statistics of the entities the query names among the candidates;
    * the first hop of the candidates' successors (:class:`_Successors`).

    Each list's reads cover only what earlier lists did not ask for, so together they
    return what one read over all candidates returns; a session read reaching
    ``_MAX_TURNS`` rows is redone over all sessions at once, so the cut stays the one
    a single read makes. Runs on LanceDB's event loop (see :func:`_wait`)."""

    def __init__(
        self,
        store: LanceStore,
        scope: Scope,
        where: str,
        query: str,
        *,
        conversational: bool,
        successors: _Successors | None,
    ) -> None:
        self.store = store
        self.scope = scope
        self.space = space_where(scope)
        self.where = where
        self.query = query
        self.conversational = conversational
        self.successors = successors
        self.rows: dict[str, dict[str, Any]] = {}
        self.sessions: list[str] = []
        self.loose: set[str] = set()
        self.names: set[str] = set()
        self.keys: set[str] = set()
        self.asked_successors: set[str] = set()
        self.turn_reads: list[asyncio.Future[pa.Table]] = []
        self.memory_reads: list[asyncio.Future[pa.Table]] = []
        self.loose_reads: list[asyncio.Future[pa.Table]] = []
        self.key_reads: list[asyncio.Future[pa.Table]] = []
        self.count: asyncio.Future[int] | None = None
        self.other: list[asyncio.Future[Any]] = []

    def _start(self, work: Awaitable[_T], into: list[asyncio.Future[_T]]) -> None:
        into.append(asyncio.ensure_future(work))

    def _session_filter(self, base: str, sessions: Sequence[str]) -> str:
        return f"{base} AND session_id IN ({', '.join(quote(x) for x in sessions)})"

    def add(self, batch: Sequence[dict[str, Any]]) -> None:
        """Start the reads that the candidates of ``batch`` need and no earlier batch
        asked for."""
        for r in batch:
            self.rows.setdefault(r["pk"], r)
        if self.conversational:
            sessions = sorted({r["session_id"] for r in batch if r.get("session_id") and _sources(r)} - set(self.sessions))
            if sessions:
                self.sessions += sessions
                self._start(
                    _scan(
                        _native(self.store, MESSAGES),
                        self._session_filter(self.space, sessions),
                        _TURN_COLUMNS,
                        _MAX_TURNS,
                    ),
                    self.turn_reads,
                )
                self._start(
                    _scan(
                        _native(self.store, MEMORIES),
                        self._session_filter(self.where, sessions),
                        RESULT_COLUMNS,
                        _MAX_TURNS,
                    ),
                    self.memory_reads,
                )
            loose = sorted({m for r in batch if not r.get("session_id") for m in _sources(r)} - self.loose)
            if loose:
                self.loose.update(loose)
                self._start(_by_ids(self.store, MESSAGES, self.scope, "message_id", loose, _TURN_COLUMNS), self.loose_reads)
        names = {e["name"] for r in batch for e in (r.get("entities") or ())} - self.names
        self.names |= names
        keys = {normalize_content(m) for m in query_mentions(self.query, names)} - self.keys
        if keys:
            self.keys |= keys
            entities = _native(self.store, ENTITIES)
            for chunk in chunked(sorted(k for k in keys if k)):
                self._start(
                    _scan(entities, f"{self.space} AND {in_list('name_key', chunk)}", ["name_key"]), self.key_reads
                )
            if self.count is None:
                self.count = asyncio.ensure_future(_native(self.store, MEMORIES).count_rows(self.space))
        if self.successors is not None:
            ids = [m for m in self.successors.wanted(self.rows) if m not in self.asked_successors]
            if ids:
                self.asked_successors.update(ids)
                self._start(self.successors.read(ids), self.other)

    async def _all_or_again(self, reads: list[asyncio.Future[pa.Table]], table: str, base: str, columns: Sequence[str]) -> pa.Table | None:
        tables = list(await asyncio.gather(*reads))
        if len(tables) > 1 and sum(t.num_rows for t in tables) >= _MAX_TURNS:
            tables = [await _scan(_native(self.store, table), self._session_filter(base, sorted(self.sessions)), columns, _MAX_TURNS)]
        return _concat(tables)

    async def finish(self) -> _Context:
        """Wait for every read started; the entity statistics are what
        ``LanceStore.entity_frequencies`` and ``count_memories`` return."""
        ctx = _Context()
        ctx.session_turns = await self._all_or_again(self.turn_reads, MESSAGES, self.space, _TURN_COLUMNS)
        ctx.session_memories = await self._all_or_again(self.memory_reads, MEMORIES, self.where, RESULT_COLUMNS)
        ctx.loose_turns = _concat(list(await asyncio.gather(*self.loose_reads)))
        if self.count is not None:
            counts = {k: 0 for k in self.keys if k}
            for tbl in await asyncio.gather(*self.key_reads):
                for key in tbl.column("name_key").to_pylist():
                    counts[key] = counts.get(key, 0) + 1
            ctx.entity_stats = (counts, int(await self.count))
        await asyncio.gather(*self.other)
        return ctx

    async def cancel(self) -> None:
        """Cancel every read started and wait until they have all stopped."""
        started: list[asyncio.Future[Any]] = [
            *self.turn_reads, *self.memory_reads, *self.loose_reads, *self.key_reads, *self.other
        ]
        if self.count is not None:
            started.append(self.count)
        for fut in started:
            fut.cancel()
        await asyncio.gather(*started, return_exceptions=True)


async def _candidates(
    store: LanceStore,
    vector: Sequence[float],
    refine: int | None,
    text_query: str,
    where: str,
    n: int,
    reads: _Reads,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], _Context]:
    """The vector and BM25 lists (run together: a hybrid search costs about the
    slower of the two, not their sum), each handed to ``reads`` as it arrives, then
    everything ``reads`` started."""
    table = _native(store, MEMORIES)
    legs: dict[asyncio.Future[pa.Table | None], str] = {
        asyncio.ensure_future(_vector_query(table, vector, where, n, refine)): "vector",
        asyncio.ensure_future(_text_query(table, text_query, where, n)): "text",
    }
    lists: dict[str, list[dict[str, Any]]] = {}
    pending: set[asyncio.Future[pa.Table | None]] = set(legs)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: legs[f]):
                result = fut.result()
                lists[legs[fut]] = result.to_pylist() if result is not None else []
                reads.add(lists[legs[fut]])
        ctx = await reads.finish()
    except BaseException:
        for fut in pending:
            fut.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await reads.cancel()
        raise
    return lists["vector"], lists["text"], ctx


def _neighbours(
    rows: dict[str, dict[str, Any]],
    turns: dict[str, _Turn],
    session_memories: pa.Table | None,
    scores: Mapping[str, float],
) -> tuple[dict[str, str], set[str]]:
    """``(previous, questions)`` for :func:`propagate_context` over the candidates: the
    memory drawn from the turn just before each candidate's first source turn, and the
    candidate each memory drawn from the turn just after a candidate's last source turn
    follows (same space, session and partition, in log order). ``turns`` holds the
    sessions' turns; neighbour memories from ``session_memories`` join ``rows``."""
    lines: dict[tuple[str | None, int], list[tuple[int, str]]] = {}
    for t in turns.values():
        lines.setdefault((t.session_id, t.partition), []).append((t.offset, t.message_id))
    for line in lines.values():
        line.sort()

    def step(t: _Turn, forward: bool) -> str | None:
        line = lines.get((t.session_id, t.partition), [])
        i = bisect.bisect_left(line, (t.offset, ""))
        if forward:
            j = i + 1 if i < len(line) and line[i][0] == t.offset else i
            return line[j][1] if j < len(line) else None
        return line[i - 1][1] if i > 0 else None

    def offset(t: _Turn) -> int:
        return t.offset

    before: dict[str, str | None] = {}
    after: dict[str, str | None] = {}
    lasts: dict[str, _Turn] = {}
    for pk, row in rows.items():
        src = sorted((turns[m] for m in _sources(row) if m in turns), key=offset)
        if src:
            before[pk], after[pk], lasts[pk] = step(src[0], False), step(src[-1], True), src[-1]
    wanted = {m for m in [*before.values(), *after.values()] if m}
    if session_memories is not None:
        for row in _citing(session_memories, wanted):
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
    n = candidates or _default_candidates(k)
    follow = not filters or filters.include_superseded
    successors = _Successors(store, scope, _filter_parts(filters)) if follow else None

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
        vector = _query_vector(embedder, store, query)
        refine = VECTOR_REFINE_FACTOR if store.has_vector_index() else None
        reads = _Reads(store, scope, where, query, conversational=conversational, successors=successors)
        # one wait: both lists, then the sessions, loose turns, entity statistics and
        # first successor hop of their candidates, started as each list arrives
        vrows, trows, ctx = _wait(_candidates(store, vector, refine, text_query, where, n, reads))
        for r in vrows:
            rows.setdefault(r["pk"], r)
            vsim[r["pk"]] = 1.0 - float(r["_distance"])
        for r in trows:
            rows.setdefault(r["pk"], r)
            tscore[r["pk"]] = float(r["_score"])
        early_keys = reads.keys
        stats = ctx.entity_stats
        if w.fusion == "score":
            fused = score_fusion(tscore, vsim, w.text_weight, w.fusion_vector_weight)
        else:
            fused = normalised_rrf(
                {"vector": [r["pk"] for r in vrows], "text": [r["pk"] for r in trows]},
                {"vector": w.vector_weight, "text": w.text_weight},
                w.rrf_k,
            )
        if conversational:
            turns: dict[str, _Turn] = {}
            if ctx.session_turns is not None:
                _add_turns(turns, ctx.session_turns, replace=True)
            # memories outside any session still get their speaker
            if ctx.loose_turns is not None:
                _add_turns(turns, ctx.loose_turns, replace=False)
            if context_on and turns:
                previous, questions = _neighbours(rows, turns, ctx.session_memories, fused)
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
    if not rows:
        return []

    if successors is not None:
        _pull_successors(successors, rows, fused)

    # entity boost: entities of the candidates that the query names, damped by IDF
    # (their statistics were read with the candidates' sessions)
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
        raw[pk] = final_score(base, rec, sup, ent, w)
    successor = {}
    for pk, r in rows.items():
        nxt = _successor_of(r)
        if nxt:
            successor[pk] = scoped_key(r["team_id"], r["user_id"], nxt)
    final = order_after_successors(raw, successor)

    order = sorted(rows, key=lambda pk: (-final[pk], rows[pk]["memory_id"]))
    if reranker is None:
        order = order[:k]  # the reranker sees every candidate; without one, k suffice
    results = []
    for pk in order:
        f, rec, sup, ent = pieces[pk]
        parts = ScoreParts(
            vsim.get(pk), tscore.get(pk), f, rec, sup, ent, final[pk], context.get(pk, 0.0), priors.get(pk, 1.0)
        )
        results.append(_result(rows[pk], final[pk], parts))
    if reranker is not None:
        results = list(reranker(query, results))
    return results[:k]
