"""The pure half of the extractor: from turns to memory drafts to events.

One module per step (the I/O lives in :mod:`memstream.services.extraction.extractor`):
:mod:`.window` gates and numbers the turns; :mod:`.parsing` reads the model's answer
into drafts (:mod:`.times` for the times it wrote); :mod:`.dedup` derives ids and drops
exact repeats; :mod:`.judgment` asks what to do with each draft against recalled
memories; :mod:`.building` turns the decisions into ADD-only events; :mod:`.heuristic`
is the no-LLM path. The names are re-exported here for the callers that import the
package as a whole.
"""

from memstream.domain.extraction.building import BuiltEvents, StageReport, build_events, record_items
from memstream.domain.extraction.dedup import content_memory_id, dedupe_batch, link_id_for, memory_id_for, memory_id_key, split_known
from memstream.domain.extraction.drafts import (
    DEFAULT_PRIORITY,
    MAX_ENTITIES,
    DraftIssue,
    ExtractionParse,
    MemoryDraft,
    clean_text,
)
from memstream.domain.extraction.heuristic import heuristic_drafts, heuristic_entities
from memstream.domain.extraction.judgment import (
    JUDGE_LINK_RELATIONS,
    JUDGMENT_SCHEMA,
    Action,
    Candidate,
    Decision,
    JudgmentFormatError,
    JudgmentPlan,
    parse_judgment,
    plan_judgment,
    render_judgment,
    store_all,
)
from memstream.domain.extraction.parsing import MAX_MEMORIES, EmptyExtraction, ExtractionFormatError, parse_extraction
from memstream.domain.extraction.schema import (
    EXTRACTION_PROMPTS,
    EXTRACTION_SCHEMA,
    compact_extraction_schema,
    extraction_schema,
)
from memstream.domain.extraction.times import resolve_time
from memstream.domain.extraction.window import MAX_TURN_CHARS_IN_PROMPT, Window, WindowTurn, build_window, render_turns

__all__ = [
    "MAX_TURN_CHARS_IN_PROMPT",
    "MAX_ENTITIES",
    "MAX_MEMORIES",
    "DEFAULT_PRIORITY",
    "EXTRACTION_PROMPTS",
    "EXTRACTION_SCHEMA",
    "compact_extraction_schema",
    "extraction_schema",
    "JUDGMENT_SCHEMA",
    "JUDGE_LINK_RELATIONS",
    "WindowTurn",
    "Window",
    "build_window",
    "render_turns",
    "MemoryDraft",
    "DraftIssue",
    "ExtractionParse",
    "ExtractionFormatError",
    "EmptyExtraction",
    "parse_extraction",
    "resolve_time",
    "memory_id_for",
    "content_memory_id",
    "memory_id_key",
    "link_id_for",
    "dedupe_batch",
    "split_known",
    "Candidate",
    "JudgmentPlan",
    "plan_judgment",
    "render_judgment",
    "Action",
    "Decision",
    "JudgmentFormatError",
    "parse_judgment",
    "store_all",
    "StageReport",
    "build_events",
    "heuristic_drafts",
    "heuristic_entities",
    "record_items",
    "clean_text",
    "BuiltEvents",
]
