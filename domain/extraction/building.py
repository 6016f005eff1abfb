"""From decided drafts to ADD-only events.

``store`` -> ``MemoryAdded``; ``update`` -> ``MemoryAdded`` + ``MemoryLinked(supersedes)``;
``merge`` -> ``MemoryLinked(duplicates)`` to the canonical memory; ``drop`` -> nothing,
the decision kept in the provenance of the batch's other events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import TypeAdapter

from memstream.domain.events import (
    build_event,
    EmbeddingPayload,
    EventBase,
    JsonObject,
    LinkRelation,
    MemoryAdded,
    MemoryLinked,
    Provenance,
    Scope,
)
from memstream.domain.extraction.dedup import link_id_for, memory_id_for
from memstream.domain.extraction.drafts import DraftIssue, MemoryDraft
from memstream.domain.extraction.judgment import Action, Decision
from memstream.domain.extraction.window import Window

__all__ = ["StageReport", "BuiltEvents", "build_events", "record_items"]

_JSON_OBJECT: TypeAdapter[dict[str, Any]] = TypeAdapter(JsonObject)
_PRODUCER = "memstream-extractor"


@dataclass(frozen=True)
class StageReport:
    """Provenance of one stage (the extraction call, the judgment call, or a rule)."""

    method: Literal["llm", "heuristic", "rule"]
    status: str = "ok"
    prompt_id: str | None = None
    prompt_version: str | None = None
    prompt_sha256: str | None = None
    model: str | None = None
    latency_ms: float | None = None
    token_usage: Mapping[str, int] = field(default_factory=dict)
    note: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "status": self.status}
        for name in ("prompt_id", "prompt_version", "prompt_sha256", "model", "latency_ms", "note"):
            value = getattr(self, name)
            if value is not None:
                out[name] = round(value, 3) if isinstance(value, float) else value
        if self.token_usage:
            out["token_usage"] = dict(self.token_usage)
        return out


def _provenance(
    stage: StageReport,
    *,
    input_refs: Sequence[str],
    output_refs: Sequence[str],
    decisions: Sequence[dict[str, Any]],
    status: str,
    note: str | None,
) -> Provenance:
    return Provenance(
        method=stage.method,
        prompt_id=stage.prompt_id,
        prompt_version=stage.prompt_version,
        prompt_sha256=stage.prompt_sha256,
        model=stage.model,
        input_refs=tuple(input_refs),
        output_refs=tuple(output_refs),
        latency_ms=stage.latency_ms,
        token_usage=dict(stage.token_usage),
        status=status,
        decisions=tuple(decisions),
        note=note,
    )


@dataclass(frozen=True)
class BuiltEvents:
    """The events of one run and the drafts that could not become events (each with
    the reason), so one malformed memory never sinks the others."""

    events: tuple[EventBase, ...]
    rejected: tuple[dict[str, Any], ...] = ()


def build_events(
    *,
    scope: Scope,
    session_id: str | None,
    drafts: Sequence[MemoryDraft],
    decisions: Mapping[int, Decision],
    embeddings: Sequence[EmbeddingPayload | None],
    extraction: StageReport,
    judgment: StageReport | None,
    input_refs: Sequence[str],
    batch_record: Sequence[dict[str, Any]],
    recorded_at: datetime,
    id_key: bytes,
    correlation_id: str | None = None,
    own_refs: bool = False,
) -> BuiltEvents:
    """The ADD-only events for one run, in a stable order (each memory, then its links);
    memory ids are keyed by ``id_key`` (:func:`memory_id_for`).

    ``batch_record`` (exact duplicates, gate rejections, parser issues) and every
    ``drop`` decision are written into the provenance of each event, so a decision
    that emitted nothing is still on the record wherever the batch left a trace.

    ``embeddings`` are attached as they are, not validated a second time (a payload's
    check decodes its whole vector): they must be valid ``EmbeddingPayload`` values.

    A memory's provenance names the run's inputs and outputs (what the model read and
    wrote). With ``own_refs`` (the heuristic, which makes each memory from its own
    turns alone) it names the memory's own turns and itself instead: the run's lists
    on every event grow with the square of the window, and the heuristic's windows
    are whole sessions; the run stays one ``correlation_id``.
    """
    if len(embeddings) != len(drafts):
        raise ValueError("one embedding slot per draft is required")
    ids = [memory_id_for(scope, d.content_hash, id_key) for d in drafts]
    envelope: dict[str, Any] = {
        "scope": scope,
        "session_id": session_id,
        "correlation_id": correlation_id,
        "producer": _PRODUCER,
        "recorded_at": recorded_at,
    }
    decided = [decisions.get(i) or Decision(i, Action.store) for i in range(len(drafts))]
    checked, rejected = _checked_memories(envelope, ids, drafts, decided)
    valid = {i for i in range(len(drafts)) if i in checked or decided[i].action not in _MAKES_MEMORY}
    added = [ids[i] for i in sorted(valid) if decided[i].action in _MAKES_MEMORY]
    shared_record = _shared_record(batch_record, rejected, ids, drafts, decided, valid)
    provenances = _Provenances(extraction, judgment, input_refs, added, shared_record)

    events: list[EventBase] = []
    for i, draft in enumerate(drafts):
        decision = decided[i]
        if i not in valid or decision.action is Action.drop:
            continue
        by_llm = judgment is not None and decision.decided_by == "llm"
        mine = provenances.own_decision(ids[i], draft, decision)
        if decision.action is Action.merge:
            if decision.target and decision.target != ids[i]:
                links = [(decision.target, LinkRelation.duplicates)]
                reason = decision.reason or "same statement as an existing memory"
                provenance = provenances.for_link(draft, by_llm, mine)
                events.extend(_link_events(envelope, ids[i], draft, decision, links, reason, provenance))
            continue
        refs = {"input_refs": tuple(draft.source_message_ids), "output_refs": (ids[i],)} if own_refs else {}
        update: dict[str, Any] = {"provenance": provenances.for_memory(mine, refs)}
        if embeddings[i] is not None:
            update["embedding"] = embeddings[i]
        # Validated already; the provenance and the payload are validated models too.
        events.append(checked[i].model_copy(update=update))
        targets = _link_targets(ids[i], decision)
        if targets:
            provenance = provenances.for_link(draft, by_llm, mine)
            events.extend(_link_events(envelope, ids[i], draft, decision, targets, decision.reason, provenance))
    return BuiltEvents(tuple(events), tuple(rejected))


def _link_targets(memory_id: str, decision: Decision) -> list[tuple[str, LinkRelation]]:
    """``supersedes`` for an update, then the judged links; distinct, never to itself."""
    relations: list[tuple[str, LinkRelation]] = []
    if decision.action is Action.update and decision.target:
        relations.append((decision.target, LinkRelation.supersedes))
    relations.extend(decision.links)
    return [(t, r) for t, r in dict.fromkeys(relations) if t != memory_id]


_MAKES_MEMORY = (Action.store, Action.update)


def _shared_record(
    batch_record: Sequence[dict[str, Any]],
    rejected: list[dict[str, Any]],
    ids: Sequence[str],
    drafts: Sequence[MemoryDraft],
    decided: Sequence[Decision],
    valid: set[int],
) -> list[dict[str, Any]]:
    """The batch's part of every provenance: its record, the rejected drafts, the drops."""
    dropped = [
        {"memory_id": ids[i], "content": drafts[i].content[:200], **decided[i].as_dict()}
        for i in sorted(valid)
        if decided[i].action is Action.drop
    ]
    return [dict(r) for r in batch_record] + rejected + dropped


