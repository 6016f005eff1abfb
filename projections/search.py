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
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

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
from memstream.projections.schema import MEMORIES, MESSAGES, scoped_key
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
    parts = [space_where(scope)]
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
    return " AND ".join(parts)


# ------------------------------------------------------------------------------ retrieval
def _vector_rows(
    store: LanceStore, vector: Sequence[float], where: str, limit: int
) -> list[dict[str, Any]]:
    q = (
        store.table(MEMORIES)
        .search(list(vector), vector_column_name="vector")
        .distance_type("cosine")
        .where(where, prefilter=True)
        .select([*RESULT_COLUMNS, "_distance"])
        .limit(limit)
    )
    if store.has_vector_index():
        q = q.refine_factor(VECTOR_REFINE_FACTOR)
    return q.to_arrow().to_pylist()


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
    if not query.strip():
        return []
    q = (
        store.table(MEMORIES)
        .search(_match(query), query_type="fts")
        .where(where, prefilter=True)
        .select([*RESULT_COLUMNS, "_score"])
        .limit(limit)
    )
    return q.to_arrow().to_pylist()


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="memstream-fts")
        return _POOL


def _both_lists(
    store: LanceStore,
    embedder: Embedder,
    query: str,
    where: str,
    n: int,
    text_query: str | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The vector and BM25 candidate lists, the BM25 query running in a worker thread
    meanwhile (LanceDB executes both natively, so they overlap): a hybrid search costs
    about the slower of the two, not their sum. ``text_query`` (default ``query``) is
    what the BM25 leg searches."""
    text_future = _pool().submit(_text_rows, store, query if text_query is None else text_query, where, n)
    try:
        vrows = _vector_rows(store, _query_vector(embedder, store, query), where, n)
    finally:
        trows = text_future.result()
    return vrows, trows


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


def _pull_successors(
    store: LanceStore,
    scope: Scope,
    where: str,
    rows: dict[str, dict[str, Any]],
    fused: dict[str, float],
) -> None:
    """Bring the successors of superseded / duplicate candidates into the candidate
    set (when they pass the filters), following up to ``_SUCCESSOR_HOPS`` links; a
    successor inherits its predecessor's fused score when that is higher than its own."""
    s = require_scope(scope)
    frontier = list(rows)
    for _ in range(_SUCCESSOR_HOPS):
        wanted: dict[str, str] = {}  # successor pk -> predecessor pk
        for pk in frontier:
            nxt = _successor_of(rows[pk])
            if nxt:
                spk = scoped_key(s.team_id, s.user_id, nxt)
                if spk not in wanted or fused.get(pk, 0.0) > fused.get(wanted[spk], 0.0):
                    wanted[spk] = pk
        if not wanted:
            return
        missing = [pk for pk in wanted if pk not in rows]
        for chunk in chunked(missing):
            for r in store.rows(MEMORIES, f"{where} AND {in_list('pk', chunk)}", RESULT_COLUMNS).to_pylist():
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
_NEIGHBOUR_WINDOW = 256
"""How far (in log offsets of the messages partition) to look for a turn's neighbours:
turns of other spaces sharing the partition may lie in between."""
_TURN_COLUMNS = ("pk", "message_id", "session_id", "speaker", "content", "log_partition", "log_offset")
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
    column = store.rows(MESSAGES, f"{space_where(scope)} AND speaker IS NOT NULL", ["speaker"]).column("speaker")
    speakers = frozenset(str(v) for v in column.unique().to_pylist() if v)
    with _SPEAKERS_LOCK:
        if len(_SPEAKERS) >= _SPEAKERS_MAX:
            _SPEAKERS.clear()
        _SPEAKERS[key] = (now + SPEAKERS_TTL_S, speakers)
    return speakers


@dataclass(frozen=True)
class _Turn:
    """The L0 turn a memory was drawn from: who said it, where it sits in the log."""

    message_id: str
    session_id: str | None
    partition: int
    offset: int
    speaker: str | None
    question: bool


def _turn(row: Mapping[str, Any]) -> _Turn:
    return _Turn(
        message_id=row["message_id"],
        session_id=row.get("session_id"),
        partition=int(row.get("log_partition") or 0),
        offset=int(row.get("log_offset") or 0),
        speaker=row.get("speaker"),
        question=is_question(row.get("content") or ""),
    )


def _load_turns(store: LanceStore, scope: Scope, message_ids: Sequence[str], turns: dict[str, _Turn]) -> None:
    """Add the turns of ``message_ids`` (of the scope's space) that are not in ``turns``."""
    missing = sorted({m for m in message_ids if m not in turns})
    if not missing:
        return
    space = space_where(scope)
    keys = [scoped_key(scope.team_id, scope.user_id, m) for m in missing]
    for chunk in chunked(keys):
        for row in store.rows(MESSAGES, f"{space} AND {in_list('pk', chunk)}", _TURN_COLUMNS).to_pylist():
            turns[row["message_id"]] = _turn(row)


def _entity_stats(store: LanceStore, scope: Scope, keys: set[str]) -> tuple[dict[str, int], int]:
    """How many memories of the space name each entity, and how many there are."""
    return store.entity_frequencies(scope, keys), store.count_memories(scope)


def _sources(row: Mapping[str, Any]) -> list[str]:
    return list(row.get("source_message_ids") or ())


def _session_clause(session: str | None, partition: int, lo: int, hi: int) -> str:
    same = "session_id IS NULL" if session is None else f"session_id = {quote(session)}"
    return f"({same} AND log_partition = {partition} AND log_offset >= {lo} AND log_offset <= {hi})"


def _session_context(
    store: LanceStore,
    scope: Scope,
    where: str,
    rows: dict[str, dict[str, Any]],
) -> tuple[Future[list[dict[str, Any]]], Future[list[dict[str, Any]]]] | None:
    """Start reading, in the pool, every turn and every memory of the candidates'
    sessions (the memories under the search's own prefilter): the neighbours of a
    candidate's turns are among them. ``None`` when no candidate belongs to a session."""
    sessions = sorted({r["session_id"] for r in rows.values() if r.get("session_id") and _sources(r)})
    if not sessions:
        return None
    listed = ", ".join(quote(x) for x in sessions)
    turn_filter = f"{space_where(scope)} AND session_id IN ({listed})"
    memory_filter = f"{where} AND session_id IN ({listed})"
    turns = _pool().submit(lambda: store.rows(MESSAGES, turn_filter, _TURN_COLUMNS, limit=_MAX_TURNS).to_pylist())
    memories = _pool().submit(
        lambda: store.rows(MEMORIES, memory_filter, RESULT_COLUMNS, limit=_MAX_TURNS).to_pylist()
    )
    return turns, memories


def _neighbours(
    rows: dict[str, dict[str, Any]],
    turns: dict[str, _Turn],
    session_memories: Sequence[dict[str, Any]],
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

    before: dict[str, str | None] = {}
    after: dict[str, str | None] = {}
    lasts: dict[str, _Turn] = {}
    for pk, row in rows.items():
        src = sorted((turns[m] for m in _sources(row) if m in turns), key=lambda t: t.offset)
        if src:
            before[pk], after[pk], lasts[pk] = step(src[0], False), step(src[-1], True), src[-1]
    wanted = {m for m in [*before.values(), *after.values()] if m}
    by_message: dict[str, list[str]] = {}
    for row in session_memories:
        if any(m in wanted for m in _sources(row)):
            rows.setdefault(row["pk"], row)
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
            if src and max(src, key=lambda t: t.offset).question:
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

    rows: dict[str, dict[str, Any]] = {}
    vsim: dict[str, float] = {}
    tscore: dict[str, float] = {}
    context: dict[str, float] = {}
    priors: dict[str, float] = {}
    entity_stats: tuple[set[str], Future[tuple[dict[str, int], int]]] | None = None
    early_keys: set[str] | None = None
    if query.strip():
        # the speakers the query names move from the BM25 query to the speaker prior
        named = query_mentions(query, _space_speakers(store, scope)) if w.query_processing else set()
        text_query = lexical_query(query, named) if w.query_processing else query
        vrows, trows = _both_lists(store, embedder, query, where, n, text_query=text_query)
        turns: dict[str, _Turn] = {}
        context_on = w.context_forward > 0 or w.context_forward_statement > 0 or w.context_backward > 0
        conversational = context_on or w.speaker_weight > 0 or w.temporal_weight > 0
        for r in vrows:
            rows.setdefault(r["pk"], r)
            vsim[r["pk"]] = 1.0 - float(r["_distance"])
        for r in trows:
            rows.setdefault(r["pk"], r)
            tscore[r["pk"]] = float(r["_score"])
        # one parallel stage: the sessions' turns and memories, the entity statistics
        early = {e["name"] for r in rows.values() for e in (r.get("entities") or ())}
        early_keys = {normalize_content(m) for m in query_mentions(query, early)}
        if early_keys:
            entity_stats = (early_keys, _pool().submit(_entity_stats, store, scope, early_keys))
        pending = _session_context(store, scope, where, rows) if conversational else None
        if w.fusion == "score":
            fused = score_fusion(tscore, vsim, w.text_weight, w.fusion_vector_weight)
        else:
            fused = normalised_rrf(
                {"vector": [r["pk"] for r in vrows], "text": [r["pk"] for r in trows]},
                {"vector": w.vector_weight, "text": w.text_weight},
                w.rrf_k,
            )
        if conversational:
            session_memories: list[dict[str, Any]] = []
            if pending is not None:
                for row in pending[0].result():
                    t = _turn(row)
                    turns[t.message_id] = t
                session_memories = pending[1].result()
            # memories outside any session still get their speaker
            _load_turns(store, scope, [m for r in rows.values() if not r.get("session_id") for m in _sources(r)], turns)
            if context_on and turns:
                previous, questions = _neighbours(rows, turns, session_memories, fused)
                context = propagate_context(fused, previous, questions, w)
            speakers = {t.speaker for t in turns.values() if t.speaker}
            named_keys = {normalize_content(s) for s in query_mentions(query, speakers)}
            wants_time = asks_for_time(query)
            for pk, r in rows.items():
                said = {normalize_content(turns[m].speaker or "") for m in _sources(r) if m in turns}
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

    if not filters or filters.include_superseded:
        _pull_successors(store, scope, where, rows, fused)

    # entity boost: entities of the candidates that the query names, damped by IDF
    boosts: dict[str, float] = {}
    if query.strip():
        if early_keys is not None:
            # the names the query mentions among the candidates' entities, whose
            # statistics were read while the sessions were
            keys = early_keys
            df, total = entity_stats[1].result() if entity_stats is not None else ({}, 0)
        else:
            names = {e["name"] for r in rows.values() for e in (r.get("entities") or ())}
            keys = {normalize_content(m) for m in query_mentions(query, names)}
            df, total = _entity_stats(store, scope, keys) if keys else ({}, 0)
        if keys:
            idf = {key: entity_idf(df.get(key, 1), total) for key in keys}
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
