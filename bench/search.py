"""``memstream bench search``: hybrid search latency against LanceDB vector search alone.

For each size (100,000 and 1,000,000 memories; ``--quick``: 100,000), all in ONE
memory space (the worst case for a scoped search: the prefilter keeps every row):

1. the memories are generated (:func:`memstream.bench._events.make_corpus`, 20 %
   naming an entity, 1 in 50 superseded by the next one) and embedded by the
   product's configured embedder (the local default, 384-d), so stored vectors and
   query vectors come from one model;
2. the tables are built by bulk ``add`` of exactly the rows the projector writes
   (memories, entities, and the L0 turn each memory was drawn from, in sessions of
   50 turns, since search reads turns for its conversational context; the smoke test
   checks all three against the real projector), not through the worker: a million events through the worker would
   take the better part of an hour here and measure the projector, not search;
3. the indexes are made the way the worker's maintenance makes them:
   ``LanceStore.optimize()`` (compaction, full-text index current) then
   ``LanceStore.ensure_indexes()`` (BTree scalar indexes, and from
   ``vector_index_threshold`` rows, default 100,000, the IVF_PQ vector index);
4. the same queries (2 to 4 vocabulary words, a quarter naming an entity) run
   through the product's :func:`memstream.projections.search.hybrid.search` (``k`` = 10,
   embedding of the query included) and through LanceDB alone: the same vector query
   the product issues (cosine, same scope prefilter, same refine factor when an index
   exists) for the ``k`` results, with the query vector computed beforehand.

``ratio_p50`` = hybrid p50 / raw vector p50; the target is <= 2. The top-level
figures are those of the largest size; every size is under ``sizes``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from lancedb.query import MatchQuery

from memstream.bench._events import (
    TEAM,
    BenchWorkdir,
    bench_settings,
    embed_contents,
    entity_rows,
    machine_info,
    make_corpus,
    make_queries,
    memory_rows,
    message_rows,
    percentile,
    print_table,
    progress_bar,
    status,
)
from memstream.domain.events import Scope
from memstream.projections.embedders import Embedder, build_embedder
from memstream.projections.schema import ENTITIES, MEMORIES, MESSAGES
from memstream.projections.search import RESULT_COLUMNS, SearchCache, build_where, search
from memstream.projections.store import VECTOR_REFINE_FACTOR, LanceStore

__all__ = ["run", "TARGET_RATIO", "DEFAULT_SIZES", "QUICK_SIZES", "measure_size"]

TARGET_RATIO = 2.0
DEFAULT_SIZES: tuple[int, ...] = (100_000, 1_000_000)
QUICK_SIZES: tuple[int, ...] = (100_000,)
_ADD_CHUNK = 100_000
_WARMUP = 10


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def _build(store: LanceStore, corpus: Any, model_id: str) -> dict[str, Any]:
    n = len(corpus)
    with progress_bar() as bar:
        task = bar.add_task("bulk add", total=n)
        for start in range(0, n, _ADD_CHUNK):
            stop = min(n, start + _ADD_CHUNK)
            store.table(MEMORIES).add(memory_rows(corpus, model_id=model_id, start=start, stop=stop, superseded_every=50))
            store.table(MESSAGES).add(message_rows(corpus, start=start, stop=stop))
            ents = entity_rows(corpus, start=start, stop=stop)
            if ents.num_rows:
                store.table(ENTITIES).add(ents)
            bar.update(task, completed=stop)
    status("optimising and building indexes as the worker's maintenance does")
    started = time.perf_counter()
    store.optimize()
    created = store.ensure_indexes()
    return {"index_build_s": time.perf_counter() - started, "indexes_created": created}


@dataclass
class _Timings:
    """Per query (after the warm-up), in ms: memstream's search, the raw vector query,
    raw BM25 and the query embedding; and how often a result list came back short."""

    hybrid: list[float] = field(default_factory=list)
    vector: list[float] = field(default_factory=list)
    text: list[float] = field(default_factory=list)
    embed: list[float] = field(default_factory=list)
    empty: int = 0
    short_raw: int = 0


def measure_size(size: int, *, queries: int, k: int, keep: bool = False) -> dict[str, Any]:
    """Build one table of ``size`` memories in one space and time the queries."""
    with BenchWorkdir(f"search-{size}", keep=keep) as wd:
        settings = bench_settings(wd.path)
        embedder = build_embedder(settings.embeddings)
        status(f"generating {size:,} memories in one space")
        corpus = make_corpus(
            size,
            spaces=1,
            dim=settings.embeddings.dim,
            entity_rate=0.2,
            vectors=np.zeros((size, settings.embeddings.dim), dtype=np.float32),
        )
        embed_contents(corpus, embedder, label=f"embedding ({embedder.model_id})")
        store = LanceStore.from_settings(settings.storage, settings.embeddings.dim)
        built = _build(store, corpus, embedder.model_id)
        del corpus
        indexed = store.has_vector_index()
        t = _time_queries(store, embedder, make_queries(queries + _WARMUP), k, indexed, f"queries at {size:,}")
    p50_h, p50_v = percentile(t.hybrid, 50), percentile(t.vector, 50)
    return {
        "memories": size,
        "queries": len(t.hybrid),
        "k": k,
        "vector_index": "IVF_PQ" if indexed else "none (exact)",
        "hybrid_p50_ms": p50_h,
        "hybrid_p99_ms": percentile(t.hybrid, 99),
        "raw_vector_p50_ms": p50_v,
        "raw_vector_p99_ms": percentile(t.vector, 99),
        "ratio_p50": p50_h / p50_v,
        "raw_fts_p50_ms": percentile(t.text, 50),
        "query_embed_p50_ms": percentile(t.embed, 50),
        "hybrid_empty_results": t.empty,
        "raw_vector_short_results": t.short_raw,
        "index_build_s": built["index_build_s"],
        "indexes_created": built["indexes_created"],
    }


def _time_queries(
    store: LanceStore, embedder: Embedder, texts: list[str], k: int, indexed: bool, label: str
) -> _Timings:
    """Every query through memstream's search and through LanceDB alone, side by side."""
    scope = Scope(team_id=TEAM, user_id="u00")
    where = build_where(scope)
    table = store.table(MEMORIES)
    columns = [*RESULT_COLUMNS, "_distance"]
    cache = SearchCache()  # held across the queries, as a serving process holds one

    def raw_vector(vec: list[float]) -> int:
        q = (
            table.search(vec, vector_column_name="vector")
            .distance_type("cosine")
            .where(where, prefilter=True)
            .select(columns)
            .limit(k)
        )
        if indexed:
            q = q.refine_factor(VECTOR_REFINE_FACTOR)
        return int(q.to_arrow().num_rows)

    def raw_text(text: str) -> int:
        q = (
            table.search(MatchQuery(text, "content"), query_type="fts")  # type: ignore[call-arg]
            .where(where, prefilter=True)
            .select([*RESULT_COLUMNS, "_score"])
            .limit(k)
        )
        return int(q.to_arrow().num_rows)

    t = _Timings()
    with progress_bar() as bar:
        task = bar.add_task(label, total=len(texts))
        for i, q in enumerate(texts):
            t0 = time.perf_counter()
            vec = list(embedder.embed([q])[0])
            t1 = time.perf_counter()
            # Alternate the order so neither side always runs on warmer caches.
            if i % 2:
                results = search(store, embedder, scope, q, k, cache=cache)
                t2 = time.perf_counter()
                got = raw_vector(vec)
                t3 = time.perf_counter()
                h, v = t2 - t1, t3 - t2
            else:
                got = raw_vector(vec)
                t2 = time.perf_counter()
                results = search(store, embedder, scope, q, k, cache=cache)
                t3 = time.perf_counter()
                v, h = t2 - t1, t3 - t2
            t4 = time.perf_counter()
            raw_text(q)
            t5 = time.perf_counter()
            if i >= _WARMUP:
                t.hybrid.append(_ms(h))
                t.vector.append(_ms(v))
                t.embed.append(_ms(t1 - t0))
                t.text.append(_ms(t5 - t4))
                t.empty += not results
                t.short_raw += got < k
            bar.update(task, completed=i + 1)
    return t


