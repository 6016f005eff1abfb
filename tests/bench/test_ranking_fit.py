"""The fit's grid is a full product and its objective weighs every shape the same and
leaves a held-out conversation's queries out."""

from __future__ import annotations

from types import SimpleNamespace

from memstream.bench import ranking_fit
from memstream.bench.ranking_shapes import Query, Shape
from memstream.domain.events import Scope

S = Scope(team_id="t", user_id="u")


def test_variants_are_the_full_product() -> None:
    got = ranking_fit.variants({"a": [1, 2], "b": [True, False]})
    assert got == [{"a": 1, "b": True}, {"a": 1, "b": False}, {"a": 2, "b": True}, {"a": 2, "b": False}]


def test_objective_weighs_shapes_equally_and_leaves_a_conversation_out() -> None:
    turns = Shape("locomo_turns", queries=[
        Query(S, "q1", frozenset({"D1"}), 1, "conv-a"), Query(S, "q2", frozenset({"D2"}), 1, "conv-b"),
        Query(S, "q3", frozenset({"D3"}), 5, "conv-a"),  # adversarial: never scored
    ])
    facts = Shape("person_facts", queries=[Query(S, "q", frozenset({"m"}), 0, "Alice")])
    bench = SimpleNamespace(shapes={"locomo_turns": turns, "person_facts": facts})
    found = {"locomo_turns": [[("D1",)], [("x",)], [("x",)]], "person_facts": [[("x",)] * 5 + [("m",)]]}
    # turns: one of two found in the top 5 (0.5); facts: found at 6, so only in the top 10 (0.5)
    assert ranking_fit.score(bench, found, "locomo_turns") == 0.5
    assert ranking_fit.score(bench, found, "person_facts") == 0.5
    assert ranking_fit.objective(bench, found, ["locomo_turns", "person_facts"]) == 0.5
    assert ranking_fit.objective(bench, found, ["locomo_turns", "person_facts"], leave="conv-b") == 0.75
