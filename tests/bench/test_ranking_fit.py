"""The fitting harness re-runs only the ranking: each text is embedded once, each list
read once, and the product's queries are back as they were afterwards."""

from __future__ import annotations

from pathlib import Path

from memstream.bench import ranking_fit
from memstream.bench.paraphrase import SCOPE, load_facts, project_facts
from memstream.domain.ranking import RankingWeights
from memstream.projections import search as s
from memstream.projections import search_queries
from memstream.projections.embedder import LocalEmbedder
from memstream.projections.store import LanceStore


class _Counting(LocalEmbedder):
    def __init__(self) -> None:
        super().__init__(384)
        self.texts: list[str] = []

    def embed(self, texts):  # type: ignore[no-untyped-def]
        self.texts.extend(texts)
        return super().embed(texts)


def test_memo_embedder_embeds_each_text_once() -> None:
    inner = _Counting()
    memo = ranking_fit.MemoEmbedder(inner)
    first = memo.embed(["a cat", "a dog", "a cat"])
    again = memo.embed(["a dog"])
    assert inner.texts == ["a cat", "a dog"]
    assert first[0] == first[2] and again[0] == first[1]
    assert (memo.model_id, memo.dim) == (inner.model_id, inner.dim)


def test_memoised_lists_read_once_and_rank_the_same(tmp_path: Path) -> None:
    facts = load_facts()[:20]
    store = LanceStore(tmp_path / "lance", embedding_dim=384)
    project_facts(store, LocalEmbedder(384), facts)
    embedder = ranking_fit.MemoEmbedder(LocalEmbedder(384))
    original = search_queries.text_query
    calls: list[str] = []

    async def counted_text(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append("text")
        return await original(*args, **kwargs)

    search_queries.text_query = counted_text  # type: ignore[assignment]
    try:
        # a filtered search asks LanceDB for its BM25 list (an unfiltered one ranks the
        # space's kept index in-process and asks nothing)
        persona = s.SearchFilters(memory_types=("persona",))
        with ranking_fit.memoised_lists():
            question = facts[0].question
            plain = s.search(store, embedder, SCOPE, question, 5, persona, cache=s.SearchCache())
            again = s.search(store, embedder, SCOPE, question, 5, persona, cache=s.SearchCache())
            other = s.search(store, embedder, SCOPE, question, 5, persona, weights=RankingWeights(speaker_weight=0.0))
            kept = s.search(store, embedder, SCOPE, question, 5, cache=s.SearchCache())
        assert calls == ["text"]
        assert [r.memory_id for r in kept] == [r.memory_id for r in plain]
        assert [r.memory_id for r in plain] == [r.memory_id for r in again]
        assert {r.memory_id for r in other} <= {f.memory_id for f in facts}
    finally:
        search_queries.text_query = original
    assert search_queries.text_query is original


def test_variants_change_one_field_at_a_time() -> None:
    got = list(ranking_fit.variants({"speaker_weight": [0.0, 2.0], "candidates": [50]}))
    assert got == [
        ("default", {}),
        ("speaker_weight=0.0", {"speaker_weight": 0.0}),
        ("speaker_weight=2.0", {"speaker_weight": 2.0}),
        ("candidates=50", {"candidates": 50}),
    ]
