"""Reflection rules: when a decision is settled or expired, whether it was right, what a
reflection says without an LLM, and which past lessons go into a new prompt.

The pure half of deferred reflection: the reflector (:mod:`memstream.services.reflection.reflector`)
keeps state and talks to Kafka and the LLM, and every decision it makes is a function
here, testable without a broker, a clock or a network (functions that need "now" take
it as an argument). One module per job: :mod:`.ratings`, :mod:`.identity`,
:mod:`.outcomes`, :mod:`.templated`, :mod:`.answers`, :mod:`.context`; the names are
re-exported here for the callers that import the package as a whole.
"""

from memstream.domain.reflection.answers import (
    REFLECTION_ANSWER_SCHEMA,
    ParsedReflection,
    ReflectionTextError,
    parse_reflection_answer,
    parse_reflection_text,
    reflection_prompt_fields,
)
from memstream.domain.reflection.context import (
    DECISION_SNIPPET_CHARS,
    OTHER_SUBJECT_LIMIT,
    SAME_SUBJECT_LIMIT,
    ReflectionContext,
    ReflectionRecord,
    build_context,
    estimate_tokens,
    format_context,
    select_context,
)
from memstream.domain.reflection.identity import (
    decision_key,
    expiry_event_id,
    provider_outcome_event_id,
    provider_outcome_id,
    reflection_event_id,
    reflection_id_for,
    subject_key,
)
from memstream.domain.reflection.outcomes import (
    HOLD_BAND,
    SUBJECT_WINDOW_SLACK_DAYS,
    OutcomeMatch,
    covers_horizon,
    direction_correct,
    match_outcome,
    performance,
)
from memstream.domain.reflection.ratings import RatingParseError, parse_rating, rating_direction
from memstream.domain.reflection.templated import TemplatedReflection, templated_reflection

__all__ = [
    "HOLD_BAND",
    "SUBJECT_WINDOW_SLACK_DAYS",
    "SAME_SUBJECT_LIMIT",
    "OTHER_SUBJECT_LIMIT",
    "DECISION_SNIPPET_CHARS",
    "RatingParseError",
    "parse_rating",
    "rating_direction",
    "decision_key",
    "subject_key",
    "reflection_id_for",
    "reflection_event_id",
    "expiry_event_id",
    "provider_outcome_id",
    "provider_outcome_event_id",
    "OutcomeMatch",
    "covers_horizon",
    "match_outcome",
    "performance",
    "direction_correct",
    "TemplatedReflection",
    "templated_reflection",
    "ParsedReflection",
    "ReflectionTextError",
    "parse_reflection_text",
    "REFLECTION_ANSWER_SCHEMA",
    "parse_reflection_answer",
    "reflection_prompt_fields",
    "ReflectionRecord",
    "ReflectionContext",
    "estimate_tokens",
    "select_context",
    "format_context",
    "build_context",
]
