"""The extraction schemas: the compact one is what the parser reads, and each prompt
variant gets its own."""

from __future__ import annotations

import jsonschema

from memstream.domain.extraction.parsing import parse_extraction
from memstream.domain.extraction.schema import (
    EXTRACTION_PROMPTS,
    EXTRACTION_SCHEMA,
    compact_extraction_schema,
    extraction_schema,
)
from memstream.domain.prompts import packaged_prompt
from tests.domain.extraction.helpers import window


def test_a_compact_answer_validates_and_becomes_drafts_with_their_sources() -> None:
    w = window("I moved to Porto last month.", "My sister Rita is a nurse.")
    answer = {"memories": [
        {"content": "Ana moved to Porto last month.", "type": "episodic", "source_ids": ["t1"]},
        {"content": "Ana's sister Rita is a nurse.", "type": "persona", "source_ids": ["t2"]},
    ]}
    jsonschema.validate(answer, compact_extraction_schema(4))
    parsed = parse_extraction(answer, w, max_memories=4)
    assert [d.source_message_ids for d in parsed.drafts] == [("m0",), ("m1",)]


def test_the_compact_schema_bounds_the_memories_and_allows_no_other_field() -> None:
    schema = compact_extraction_schema(1)
    two = {"content": "x", "type": "persona", "source_ids": []}
    for bad in ({"memories": [two, two]}, {"memories": [{**two, "priority": 5}]}, {"scenes": []}):
        try:
            jsonschema.validate(bad, schema)
        except jsonschema.ValidationError:
            continue
        raise AssertionError(f"accepted {bad}")


def test_each_prompt_variant_names_a_packaged_prompt_and_its_schema() -> None:
    assert extraction_schema("full", 3) is EXTRACTION_SCHEMA
    assert extraction_schema("compact", 3) == compact_extraction_schema(3)
    for prompt_id in EXTRACTION_PROMPTS.values():
        assert packaged_prompt(prompt_id).variables == packaged_prompt("extraction").variables
