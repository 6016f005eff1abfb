"""How a settled decision becomes a ``MemoryReflected``: written by the LLM when one is
configured, else from a template (also the fallback when the LLM's answer is unusable)."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from memstream.domain.events import MemoryReflected, Provenance, build_event
from memstream.domain.prompts import PromptLibrary
from memstream.domain.reflection import (
    REFLECTION_ANSWER_SCHEMA,
    direction_correct,
    parse_reflection_answer,
    performance,
    reflection_event_id,
    reflection_id_for,
    reflection_prompt_fields,
    templated_reflection,
)
from memstream.llm import ChatModel, LLMError, build_llm, call_with_retry
from memstream.services.reflection.reflector import PRODUCER, SettledDecision
from memstream.settings import Settings

__all__ = [
    "LLMReflectionWriter",
    "REFLECTION_PROMPT_ID",
    "ReflectionWriter",
    "TEMPLATE_PROMPT_ID",
    "TEMPLATE_VERSION",
    "TemplateReflectionWriter",
    "build_reflection",
    "build_reflection_writer",
]


REFLECTION_PROMPT_ID = "reflection"
"""The prompt file (``domain/prompts/reflection.toml``, overridable per team/agent)."""

TEMPLATE_PROMPT_ID = "reflection-template"

TEMPLATE_VERSION = "1"

_PROMPT_DECISION_CHARS = 4000


def build_reflection(
    settled: SettledDecision,
    *,
    content: str,
    lesson: str | None,
    templated: bool,
    provenance: Provenance,
    now: datetime,
) -> MemoryReflected:
    """The ``MemoryReflected`` of a settled decision, with its derived ids, the numbers
    it was judged on, and whether the direction was right (computed, not asked)."""
    decision, outcome = settled.decision, settled.outcome
    measure, basis = performance(outcome)
    alpha = measure if basis == "alpha" else None
    return build_event(
        MemoryReflected,
        event_id=reflection_event_id(decision.scope, decision.decision_id),
        occurred_at=now,
        recorded_at=now,
        scope=decision.scope,
        session_id=decision.session_id,
        task_id=decision.task_id,
        causation_id=str(outcome.event_id),
        correlation_id=decision.decision_id,
        producer=PRODUCER,
        reflection_id=reflection_id_for(decision.scope, decision.decision_id),
        decision_id=decision.decision_id,
        outcome_id=outcome.outcome_id,
        subject=decision.subject,
        rating=decision.rating,
        decision_text=decision.decision_text,
        raw_return=outcome.raw_return,
        alpha=alpha,
        correct=direction_correct(decision.rating, alpha, outcome.raw_return),
        content=content,
        lesson=lesson,
        templated=templated,
        provenance=provenance,
    )


def _input_refs(settled: SettledDecision) -> tuple[str, ...]:
    return (f"decision:{settled.decision.decision_id}", f"outcome:{settled.outcome.outcome_id}")


class ReflectionWriter(Protocol):
    """Writes the reflection of one settled decision; raises to ask for a retry."""

    method: str

    async def write(self, settled: SettledDecision, now: datetime) -> MemoryReflected: ...


class TemplateReflectionWriter:
    """Reflections from the numbers alone, for deployments without an LLM (and for a
    model whose answers are unusable); every one is marked ``templated`` with
    provenance method ``template``, ``note`` saying why."""

    method = "template"

    def __init__(self, note: str = "no LLM configured: reflection written from the numbers") -> None:
        self.note = note

    async def write(self, settled: SettledDecision, now: datetime) -> MemoryReflected:
        written = templated_reflection(settled.decision, settled.outcome)
        return build_reflection(
            settled,
            content=written.content,
            lesson=written.lesson,
            templated=True,
            provenance=Provenance(
                method="template",
                prompt_id=TEMPLATE_PROMPT_ID,
                prompt_version=TEMPLATE_VERSION,
                input_refs=_input_refs(settled),
                note=self.note[:2000],
            ),
            now=now,
        )


class LLMReflectionWriter:
    """One LLM call per settled decision (2-4 sentences ending with a lesson, as JSON).

    The prompt is resolved per decision scope through the :class:`PromptLibrary` (a
    team or agent may override it); its id, version and file hash, the model, latency
    and token usage go into the reflection's provenance. A model that cannot be reached
    (timeout, connection error, 429, 5xx) raises, and the :class:`ReflectionRunner`
    retries the decision later; within one attempt :func:`memstream.llm.client.call_with_retry`
    already retries ``retries`` times. A model that answers but never usably (empty,
    refused, not 2-4 sentences of reflection, after those retries) gets the templated
    reflection instead, its provenance note naming the model and the errors: asking
    the same model again would give the same answer, and the lesson would never be
    written.
    """

    method = "llm"

    def __init__(
        self, chat: ChatModel, *, prompts: PromptLibrary | None = None, retries: int = 1
    ) -> None:
        self.chat = chat
        self.prompts = prompts or PromptLibrary()
        self.retries = retries

    async def write(self, settled: SettledDecision, now: datetime) -> MemoryReflected:
        fields = reflection_prompt_fields(settled.decision, settled.outcome)
        fields["decision_text"] = fields["decision_text"][:_PROMPT_DECISION_CHARS]
        prompt = self.prompts.get(REFLECTION_PROMPT_ID, settled.decision.scope)
        system, user = prompt.render(fields)
        try:
            call = await call_with_retry(
                self.chat,
                system,
                user,
                parse=parse_reflection_answer,
                schema=REFLECTION_ANSWER_SCHEMA,
                schema_name="reflection",
                retries=self.retries,
            )
        except LLMError as exc:
            if exc.kind in _UNREACHABLE:
                raise
            note = (
                f"{self.chat.model} gave no usable reflection ({exc.kind} after {exc.attempts} attempt(s): "
                + " | ".join(exc.errors) + "): reflection written from the numbers"
            )
            return await TemplateReflectionWriter(note).write(settled, now)
        parsed = call.value
        return build_reflection(
            settled,
            content=parsed.content,
            lesson=parsed.lesson,
            templated=False,
            provenance=Provenance(
                method="llm",
                prompt_id=prompt.id,
                prompt_version=prompt.version,
                prompt_sha256=prompt.sha256,
                model=call.result.model or self.chat.model,
                input_refs=_input_refs(settled),
                latency_ms=round(call.latency_ms, 3),
                token_usage=dict(call.usage),
                note=f"{call.attempts} attempts" if call.attempts > 1 else None,
            ),
            now=now,
        )


_UNREACHABLE = ("timeout", "connection", "http")
"""LLM failures that say nothing about the model's answers: retried later, never templated."""


def build_reflection_writer(settings: Settings) -> ReflectionWriter:
    """The LLM writer when an LLM endpoint is configured (``MEMSTREAM_EXTRACTION_LLM_BASE_URL``),
    else the templated one."""
    client = build_llm(settings)
    if client is None:
        return TemplateReflectionWriter()
    return LLMReflectionWriter(
        client, prompts=PromptLibrary(settings.extraction.prompts_dir), retries=settings.extraction.llm_max_retries
    )
