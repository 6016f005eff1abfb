"""Which turns plainly state a fact (the check on a model's "nothing to remember")."""

from __future__ import annotations

from datetime import datetime, timezone

from memstream.domain.events import MessageObserved, Scope
from memstream.domain.extraction import build_window
from memstream.domain.extraction.stateable import declared_empty_with_facts, stateable_turns

SCOPE = Scope(team_id="t", user_id="u", agent_id="a")
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def window(*texts: str):  # type: ignore[no-untyped-def]
    turns = [
        MessageObserved(scope=SCOPE, session_id="s", message_id=f"m{i}", role="user", content=text, occurred_at=T0)
        for i, text in enumerate(texts)
    ]
    return build_window(SCOPE, "s", turns, (), max_background=0)


def test_first_person_statements_state_facts_and_questions_and_small_talk_do_not() -> None:
    w = window(
        "I moved to Porto last month.",
        "My sister Ana is a nurse in Leeds.",
        "Do you think I should move?",
        "hello there, how are you?",
        "I see.",
        "Thanks! We're adopting a cat next week",
        "The weather is nice.",
    )
    assert stateable_turns(w) == ("m0", "m1", "m5")


def test_the_flag_names_the_turns_or_is_none() -> None:
    flagged = declared_empty_with_facts(window("ok", "I work as a baker in Lima."))
    assert flagged is not None and flagged.kind == "declared_empty_with_facts" and "m1" in flagged.detail
    assert declared_empty_with_facts(window("ok", "what time is it?")) is None