def _checked_memories(
    envelope: Mapping[str, Any], ids: Sequence[str], drafts: Sequence[MemoryDraft], decided: Sequence[Decision]
) -> tuple[dict[int, MemoryAdded], list[dict[str, Any]]]:
    """The memory events that can exist at all (validated without provenance), and a
    record entry for each draft that cannot be one."""
    checked: dict[int, MemoryAdded] = {}
    rejected: list[dict[str, Any]] = []
    for i, draft in enumerate(drafts):
        if decided[i].action not in _MAKES_MEMORY:
            continue
        try:
            checked[i] = _memory_event(envelope, ids[i], draft, None, None)
        except ValueError as exc:
            reason = " ".join(str(exc).split())[:300]
            rejected.append({"issue": "invalid_memory", "detail": reason, "content": draft.content[:200]})
    return checked, rejected


class _Provenances:
    """The provenance of each event of a run: the batch's shared part validated once,
    each event's own decision put in front of a copy (validating the whole record per
    event would cost n² for n memories)."""

    def __init__(
        self,
        extraction: StageReport,
        judgment: StageReport | None,
        input_refs: Sequence[str],
        added: Sequence[str],
        shared_record: Sequence[dict[str, Any]],
    ) -> None:
        status_parts = [extraction.status] if extraction.status != "ok" else []
        if judgment is not None and judgment.status != "ok":
            status_parts.append(f"judgment_{judgment.status}")
        self._status = "+".join(status_parts) or "ok"
        note_parts = [n for n in (extraction.note, judgment.note if judgment else None) if n]
        self._note = "; ".join(note_parts)[:2000] or None
        self._judgment = judgment
        self._judge_info = judgment.as_dict() if judgment is not None else None
        self._added = added
        self._shared = shared_record
        self._memory_base = _provenance(
            extraction, input_refs=input_refs, output_refs=added, decisions=shared_record,
            status=self._status, note=self._note,
        )
        self._link_bases: dict[bool, Provenance] = {}

    def own_decision(self, memory_id: str, draft: MemoryDraft, decision: Decision) -> dict[str, Any]:
        mine: dict[str, Any] = {"memory_id": memory_id, "stage": "judgment", **decision.as_dict()}
        if self._judge_info is not None and decision.decided_by == "llm":
            mine["judgment"] = self._judge_info
        if draft.notes:
            mine["draft_notes"] = list(draft.notes)
        return mine

    def for_memory(self, own: dict[str, Any], refs: Mapping[str, Any]) -> Provenance:
        return _with_own(self._memory_base, own, **refs)

    def for_link(self, draft: MemoryDraft, by_llm: bool, own: dict[str, Any]) -> Provenance:
        """A link's provenance: the judge's (or the rule's), its input refs the draft's turns."""
        base = self._link_bases.get(by_llm)
        if base is None:
            stage = self._judgment if by_llm and self._judgment is not None else StageReport("rule")
            base = self._link_bases[by_llm] = _provenance(
                stage, input_refs=(), output_refs=self._added, decisions=self._shared,
                status=self._status, note=self._note,
            )
        return _with_own(base, own).model_copy(update={"input_refs": tuple(draft.source_message_ids)})


