"""What weak models write inside well-formed JSON, handled by rule: the memory type
repair, the grounding check, and an answer that leaves no memory (the answers here are
the ones SmolLM2-135M gave, and variations)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from memstream.domain.events import MemoryType, MessageObserved, Scope
from memstream.domain.extraction.parsing import EmptyExtraction, parse_extraction
from memstream.domain.extraction.window import build_window
from memstream.domain.repair import UnusableAnswer
from memstream.domain.weak_output import content_words, repair_type, shares_content_word

SCOPE = Scope(team_id="acme", user_id="alice", agent_id="bot")
T0 = datetime(2024, 5, 8, 15, 30, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("raw", "expected", "rule"),
    [
        ("persona", MemoryType.persona, None),
        ("Work-Fact", MemoryType.work_fact, None),
        ("preference", MemoryType.persona, None),  # a legacy name is not a repair
        ("persona|episodic|instruction|work_fact", MemoryType.persona, "listed"),
        ("episodic or persona", MemoryType.episodic, "listed"),
        ("type: work_task", MemoryType.work_task, "listed"),
        ("personal preference", MemoryType.persona, "word"),
        ("travel event", MemoryType.episodic, "word"),
        ("coding rule", MemoryType.instruction, "word"),
        ("shared document", MemoryType.work_artifact, "word"),
        ("deployment procedure", MemoryType.work_method, "word"),
        ("epsiodic", MemoryType.episodic, "spelling"),
        ("work_artefact", MemoryType.work_artifact, "spelling"),
        ("instrucion", MemoryType.instruction, "spelling"),
        ("zebra", MemoryType.episodic, "default"),
        (None, MemoryType.episodic, "missing"),
        ("  ", MemoryType.episodic, "missing"),
        (7, MemoryType.episodic, "not_text"),
    ],
)
def test_a_type_maps_to_the_closest_of_the_seven_by_rule(raw: Any, expected: MemoryType, rule: str | None) -> None:
    repaired = repair_type(raw)
    assert repaired.memory_type is expected
    assert repaired.rule == rule
    assert repaired.repaired is (rule is not None)


def test_content_words_leave_out_function_words_and_match_inflections() -> None:
    assert content_words("The user said that she loves it") == {"lov"}
    assert content_words("loving") == content_words("loved") == content_words("loves")
    assert shares_content_word("Alice is enjoying Lisbon.", ["I enjoyed my week in Lisbon"], ["alice"])
    assert not shares_content_word("Alice: I'm still enjoying the local cuisine", ["I flew to Lisbon"], ["alice"])
    # the speaker's name alone proves nothing; the same name in the turn's text does
    assert not shares_content_word("Alice is happy.", ["I got a new bike"], ["Alice"])
    assert shares_content_word("Bob has a bike.", ["Bob gave me his bike"], ["Alice"])
    assert not shares_content_word("It is.", ["anything at all"])


def turn(mid: str, content: str, speaker: str = "alice") -> MessageObserved:
    return MessageObserved(
        scope=SCOPE,
        session_id="s1",
        message_id=mid,
        role="user",
        speaker=speaker,
        content=content,
        occurred_at=T0,
    )


WINDOW = build_window(
    SCOPE,
    "s1",
    [
        turn("m1", "I just got back from a week in Lisbon with my sister"),
        turn("m2", "We visited the old tram lines and the castle", speaker="alice"),
        turn("m3", "My sister Carla lives in Porto now"),
        turn("m4", "Next month I start a new job at a bakery"),
    ],
)


def memory(content: str, sources: list[Any], type_: Any = "episodic") -> dict[str, Any]:
    return {"content": content, "type": type_, "priority": 50, "source_ids": sources,
            "timestamp": None, "timestamp_start": None, "timestamp_end": None, "entities": []}


def test_the_weak_answer_of_issue_24_is_repaired_by_rule() -> None:
    answer = {"scenes": [{"title": "Trip", "message_ids": ["t1"], "memories": [
        memory("Alice spent a week in Lisbon with her sister.", ["alice"], "persona|episodic|instruction|work_fact"),
        memory("I'm still enjoying the local cuisine", ["t2"]),
        memory("Carla lives in Porto.", ["t3", "t99"], "fact"),
    ]}]}
    parsed = parse_extraction(answer, WINDOW, max_memories=10)
    lisbon, porto = parsed.drafts
    # "alice" is a speaker, not a turn id: dropped; the scene's turn is the evidence
    assert lisbon.source_message_ids == ("m1",)
    assert lisbon.memory_type is MemoryType.persona
    assert "type_repaired:listed:persona|episodic|instruction|work_fact->persona" in lisbon.notes
    assert "dropped_source_ids:alice" in lisbon.notes and "sources_from_scene" in lisbon.notes
    assert porto.source_message_ids == ("m3",) and porto.memory_type is MemoryType.work_fact
    suspects = [i for i in parsed.issues if i.kind == "hallucination_suspect"]
    assert [i.content for i in suspects] == ["I'm still enjoying the local cuisine"]
    assert "t2" in suspects[0].detail
    assert (parsed.type_repairs, parsed.invented_ids_dropped, parsed.hallucination_suspects) == (2, 2, 1)
    assert not parsed.nothing_to_remember


def test_a_memory_without_any_valid_source_keeps_the_windows_turns_flagged() -> None:
    answer = {"memories": [memory("Alice starts a job at a bakery next month.", ["alice", "bakery"])]}
    (draft,) = parse_extraction(answer, WINDOW, max_memories=10).drafts
    assert draft.source_message_ids == ("m1", "m2", "m3", "m4")
    assert "sources_from_window" in draft.notes


@pytest.mark.parametrize("answer", [{"scenes": []}, {"memories": []}, []])
def test_nothing_to_remember_only_when_the_model_says_so(answer: Any) -> None:
    parsed = parse_extraction(answer, WINDOW, max_memories=10)
    assert parsed.drafts == () and parsed.nothing_to_remember


@pytest.mark.parametrize(
    "answer",
    [
        {"scenes": [{"title": "x", "message_ids": ["t1"], "memories": []}]},
        {"scenes": [{"title": "x", "message_ids": ["t1"], "memories": [memory("Bananas are yellow.", ["t1"])]}]},
        {"memories": [{"content": "", "source_ids": ["t1"]}]},
        {"scenes": [{"title": "x", "memories": [42, None]}]},
    ],
)
def test_an_answer_with_no_memory_left_is_an_unusable_answer(answer: Any) -> None:
    with pytest.raises(EmptyExtraction) as raised:
        parse_extraction(answer, WINDOW, max_memories=10)
    assert isinstance(raised.value, UnusableAnswer)
