"""Reading the model's extraction answer into drafts."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from memstream.domain.events import MAX_MEMORY_CHARS, EntityKind, MemoryType
from memstream.domain.extraction.parsing import EmptyExtraction, ExtractionFormatError, parse_extraction
from tests.domain.extraction.helpers import T0, answer, memory, window


def test_a_well_formed_answer_becomes_drafts() -> None:
    w = window("I love green tea", "I moved to Porto yesterday")
    parsed = parse_extraction(
        answer(
            memory("Ana loves green tea.", ["t1"], entities=[{"name": "green tea", "kind": "product"}]),
            memory(
                "Ana moved to Porto.",
                ["t2"],
                type="episodic",
                priority=80,
                timestamp="2024-05-07",
                entities=[{"name": "Porto", "kind": "place"}, {"name": "Ana", "kind": "person"}],
            ),
            ids=["t1", "t2"],
        ),
        w,
        max_memories=10,
    )
    assert parsed.issues == ()
    assert parsed.scenes == 1
    tea, porto = parsed.drafts
    assert tea.content == "Ana loves green tea."
    assert tea.memory_type is MemoryType.persona and tea.priority == 70
    assert tea.source_message_ids == ("m0",)
    assert tea.scene == "Food"
    assert tea.occurred_at == T0
    assert porto.memory_type is MemoryType.episodic and porto.priority == 80
    assert porto.timestamp == datetime(2024, 5, 7, tzinfo=timezone.utc)
    assert [(e.name, e.kind) for e in porto.entities] == [("Porto", EntityKind.place), ("Ana", EntityKind.person)]
    assert porto.notes == ()


def test_invented_source_ids_are_dropped_never_kept() -> None:
    w = window("I love green tea", "I hate rain")
    parsed = parse_extraction(
        answer(memory("Ana loves green tea.", ["t1", "t7", "msg-42"]), memory("Ana hates snow.", ["t9"])),
        w,
        max_memories=10,
    )
    tea, snow = parsed.drafts
    assert tea.source_message_ids == ("m0",)
    assert any(n.startswith("dropped_source_ids:t7,msg-42") for n in tea.notes)
    # no valid source left: the window's turns are its evidence, flagged
    assert snow.source_message_ids == ("m0", "m1")
    assert "sources_from_window" in snow.notes and "dropped_source_ids:t9" in snow.notes
    kinds = [i.kind for i in parsed.issues]
    assert kinds == ["invented_source_ids", "invented_source_ids"]
    assert parsed.invented_ids_dropped == 3


def test_sources_fall_back_to_the_scene_turns_when_none_are_cited() -> None:
    w = window("I love green tea")
    parsed = parse_extraction(answer(memory("Ana loves green tea.", []), ids=["t1"]), w, max_memories=10)
    assert parsed.drafts[0].source_message_ids == ("m0",)
    assert "sources_from_scene" in parsed.drafts[0].notes


def test_a_memory_citing_only_background_is_dropped() -> None:
    w = window("sounds good", background=("I love green tea",))
    with pytest.raises(EmptyExtraction) as raised:  # no memory left, and not "nothing to remember"
        parse_extraction(answer(memory("Ana loves green tea.", ["t1"])), w, max_memories=10)
    assert raised.value.parse.drafts == ()
    assert [i.kind for i in raised.value.parse.issues] == ["background_only"]


def test_background_may_support_a_memory_from_a_new_turn() -> None:
    w = window("yes, that one", background=("Do you want the blue car?",))
    parsed = parse_extraction(answer(memory("Ana wants the blue car.", ["t1", "t2"])), w, max_memories=10)
    assert parsed.drafts[0].source_message_ids == ("b0", "m0")


@pytest.mark.parametrize(
    ("raw", "expected", "fell_back"),
    [
        (80, 80, False),
        (79.6, 80, False),
        ("65", 65, False),
        ("90/100", 90, False),
        ("40%", 40, False),
        (250, 100, False),
        (-5, 0, False),
        ("high", 50, True),
        (True, 50, True),
        ([1], 50, True),
        ({"v": 1}, 50, True),
        (float("nan"), 50, True),
    ],
)
def test_one_bad_priority_falls_back_to_50(raw: Any, expected: int, fell_back: bool) -> None:
    w = window("I love green tea")
    (draft,) = parse_extraction(answer(memory("Ana loves tea.", ["t1"], priority=raw)), w, max_memories=10).drafts
    assert draft.priority == expected
    assert ("priority_fallback" in draft.notes) is fell_back


def test_wrong_types_degrade_per_field_and_never_sink_the_batch() -> None:
    w = window("I love green tea", "I work at Initech", "I was born in 1990")
    parsed = parse_extraction(
        answer(
            memory("Ana loves green tea.", ["t1"], type="preference"),  # legacy name
            memory("Ana works at Initech.", ["t2"], type="job-ish", timestamp="someday soon"),
            memory(1990, ["t3"], type=7, entities="Initech", timestamp_start=[1]),
            {"content": None, "source_ids": ["t1"]},
            "Ana is friendly.",
            42,
            memory("Ana was born in 1990.", "t3", timestamp=1990),
        ),
        w,
        max_memories=10,
    )
    by_content = {d.content: d for d in parsed.drafts}
    assert by_content["Ana loves green tea."].memory_type is MemoryType.persona
    job = by_content["Ana works at Initech."]
    assert job.memory_type is MemoryType.episodic
    assert "type_repaired:default:job-ish->episodic" in job.notes and "bad_timestamp" in job.notes
    numeric = by_content["1990"]
    assert [e.name for e in numeric.entities] == ["Initech"]
    assert "type_repaired:not_text:int->episodic" in numeric.notes and "bad_timestamp_start" in numeric.notes
    born = by_content["Ana was born in 1990."]
    assert born.source_message_ids == ("m2",)
    assert born.timestamp == datetime(1990, 1, 1, tzinfo=timezone.utc)
    # the string memory cites nothing, so the window's turns are its sources; it shares
    # no content word with them -> dropped as a hallucination suspect
    kinds = sorted(i.kind for i in parsed.issues)
    assert kinds == ["hallucination_suspect", "no_content", "not_an_object"]
    # repairs are counted as the model wrote them, dropped memories included
    assert parsed.type_repairs == 3 and parsed.hallucination_suspects == 1


def test_alternative_shapes_are_accepted() -> None:
    w = window("I love green tea")
    flat = parse_extraction({"memories": [memory("Ana loves tea.", ["t1"])]}, w, max_memories=10)
    bare = parse_extraction([memory("Ana loves tea.", ["t1"])], w, max_memories=10)
    single = parse_extraction(memory("Ana loves tea.", ["t1"]), w, max_memories=10)
    assert flat.drafts == bare.drafts == single.drafts
    assert len(flat.drafts) == 1
    nothing = parse_extraction({"scenes": []}, w, max_memories=10)
    assert nothing.drafts == () and nothing.nothing_to_remember
    assert [i.kind for i in nothing.issues] == ["nothing_to_remember"]


@pytest.mark.parametrize("value", [{"answer": "none"}, "text", 42, None])
def test_an_answer_without_any_usable_shape_is_a_format_error(value: Any) -> None:
    with pytest.raises(ExtractionFormatError):
        parse_extraction(value, window("I love green tea"), max_memories=10)


def test_at_most_max_memories() -> None:
    w = window("many facts")
    mems = [memory(f"Fact {i}.", ["t1"]) for i in range(5)]
    parsed = parse_extraction(answer(*mems), w, max_memories=3)
    assert [d.content for d in parsed.drafts] == ["Fact 0.", "Fact 1.", "Fact 2."]
    assert [i.kind for i in parsed.issues] == ["over_limit", "over_limit"]


def test_content_is_cleaned_and_bounded() -> None:
    w = window("I like tea, and here is my long note")
    long_text = "note " * (MAX_MEMORY_CHARS // 5 + 10)
    parsed = parse_extraction(
        answer(memory("  Ana\x00 likes\x07 tea \ud800 ", ["t1"]), memory(long_text, ["t1"])), w, max_memories=10
    )
    tea, long_draft = parsed.drafts
    assert tea.content == "Ana likes tea"
    assert len(long_draft.content) == MAX_MEMORY_CHARS and "content_cut" in long_draft.notes


def test_reversed_interval_is_swapped() -> None:
    w = window("I was in Rome on a trip")
    (d,) = parse_extraction(
        answer(memory("Ana was in Rome.", ["t1"], timestamp_start="2024-05-10", timestamp_end="2024-05-01")),
        w,
        max_memories=10,
    ).drafts
    assert d.timestamp_start < d.timestamp_end  # type: ignore[operator]
    assert "interval_reversed" in d.notes


def test_entities_are_deduplicated_and_kinds_normalised() -> None:
    w = window("I met Bo at Initech")
    (d,) = parse_extraction(
        answer(
            memory(
                "Ana met Bo at Initech.",
                ["t1"],
                entities=[
                    {"name": "Bo", "kind": "person"},
                    {"name": "bo", "kind": "person"},
                    {"name": "Initech", "kind": "organisation"},
                    {"name": "Lisbon", "kind": "city"},
                    {"name": "", "kind": "person"},
                    {"name": "a\x01b", "kind": "person"},
                    {"kind": "person"},
                    7,
                ],
            )
        ),
        w,
        max_memories=10,
    ).drafts
    assert [(e.name, e.kind.value) for e in d.entities] == [
        ("Bo", "person"),
        ("Initech", "organization"),
        ("Lisbon", "other"),
        ("ab", "person"),
    ]
