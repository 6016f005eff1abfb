"""The simple baselines on the same tables as :func:`memstream.projections.search.hybrid.search`:
vector alone, BM25 alone and plain reciprocal rank fusion. The benchmarks compare
against them, and the extractor uses the first two for candidate recall."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from memstream.domain.events import Scope
from memstream.domain.ranking import normalised_rrf
from memstream.projections.embedders import Embedder
from memstream.projections.schema import MEMORIES
from memstream.projections.search import queries as q
from memstream.projections.search.filters import SearchFilters, build_where
from memstream.projections.search.results import ScoreParts, SearchResult, rows_of, to_result
from memstream.projections.store import VECTOR_REFINE_FACTOR, LanceStore, gather_all, require_scope, wait

__all__ = ["vector_search", "text_search", "rrf_search"]


def _vector_rows(
    store: LanceStore, scope: Scope, vector: Sequence[float], where: str, limit: int
) -> list[dict[str, Any]]:
    refine = VECTOR_REFINE_FACTOR if store.has_vector_index() else None
    table: pa.Table = wait(q.vector_query(q.native(store, MEMORIES), vector, where, limit, refine))
    return rows_of(table, scope)


def _text_rows(store: LanceStore, scope: Scope, query: str, where: str, limit: int) -> list[dict[str, Any]]:
    table = wait(q.text_query(q.native(store, MEMORIES), query, where, limit))
    return rows_of(table, scope) if table is not None else []


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
    vector = q.query_vector(embedder, store, query)
    refine = VECTOR_REFINE_FACTOR if store.has_vector_index() else None
    table = q.native(store, MEMORIES)
    text = query if text_query is None else text_query

    async def both() -> tuple[pa.Table, pa.Table | None]:
        v, t = await gather_all([q.vector_query(table, vector, where, n, refine), q.text_query(table, text, where, n)])
        return v, t

    vtable, ttable = wait(both())
    return rows_of(vtable, scope), (rows_of(ttable, scope) if ttable is not None else [])


def _default_candidates(k: int) -> int:
    """Candidate depth of the plain baselines (``rrf_search``)."""
    return max(50, 5 * k)


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
    q.check_k(k)
    vec = list(vector) if vector is not None else q.query_vector(embedder, store, query)
    out = []
    for row in _vector_rows(store, require_scope(scope), vec, where, k):
        sim = 1.0 - float(row["_distance"])
        out.append(to_result(row, sim, ScoreParts(sim, None, sim, 1.0, 1.0, 0.0, sim)))
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
    q.check_k(k)
    out = []
    for row in _text_rows(store, require_scope(scope), query, where, k):
        bm25 = float(row["_score"])
        out.append(to_result(row, bm25, ScoreParts(None, bm25, bm25, 1.0, 1.0, 0.0, bm25)))
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
    q.check_k(k)
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
        to_result(
            rows[pk],
            fused[pk],
            ScoreParts(vsim.get(pk), tscore.get(pk), fused[pk], 1.0, 1.0, 0.0, fused[pk]),
        )
        for pk in order
    ]

