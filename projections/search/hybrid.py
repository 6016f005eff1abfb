"""Hybrid search over the memories table, inside one memory space, always.

:func:`search` is memstream's ranking; :func:`vector_search`, :func:`text_search` and
:func:`rrf_search` (``baselines``) are the simple baselines on the same tables.
A call without a scope, or with an empty team or user, raises
:class:`ScopeRequiredError`; it is never widened. The agent of an event ``Scope`` does
not narrow the search (``SearchFilters.agent_id`` does); a pinned ``ReadScope``
confines every read to its agent's rows.

How :func:`search` ranks (formulas in ``memstream.domain.ranking``):

1. up to ``candidates`` memories by vector similarity and as many by BM25 over
   ``content`` (without the speakers the query names: they become a prior), under
   the same prefilter (``filters``), read as ``reads`` describes;
2. score fusion of the two lists (weighted RRF with ``fusion="rrf"``);
3. neighbouring turns pass on a share of their memories' scores
   (``conversation``);
4. a superseded or duplicate candidate pulls in its successor, which inherits the
   candidate's score if higher (``search_view.pull_successors``);
5. speaker and time priors and the question penalty, recency, supersession, entity
   boost and priority, then every superseded or duplicate memory capped below its
   successor (``ranking``);
6. the optional ``reranker`` sees every candidate in that order and returns the list
   to cut at ``k``.

An empty query lists instead: the memories that pass the filters, newest first, at
most :data:`BROWSE_LIMIT`, scored by recency and supersession only. What a search
reads is kept between searches in the :class:`SearchCache` the caller passes
(results are the same with a cold one).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any

from lancedb.query import ColumnOrdering

from memstream.domain.events import Scope
from memstream.domain.ranking import RankingWeights, lexical_query, propagate_context, query_mentions
from memstream.projections.embedders import Embedder
from memstream.projections.schema import MEMORIES
from memstream.projections.search import queries as q
from memstream.projections.search.baselines import rrf_search, text_search, vector_search
from memstream.projections.search.cache import SearchCache
from memstream.projections.search.conversation import CandidateTurns, conversation, joiner, neighbours, priors
from memstream.projections.search.facts import space_speakers
from memstream.projections.search.filters import SearchFilters, build_where, filter_parts
from memstream.projections.search.ranking import Evidence, entity_boosts, fuse, ranked
from memstream.projections.search.reads import candidates as read_candidates
from memstream.projections.search.results import RESULT_COLUMNS, Reranker, ScoreParts, SearchResult
from memstream.projections.search.view import Successors, pull_successors
from memstream.projections.store import VECTOR_REFINE_FACTOR, LanceStore, ScopeRequiredError, require_scope, wait

__all__ = [
    "SearchFilters",
    "ScoreParts",
    "SearchResult",
    "SearchCache",
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

BROWSE_LIMIT = 1_000


def hybrid_candidates(k: int) -> int:
    """Candidate depth of :func:`search`: each list's length before fusion (the
    measurements behind it are in docs/benchmarks-history.md)."""
    return max(30, 3 * k)


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
    cache: SearchCache | None = None,
) -> list[SearchResult]:
    """memstream's hybrid search in the scope's memory space (see the module
    docstring). Raises :class:`ScopeRequiredError` without a scope. ``cache``: what
    earlier searches read (none: this search reads everything itself)."""
    scope = require_scope(scope)
    where = build_where(scope, filters)
    q.check_k(k)
    w = weights or RankingWeights()
    now = now or datetime.now(timezone.utc)
    extra = filter_parts(filters)
    follow = not filters or filters.include_superseded
    cache = cache if cache is not None else SearchCache()
    if query.strip():
        n = candidates or hybrid_candidates(k)
        rows, ev, boosts, successors = _hybrid(cache, store, embedder, scope, query, where, n, extra, follow, w)
    else:
        rows, ev, boosts = _browse(store, where), Evidence(), {}
        ev.fused = {pk: 1.0 for pk in rows}
        successors = Successors(store, scope, extra) if follow else None
    if not rows:
        return []
    if successors is not None:
        pull_successors(successors, rows, ev.fused)
    drop_zero = reranker is None and bool(query.strip())
    results = ranked(rows, ev, boosts, now, w, drop_zero=drop_zero, k=None if reranker is not None else k)
    if reranker is not None:
        results = list(reranker(query, results))
    return results[:k]


def _hybrid(
    cache: SearchCache,
    store: LanceStore,
    embedder: Embedder,
    scope: Scope,
    query: str,
    where: str,
    n: int,
    extra: list[str],
    follow: bool,
    w: RankingWeights,
) -> tuple[dict[str, dict[str, Any]], Evidence, dict[str, float], Successors | None]:
    """The candidates of a query, the evidence that ranks them, their entity boosts,
    and their successors read so far."""
    q.check_dim(embedder, store)
    # the query is embedded from here on, beside the query processing and the reads
    embedding = q.EMBEDDING_THREADS.submit(q.query_vector, embedder, store, query)
    # the speakers the query names move from the BM25 query to the speaker prior
    named = query_mentions(query, space_speakers(cache, store, scope)) if w.query_processing else set()
    text_query = lexical_query(query, named) if w.query_processing else query
    context_on = w.context_forward > 0 or w.context_forward_statement > 0 or w.context_backward > 0
    conversational = context_on or w.speaker_weight > 0 or w.temporal_weight > 0 or w.question_penalty < 1 or w.turn_prior < 1
    refine = VECTOR_REFINE_FACTOR if store.has_vector_index() else None
    # one wait: both lists (the query embedded meanwhile), then what their
    # candidates need that the space's cache does not hold
    g, successors = wait(
        read_candidates(
            cache, store, scope, lambda: asyncio.wrap_future(embedding), refine, query, text_query, where, n,
            conversational=conversational, successor_filters=extra if follow else None,
            entities=w.entity_weight > 0,
        )
    )
    rows = g.rows
    ev = fuse(scope, g.vector, g.text, w, rows, text_query)
    if conversational:
        turns, lines, members = conversation(g)
        src = CandidateTurns(turns)
        if context_on and turns:
            join = joiner(store, scope, g.view, extra)
            previous, questions = neighbours(rows, src, lines, members, ev.fused, join)
            ev.context = propagate_context(ev.fused, previous, questions, w)
        ev.priors = priors(query, rows, src, w, named)
    for pk in rows:
        ev.fused.setdefault(pk, 0.0)
    return rows, ev, entity_boosts(rows, g.entity_keys, g.entity_stats, w), successors


def _browse(store: LanceStore, where: str) -> dict[str, dict[str, Any]]:
    """The newest :data:`BROWSE_LIMIT` memories that pass ``where``, by key."""
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
    return {r["pk"]: r for r in listing}
