"""Candidate recall for the extractor: the current memories closest to a new one, read
from the LanceDB projection inside the memory's own scope (team, user, agent)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from memstream.domain.access import ReadScope
from memstream.domain.extraction import Candidate
from memstream.projections.schema import MEMORIES
from memstream.projections.search import RESULT_COLUMNS, SearchFilters, build_where, text_search
from memstream.projections.store import VECTOR_REFINE_FACTOR
from memstream.services.shards import store_for

__all__ = ["CandidateRecall", "store_recall", "DEDUP_CANDIDATES"]

log = logging.getLogger(__name__)

DEDUP_CANDIDATES = 5
"""Current memories of its space a new memory is compared with for duplicates."""


CandidateRecall = Callable[[ReadScope, Sequence[str], Sequence["Sequence[float] | None"], int], list[list[Candidate]]]
"""``(scope, contents, vectors (None where missing), k) -> candidates per content``;
synchronous (run off the event loop)."""


def store_recall(store: Any, embedder: Any) -> CandidateRecall:
    """Candidate recall from the LanceDB projection, for a whole window at once: the top
    ``k`` *current* memories (not superseded, not duplicates) the read scope sees (team,
    user and, pinned, agent: the isolation prefilter of
    :func:`memstream.projections.search.hybrid.build_where`)
    for each content, by cosine similarity of its vector (one multi-vector query for
    the window), else (no vector, the vector query failed or found nothing) by BM25 full
    text, else none."""
    return _StoreRecall(store, embedder)


_CURRENT = SearchFilters(include_superseded=False)


def _candidate(row: Mapping[str, Any], score: float | None) -> Candidate:
    return Candidate(
        memory_id=row["memory_id"],
        content=row["content"],
        memory_type=row.get("memory_type"),
        score=score,
        when=row.get("timestamp") or row.get("created_at"),
    )


class _StoreRecall:
    def __init__(self, store: Any, embedder: Any) -> None:
        self.store = store
        self.embedder = embedder

    def __call__(
        self, scope: ReadScope, contents: Sequence[str], vectors: Sequence[Sequence[float] | None], k: int
    ) -> list[list[Candidate]]:
        found: list[list[Candidate]] = [[] for _ in contents]
        with_vector = [i for i, v in enumerate(vectors) if v is not None]
        if with_vector:
            try:
                hits = self._by_vector(scope, [list(v) for v in vectors if v is not None], k)
                for i, cands in zip(with_vector, hits):
                    found[i] = cands[:k]
            except Exception as exc:  # noqa: BLE001 - recall degrades, never fails a run
                log.warning("vector recall failed, using full text: %s", exc)
        for i, content in enumerate(contents):
            if not found[i]:
                found[i] = self._by_text(scope, content, k)
        return found

    def _by_vector(self, scope: ReadScope, vectors: list[list[float]], k: int) -> list[list[Candidate]]:
        shard = store_for(self.store, scope)  # the space's shard when the set is sharded
        query = (
            shard.table(MEMORIES)
            .search(vectors if len(vectors) > 1 else vectors[0], vector_column_name="vector")
            .distance_type("cosine")
            .where(build_where(scope, _CURRENT), prefilter=True)
            .select([*RESULT_COLUMNS, "_distance"])
            .limit(k)
        )
        if shard.has_vector_index():
            query = query.refine_factor(VECTOR_REFINE_FACTOR)
        out: list[list[Candidate]] = [[] for _ in vectors]
        for row in query.to_arrow().to_pylist():
            index = int(row.get("query_index") or 0)
            out[index].append(_candidate(row, 1.0 - float(row["_distance"])))
        return out

    def _by_text(self, scope: ReadScope, content: str, k: int) -> list[Candidate]:
        try:
            results = text_search(store_for(self.store, scope), self.embedder, scope, content, k, _CURRENT)
        except Exception as exc:  # noqa: BLE001
            log.warning("full-text recall failed, judging without candidates: %s", exc)
            return []
        return [
            Candidate(r.memory_id, r.content, r.memory_type, r.score, r.timestamp or r.created_at) for r in results[:k]
        ]
