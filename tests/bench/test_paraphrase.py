"""The paraphrase set keeps its rule, and its benchmark scores what it says."""

from __future__ import annotations

import re
from pathlib import Path

from memstream.bench.paraphrase import SCOPE, evaluate, load_facts, project_facts, recall_at
from memstream.domain.ranking import QUERY_STOP_WORDS
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.store.lance_store import LanceStore

# function words the questions and facts may share (articles, prepositions, pronouns)
_FUNCTION_WORDS = {
    "a", "an", "the", "in", "on", "at", "to", "of", "for", "by", "from", "with", "and",
    "or", "is", "are", "was", "be", "his", "her", "he", "she", "s", "as", "it", "that",
}


def _stems(text: str, name: str) -> set[str]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    content = {w for w in words if w not in _FUNCTION_WORDS | QUERY_STOP_WORDS and w != name.lower()}
    return {w[:4] for w in content}  # a crude stem: "travels" and "travel" meet


def test_questions_share_no_content_word_with_their_fact_but_the_name() -> None:
    facts = load_facts()
    assert len(facts) >= 90 and len({f.person for f in facts}) >= 10
    assert len({f.memory_id for f in facts}) == len(facts)
    for f in facts:
        assert f.person in f.text and f.person in f.question, f
        shared = _stems(f.text, f.person) & _stems(f.question, f.person)
        assert not shared, f"{f.question!r} shares {shared} with {f.text!r}"


def test_recall_counts_answers_within_the_cutoff() -> None:
    ranked = [["a", "b"], ["c", "d"], []]
    assert recall_at(ranked, ["b", "x", "y"], 1) == 0.0
    assert recall_at(ranked, ["b", "d", "y"], 2) == 2 / 3
    assert recall_at([], [], 5) == 0.0


def test_the_benchmark_projects_every_fact_and_scores_each_system(tmp_path: Path) -> None:
    facts = load_facts()[:16]
    embedder = LocalEmbedder(64)
    store = LanceStore(tmp_path / "lance", embedding_dim=64)
    project_facts(store, embedder, facts)
    assert store.count_memories(SCOPE) == 16
    scores = evaluate(store, embedder, facts)
    assert set(scores) == {"memstream", "vector", "bm25"}
    for s in scores.values():
        assert 0.0 <= s["recall@1"] <= s["recall@5"] <= 1.0
    # BM25 shares only the name with each answer: it cannot pick one person's fact
    assert scores["bm25"]["recall@1"] <= 0.5
