"""The LanceDB queries search is built from: the vector and BM25 lists, filtered
scans and lookups by id, on the tables' asynchronous handles (``lance_async``) so
several can be awaited together."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
from lancedb.query import FullTextOperator, MatchQuery

from memstream.domain.events import Scope
from memstream.projections.embedders import Embedder, embed_query
from memstream.projections.search.results import READ_COLUMNS
from memstream.projections.store import LanceStore, async_table, chunked, gather_all

__all__ = ["EMBEDDING_THREADS", "native", "vector_query", "text_query", "scan", "by_ids", "match_query", "check_dim", "query_vector", "check_k"]


EMBEDDING_THREADS = ThreadPoolExecutor(min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="query-embed")
"""Where searches embed their queries (as many threads as asyncio's default executor),
started before the reads so that the query processing runs beside the embedding."""


def native(store: LanceStore, name: str) -> Any:
    """The asynchronous handle of the store's table ``name`` (see ``lance_async``)."""
    return async_table(store.table(name))


async def vector_query(
    table: Any,
    vector: Sequence[float],
    where: str,
    limit: int,
    refine: int | None,
    columns: Sequence[str] = READ_COLUMNS,
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


async def text_query(
    table: Any, query: str, where: str, limit: int, columns: Sequence[str] = READ_COLUMNS
) -> pa.Table | None:
    """The ``limit`` best BM25 matches of ``query`` under the prefilter ``where``:
    ``columns`` and ``_score`` (``None`` for a blank query: nothing to match)."""
    if not query.strip():
        return None
    q = table.query().limit(limit).select([*columns, "_score"]).where(where)
    return await q.nearest_to_text(match_query(query), None).to_arrow()


async def scan(table: Any, where: str, columns: Sequence[str], limit: int | None = None) -> pa.Table:
    """A filtered read (all matches unless ``limit``), as ``LanceStore.rows``."""
    q = table.query()
    if limit is not None:
        q = q.limit(limit)
    return await q.select(list(columns)).where(where).to_arrow()


async def by_ids(
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
    table = native(store, name)
    reads = [
        scan(table, " AND ".join([store.ids_where(scope, id_column, chunk), *extra]), columns)
        for chunk in chunked(list(ids))
    ]
    parts = await gather_all(reads)
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def match_query(query: str) -> MatchQuery:
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


def check_dim(embedder: Embedder, store: LanceStore) -> None:
    if embedder.dim != store.embedding_dim:
        raise ValueError(
            f"the embedder makes {embedder.dim}-dimension vectors; the store holds {store.embedding_dim}"
        )
    store.check_vector_model(embedder.model_id)


def query_vector(embedder: Embedder, store: LanceStore, query: str) -> list[float]:
    check_dim(embedder, store)
    return embed_query(embedder, query).tolist()


def check_k(k: int) -> None:
    if k < 1:
        raise ValueError("k must be at least 1")