def run(
    quick: bool = False,
    *,
    sizes: tuple[int, ...] | None = None,
    queries: int = 300,
    k: int = 10,
    keep: bool = False,
) -> dict[str, Any]:
    """Measure every size, print a table, return the figures (see the module doc)."""
    chosen = tuple(sizes or (QUICK_SIZES if quick else DEFAULT_SIZES))
    if not chosen or min(chosen) < 1 or queries < 1 or k < 1:
        raise ValueError("sizes, queries and k must be positive")
    machine = machine_info()
    per_size = [measure_size(s, queries=queries, k=k, keep=keep) for s in chosen]
    top = max(per_size, key=lambda r: r["memories"])
    worst = max(r["ratio_p50"] for r in per_size)
    result: dict[str, Any] = {
        "benchmark": "search",
        "quick": quick,
        "memories": top["memories"],
        "hybrid_p50_ms": top["hybrid_p50_ms"],
        "hybrid_p99_ms": top["hybrid_p99_ms"],
        "raw_vector_p50_ms": top["raw_vector_p50_ms"],
        "ratio_p50": top["ratio_p50"],
        "ratio_p50_worst": worst,
        "target_ratio": TARGET_RATIO,
        "meets_target": worst <= TARGET_RATIO,
        "sizes": {str(r["memories"]): r for r in per_size},
        "machine": {**machine, "load_1m_end": machine_info()["load_1m"]},
    }
    rows: list[tuple[str, str, str]] = []
    for r in per_size:
        m = f"{r['memories']:,}"
        rows += [
            (f"hybrid_p50_ms @{m}", f"{r['hybrid_p50_ms']:.1f}", "memstream search, k=10, query embedding included"),
            (f"hybrid_p99_ms @{m}", f"{r['hybrid_p99_ms']:.1f}", ""),
            (f"raw_vector_p50_ms @{m}", f"{r['raw_vector_p50_ms']:.1f}", f"LanceDB vector top-{k}, same prefilter, {r['vector_index']}"),
            (
                f"ratio_p50 @{m}",
                f"{r['ratio_p50']:.2f}",
                f"target <= {TARGET_RATIO} ({'met' if r['ratio_p50'] <= TARGET_RATIO else 'NOT met'})",
            ),
            (f"raw_fts_p50_ms @{m}", f"{r['raw_fts_p50_ms']:.1f}", "LanceDB BM25 alone, for context"),
            (f"query_embed_p50_ms @{m}", f"{r['query_embed_p50_ms']:.2f}", "local embedder, one query"),
            (f"index_build_s @{m}", f"{r['index_build_s']:.1f}", "optimize + ensure_indexes"),
        ]
    rows.append(("load_1m", f"{machine['load_1m']} -> {result['machine']['load_1m_end']}", f"{machine['cores']} cores, shared"))
    print_table(f"memstream bench search: one memory space, {queries} queries per size", rows)
    return result
