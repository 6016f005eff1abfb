"""Model answers read into reflections, and the prompt's fields."""

from __future__ import annotations

import pytest

from memstream.domain.reflection.answers import (
    ReflectionTextError,
    parse_reflection_answer,
    parse_reflection_text,
    reflection_prompt_fields,
)
from tests.domain.reflection.helpers import decision, outcome


def test_prompt_fields_are_formatted_text() -> None:
    fields = reflection_prompt_fields(decision(), outcome())
    assert fields["alpha"] == "+3.0%" and fields["raw_return"] == "+5.0%"
    assert fields["direction_verdict"] == "right"
    assert fields["decided_at"] == "2024-03-04"
    assert all(isinstance(v, str) for v in fields.values())

def test_parse_reflection_answer_reads_repaired_json() -> None:
    answer = (
        '```json\n{"reflection": "The buy was right with an alpha of +3.0%. The services thesis held.",'
        ' "lesson": "Lesson: weigh recurring revenue highly.",}\n```'
    )
    parsed = parse_reflection_answer(answer)
    assert parsed.content.endswith("Lesson: weigh recurring revenue highly.")
    assert parsed.lesson == "weigh recurring revenue highly."
    assert parsed.sentences == 3


def test_parse_reflection_answer_accepts_plain_prose() -> None:
    parsed = parse_reflection_answer("The call was right. Lesson: keep it simple.")
    assert parsed.lesson == "keep it simple."


@pytest.mark.parametrize(
    "answer",
    ["", "Sorry, I cannot help with that.", '{"verdict": "right"}', "[1, 2]", '{"reflection": ""}'],
)
def test_parse_reflection_answer_rejects_unusable_answers(answer: str) -> None:
    with pytest.raises(ReflectionTextError):
        parse_reflection_answer(answer)


def test_parse_reflection_text_cleans_markup_and_keeps_four_sentences() -> None:
    text = "- One.\n- Two.\n**Three.** Four. Five. Lesson: six."
    parsed = parse_reflection_text(text)
    assert parsed.sentences == 4
    assert parsed.content == "One. Two. Three. Lesson: six."
    assert parsed.lesson == "six."
