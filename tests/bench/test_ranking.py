"""The ranking bench's scoring: recall over what results bring, per LoCoMo category
with "overall" over categories 1-4, and what each shape counts as found."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from memstream.bench.ranking import recall, summarise
from memstream.bench.ranking_shapes import Query, Shape
from memstream.domain.events import Scope

S = Scope(team_id="t", user_id="u")


def test_recall_counts_the_first_k_results_only() -> None:
    found = [("D1",), (), ("D2", "D3")]
    assert recall(found, {"D1", "D2"}, 1) == 0.5
    assert recall(found, {"D1", "D2"}, 3) == 1.0
    with pytest.raises(ValueError):
        recall(found, set(), 3)


def test_summary_per_category_and_overall_without_adversarial() -> None:
    shape = Shape("locomo_atomic", queries=[
        Query(S, "a", frozenset({"D1"}), 1), Query(S, "b", frozenset({"D2"}), 5),
    ])
    out = summarise(shape, [[("D1",)], [("D2",)]])
    assert out["1"]["recall@1"] == 1.0 and out["5"]["n"] == 1
    assert out["overall"]["n"] == 1  # category 5 has no answer to find and stays apart


def test_each_shape_finds_its_own_unit() -> None:
    hit = SimpleNamespace(memory_id="obs-1", source_message_ids=("D1:3",))
    assert Shape("locomo_turns").found(hit) == ("D1:3",)
    assert Shape("locomo_atomic", evidence={"obs-1": ("D1:3", "D1:5")}).found(hit) == ("D1:3", "D1:5")
    assert Shape("mixed").found(hit) == ("obs-1",)
