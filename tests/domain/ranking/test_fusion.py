"""The pure ranking math: fusion, recency, supersession caps, entity mentions and IDF."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memstream.domain.ranking.fusion import (
    entity_boost,
    entity_idf,
    final_score,
    normalised_rrf,
    order_after_successors,
    query_mentions,
    recency_factor,
    recency_score,
    supersession_factor,
    tokens,
    weighted_rrf,
)
from memstream.domain.ranking.weights import HALF_LIFE_SECONDS, RRF_K, RankingWeights


def test_weighted_rrf_matches_the_formula() -> None:
    scores = weighted_rrf({"vector": ["a", "b", "c"], "text": ["b", "d"]}, {"vector": 1.0, "text": 2.0})
    assert scores["a"] == pytest.approx(1 / (RRF_K + 1))
    assert scores["b"] == pytest.approx(1 / (RRF_K + 2) + 2 / (RRF_K + 1))
    assert scores["c"] == pytest.approx(1 / (RRF_K + 3))
    assert scores["d"] == pytest.approx(2 / (RRF_K + 2))
    # a list without a weight counts 1; a repeated id keeps its best rank only
    assert weighted_rrf({"x": ["a", "a", "b"]}, {}, k=0) == {"a": 1.0, "b": 0.5}


def test_normalised_rrf_is_one_for_first_everywhere() -> None:
    fused = normalised_rrf({"vector": ["a", "b"], "text": ["a", "c"]}, {"vector": 1.0, "text": 1.0})
    assert fused["a"] == pytest.approx(1.0)
    assert fused["c"] == pytest.approx(fused["b"])
    assert 0 < fused["b"] < 0.5
    # an empty list does not lower the ceiling
    only_vector = normalised_rrf({"vector": ["a"], "text": []}, {"vector": 1.0, "text": 1.0})
    assert only_vector == {"a": pytest.approx(1.0)}
    assert normalised_rrf({"vector": [], "text": []}, {}) == {}


@given(st.lists(st.sampled_from("abcdefgh"), max_size=8), st.lists(st.sampled_from("abcdefgh"), max_size=8))
def test_rrf_scores_are_bounded_and_monotone_in_rank(vec: list[str], txt: list[str]) -> None:
    fused = normalised_rrf({"vector": vec, "text": txt}, {"vector": 1.0, "text": 1.0})
    assert all(0.0 < s <= 1.0 + 1e-12 for s in fused.values())
    order = list(dict.fromkeys(vec))
    if not txt:
        assert [fused[d] for d in order] == sorted((fused[d] for d in order), reverse=True)


def test_recency_halves_every_half_life() -> None:
    assert recency_score(0) == 1.0
    assert recency_score(HALF_LIFE_SECONDS) == pytest.approx(0.5)
    assert recency_score(3 * HALF_LIFE_SECONDS) == pytest.approx(0.125)
    assert recency_score(-1_000) == 1.0  # the future is "now"
    assert recency_score(10, half_life_seconds=10) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        recency_score(1, half_life_seconds=0)
    assert recency_factor(1.0) == 1.0
    assert recency_factor(0.0) == pytest.approx(0.9)  # age costs at most 10 %


def test_supersession_factor() -> None:
    w = RankingWeights(superseded_penalty=0.4, duplicate_penalty=0.7)
    assert supersession_factor(False, False, w) == 1.0
    assert supersession_factor(True, False, w) == 0.4
    assert supersession_factor(False, True, w) == 0.7
    assert supersession_factor(True, True, w) == 0.4


def test_entity_idf_damps_common_entities() -> None:
    assert entity_idf(1, 100) == pytest.approx(1.0)
    assert entity_idf(100, 100) == pytest.approx(math.log(2) / math.log(101))
    assert entity_idf(1, 100) > entity_idf(10, 100) > entity_idf(100, 100) > 0
    assert entity_idf(0, 0) == pytest.approx(1.0)  # clamped, never a division by zero
    assert entity_boost([]) == 0.0
    assert entity_boost([0.2, 0.9], weight=0.5) == pytest.approx(0.45)


def test_query_mentions_whole_words_only() -> None:
    names = ["Alice", "New York", "Al", "Bob Smith", "ÉCOLE"]
    assert query_mentions("What did alice's sister do in new   YORK?", names) == {"Alice", "New York"}
    assert query_mentions("Alicent and Bob", names) == set()
    assert query_mentions("école", names) == {"ÉCOLE"}
    assert query_mentions("", names) == set()
    assert tokens("Hello, World!") == ["hello", "world"]


def test_final_score_composition() -> None:
    w = RankingWeights()
    assert final_score(1.0, 1.0, 1.0, 0.0, w) == 1.0
    assert final_score(0.5, 0.0, 0.5, 0.3, w) == pytest.approx(0.5 * 0.9 * 0.5 * 1.3)


def test_successors_always_rank_above() -> None:
    scores = {"old": 0.9, "mid": 0.8, "new": 0.1, "alone": 0.5}
    capped = order_after_successors(scores, {"old": "mid", "mid": "new"})
    assert capped["new"] == 0.1 and capped["alone"] == 0.5
    assert capped["new"] > capped["mid"] > capped["old"]
    # a successor that is not among the results does not cap
    assert order_after_successors({"old": 0.9}, {"old": "gone"}) == {"old": 0.9}
    # already lower: unchanged
    assert order_after_successors({"old": 0.1, "new": 0.9}, {"old": "new"}) == {"old": 0.1, "new": 0.9}


def test_successor_cycles_terminate() -> None:
    capped = order_after_successors({"a": 0.9, "b": 0.8}, {"a": "b", "b": "a"})
    assert set(capped) == {"a", "b"}
    assert all(v <= 0.9 for v in capped.values())


@given(
    # real scores are 0 or well above the float underflow range
    st.dictionaries(st.sampled_from("abcdef"), st.just(0.0) | st.floats(1e-9, 1.0), min_size=1),
    st.dictionaries(st.sampled_from("abcdef"), st.sampled_from("abcdef")),
)
def test_caps_hold_for_any_acyclic_links(scores: dict[str, float], links: dict[str, str]) -> None:
    # keep only links that go "forward" in the alphabet: acyclic by construction
    successor = {k: v for k, v in links.items() if v > k}
    capped = order_after_successors(scores, successor)
    for doc, nxt in successor.items():
        if doc in scores and nxt in scores:
            assert capped[doc] < capped[nxt] or capped[nxt] == 0.0
    assert all(capped[d] <= scores[d] for d in scores)


def test_weights_are_validated() -> None:
    with pytest.raises(ValueError):
        RankingWeights(recency_weight=1.5)
    with pytest.raises(ValueError):
        RankingWeights(superseded_penalty=0.0)
    with pytest.raises(ValueError):
        RankingWeights(half_life_s=0)