def _with_own(base: Provenance, own: dict[str, Any], **more: Any) -> Provenance:
    return base.model_copy(update={"decisions": (_JSON_OBJECT.validate_python(own), *base.decisions), **more})


def _link_events(
    envelope: Mapping[str, Any],
    memory_id: str,
    draft: MemoryDraft,
    decision: Decision,
    targets: Sequence[tuple[str, LinkRelation]],
    reason: str | None,
    provenance: Provenance,
) -> list[MemoryLinked]:
    return [
        build_event(
            MemoryLinked,
            **envelope,
            occurred_at=draft.occurred_at,
            link_id=link_id_for(memory_id, target, relation),
            from_memory_id=memory_id,
            to_memory_id=target,
            relation=relation,
            decided_by=decision.decided_by,
            reason=reason,
            provenance=provenance,
        )
        for target, relation in targets
    ]


def _memory_event(
    envelope: Mapping[str, Any],
    memory_id: str,
    draft: MemoryDraft,
    embedding: EmbeddingPayload | None,
    provenance: Provenance | None,
) -> MemoryAdded:
    return build_event(
        MemoryAdded,
        **envelope,
        occurred_at=draft.occurred_at,
        memory_id=memory_id,
        content=draft.content,
        memory_type=draft.memory_type,
        priority=draft.priority,
        scene=draft.scene,
        source_message_ids=draft.source_message_ids,
        timestamp=draft.timestamp,
        timestamp_start=draft.timestamp_start,
        timestamp_end=draft.timestamp_end,
        entities=draft.entities,
        embedding=embedding,
        provenance=provenance,
    )



def record_items(
    window: Window, issues: Iterable[DraftIssue], duplicates: Iterable[tuple[MemoryDraft, str]]
) -> list[dict[str, Any]]:
    """The batch record: gate rejections, parser issues and exact duplicates."""
    out: list[dict[str, Any]] = []
    for message_id, verdict in window.rejected:
        out.append({"gate": verdict.rule.value if verdict.rule else "passed", "message_id": message_id, "detail": verdict.reason})
    out.extend(issue.as_dict() for issue in issues)
    for draft, existing in duplicates:
        out.append({"action": "exact_duplicate", "memory_id": existing, "content": draft.content[:200]})
    return out
