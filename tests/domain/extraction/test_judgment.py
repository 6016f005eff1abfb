"""The judgment plan and reading its answer."""

from __future__ import annotations

from typing import Any

import pytest

from memstream.domain.events import LinkRelation
from memstream.domain.extraction.judgment import (
    Action,
    JudgmentFormatError,
    parse_judgment,
    plan_judgment,
    render_judgment,
)
from tests.domain.extraction.helpers import cand, draft


def test_plan_numbers_shared_candidates_once_and_skips_drafts_without_any() -> None:
    drafts = [draft("Ana likes pepperoni."), draft("Bo likes rum."), draft("Ana dislikes cheese pizza.")]
    shared = cand("mem-cheese", "Ana likes cheese pizza.")
    plan = plan_judgment(drafts, [[shared, cand("mem-x", "Ana likes pizza.")], [], [shared]])
    assert plan.items == ((1, 0, (1, 2)), (2, 2, (1,)))
    assert plan.candidates[1].memory_id == "mem-cheese"
    text = render_judgment(plan, drafts)
    assert 'N1 [persona] "Ana likes pepperoni."' in text
    assert '[1] [persona] "Ana likes cheese pizza." (from 2024-05-05)' in text
    assert "Bo likes rum" not in text
    assert "mem-cheese" not in text  # real ids are never shown
    with pytest.raises(ValueError):
        plan_judgment(drafts, [[]])


def test_parse_judgment_maps_short_ids_back_and_distrusts_the_rest() -> None:
    drafts = [draft("Ana likes pepperoni."), draft("Ana likes tea."), draft("Ana is 30."), draft("Ana owns a cat.")]
    plan = plan_judgment(
        drafts,
        [
            [cand("mem-cheese", "Ana likes cheese pizza."), cand("mem-pizza", "Ana eats pizza on Fridays.")],
            [cand("mem-tea", "Ana loves tea.")],
            [cand("mem-age", "Ana is 29.")],
            [cand("mem-dog", "Ana owns a dog.")],
        ],
    )
    got = parse_judgment(
        {
            "decisions": [
                {
                    "new": 1,
                    "action": "update",
                    "target": 1,
                    "links": [
                        {"target": 1, "relation": "preference_update"},
                        {"target": 2, "relation": "same_entity"},
                        {"target": 4, "relation": "same_entity"},  # not this draft's candidate
                        {"target": 2, "relation": "supersedes"},  # not for the judge to name
                        {"target": 2, "relation": "likes"},
                    ],
                    "reason": "changed preference",
                },
                {"new": "N2", "action": "merge", "target": "[3]"},
                {"new": 3, "action": "update", "target": 99},  # invented target
                {"new": 4, "action": "obliterate"},
                {"new": 1, "action": "drop"},  # a second answer for N1 is ignored
                {"new": 17, "action": "drop"},  # no such item
                "garbage",
            ]
        },
        plan,
        len(drafts),
    )
    assert got[0].action is Action.update and got[0].target == "mem-cheese"
    assert got[0].links == (("mem-cheese", LinkRelation.preference_update), ("mem-pizza", LinkRelation.same_entity))
    assert got[0].decided_by == "llm" and got[0].reason == "changed preference"
    assert {n.split(":")[0] for n in got[0].notes} == {"invalid_link_target", "relation_not_allowed", "unknown_relation"}
    assert got[1].action is Action.merge and got[1].target == "mem-tea"
    assert got[2].action is Action.store and got[2].notes == ("invalid_target:99",)
    assert got[3].action is Action.store and got[3].notes == ("unknown_action:obliterate",)


def test_unanswered_and_unasked_drafts_are_stored() -> None:
    drafts = [draft("A."), draft("B."), draft("C.")]
    plan = plan_judgment(drafts, [[cand("mem-a", "a")], [], [cand("mem-c", "c")]])
    got = parse_judgment({"decisions": [{"new": 1, "action": "drop"}]}, plan, 3)
    assert got[0].action is Action.drop
    assert got[1].action is Action.store and got[1].decided_by == "rule"
    assert got[2].action is Action.store and got[2].notes == ("no_decision",)
    # a positional list without "new" numbers is read in order
    got = parse_judgment([{"action": "drop"}, {"action": "merge", "target": 2}], plan, 3)
    assert got[0].action is Action.drop and got[2].action is Action.merge


@pytest.mark.parametrize("value", [{"answer": []}, "store", None, {"decisions": "all"}])
def test_a_judgment_without_decisions_is_a_format_error(value: Any) -> None:
    plan = plan_judgment([draft("A.")], [[cand("mem-a", "a")]])
    with pytest.raises(JudgmentFormatError):
        parse_judgment(value, plan, 1)
