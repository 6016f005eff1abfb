"""The extractor's structured model calls: one call whose JSON answer is repaired and
read, the batched judgment of new memories against their candidates, and the
provenance each call leaves in the events."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from memstream.domain.events import Scope
from memstream.domain.extraction import (
    JUDGMENT_SCHEMA,
    Candidate,
    Decision,
    EmptyExtraction,
    ExtractionParse,
    MemoryDraft,
    StageReport,
    Window,
    parse_judgment,
    plan_judgment,
    render_judgment,
    store_all,
)
from memstream.domain.prompts import Prompt, PromptError, PromptLibrary
from memstream.domain.repair import Repaired, repair_json
from memstream.llm import ChatModel, LLMCall, LLMError, call_with_retry
from memstream.metrics import record_extraction_repairs

__all__ = ["ask", "counted", "judge", "llm_stage", "with_note"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


async def ask(
    llm: ChatModel,
    system: str,
    user: str,
    schema: Mapping[str, Any],
    schema_name: str,
    interpret: Callable[[Any], _T],
    *,
    retries: int,
) -> LLMCall[tuple[Repaired, _T]]:
    """One structured LLM call (extraction or judgment): the answer's JSON repaired,
    then read by ``interpret``; retried ``retries`` times (raises
    :class:`LLMError` when every attempt failed)."""

    def parse(text: str) -> tuple[Repaired, _T]:
        repaired = repair_json(text)
        return repaired, interpret(repaired.value)

    return await call_with_retry(
        llm,
        system,
        user,
        parse=parse,
        schema=schema,
        schema_name=schema_name,
        retries=retries,
    )


async def judge(
    llm: ChatModel,
    prompts: PromptLibrary,
    scope: Scope,
    drafts: Sequence[MemoryDraft],
    candidates: Sequence[Sequence[Candidate]],
    budget_s: float | None = None,
    *,
    retries: int,
) -> tuple[dict[int, Decision], StageReport | None, int]:
    """One batched judgment, cut short when ``budget_s`` runs out; every failure
    path stores all drafts."""
    plan = plan_judgment(drafts, candidates)
    if plan.empty:
        return store_all(len(drafts), "no similar memories to judge against"), None, 0
    try:
        prompt = prompts.get("judgment", scope)
        system, user = prompt.render({"items": render_judgment(plan, drafts)})
    except PromptError as exc:
        reason = f"judgment prompt unusable ({exc}): stored all"
        return store_all(len(drafts), reason, candidates=candidates), StageReport(
            "llm", status="failed", note=reason
        ), 0

    try:
        async with asyncio.timeout(budget_s):
            call = await ask(
                llm,
                system,
                user,
                JUDGMENT_SCHEMA,
                "memstream_judgment",
                lambda value: parse_judgment(value, plan, len(drafts)),
                retries=retries,
            )
    except TimeoutError:
        reason = "judgment cut short by the retry budget: stored all"
        return store_all(len(drafts), reason, candidates=candidates), StageReport(
            "llm", status="failed", **prompt.ref(), model=llm.model, note=reason
        ), 1
    except LLMError as exc:
        reason = f"judgment failed ({exc.kind} after {exc.attempts} attempt(s)): stored all"
        log.warning("%s: %s", reason, " | ".join(exc.errors))
        stage = StageReport(
            "llm",
            status="failed",
            **prompt.ref(),
            model=llm.model,
            latency_ms=exc.latency_ms,
            token_usage=dict(exc.usage),
            note=reason + ": " + " | ".join(exc.errors),
        )
        return store_all(len(drafts), reason, candidates=candidates), stage, exc.attempts
    repaired, decisions = call.value
    return decisions, llm_stage(prompt, call, repaired), call.attempts


def counted(
    parse: Callable[..., ExtractionParse], value: Any, window: Window, max_memories: int
) -> ExtractionParse:
    """``parse`` with the answer's weak-output repairs counted in the metrics, whether
    memories are left or not (:class:`EmptyExtraction` carries its counts)."""
    try:
        parsed = parse(value, window, max_memories=max_memories)
    except EmptyExtraction as exc:
        _record_repairs(exc.parse)
        raise
    _record_repairs(parsed)
    return parsed


def _record_repairs(parsed: ExtractionParse) -> None:
    record_extraction_repairs(
        type_repairs=parsed.type_repairs,
        invented_ids_dropped=parsed.invented_ids_dropped,
        hallucination_suspects=parsed.hallucination_suspects,
    )


def llm_stage(prompt: Prompt, call: LLMCall[Any], repaired: Repaired) -> StageReport:
    """The provenance of one successful LLM stage (extraction or judgment): prompt,
    model, latency, usage, and a note on what had to be repaired or retried."""
    notes = []
    if repaired.repairs:
        notes.append("json repaired: " + ", ".join(repaired.repairs))
    if call.errors:
        notes.append("retried after: " + " | ".join(call.errors))
    return StageReport(
        "llm",
        status="repaired" if repaired.repairs else "ok",
        **prompt.ref(),
        model=call.result.model,
        latency_ms=call.latency_ms,
        token_usage=dict(call.usage),
        note="; ".join(notes) or None,
    )


def with_note(stage: StageReport, note: str) -> StageReport:
    joined = f"{stage.note}; {note}" if stage.note else note
    return replace(stage, note=joined)
