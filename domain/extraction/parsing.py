"""Reading the model's (repaired) extraction answer into memory drafts.

Each memory is validated on its own: a bad priority falls back to 50, an unknown type is
repaired (:func:`memstream.domain.weak_output.repair_type`), an unparsable time becomes
none. Cited ids that are not turns of the window are dropped; a memory left with no
source cites the scene's new turns, else the window's. A memory that shares no content
word with its sources is dropped as a ``hallucination_suspect``. One bad memory never
sinks the batch; but an answer with no memory left means "nothing to remember" only
when the model said so (``{"scenes": []}``): otherwise :class:`EmptyExtraction`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memstream.domain.events import MAX_MEMORY_CHARS, Entity
from memstream.domain.extraction.drafts import (
    DEFAULT_PRIORITY,
    MAX_ENTITIES,
    DraftIssue,
    ExtractionParse,
    MemoryDraft,
    as_list,
    clean_text,
)
from memstream.domain.extraction.times import resolve_time
from memstream.domain.extraction.window import Window, WindowTurn
from memstream.domain.repair import UnusableAnswer
from memstream.domain.weak_output import repair_type, shares_content_word

__all__ = ["ExtractionFormatError", "EmptyExtraction", "parse_extraction", "MAX_MEMORIES"]

MAX_MEMORIES = 10
"""Most memories one extraction may keep (the prompt asks for at most this many)."""


class ExtractionFormatError(ValueError):
    """The model's answer has no usable shape at all (not one memory can be read)."""


class EmptyExtraction(UnusableAnswer):
    """The answer parsed, but no memory survived validation and the model did not say
    that nothing is worth remembering: the window's turns must not be consumed as if it
    had (not retried: the same model answers the same window the same way). ``parse``
    holds what was read (no drafts; the issues and counts)."""

    def __init__(self, message: str, parse: "ExtractionParse") -> None:
        super().__init__(message)
        self.parse = parse



def _memory_records(value: Any) -> list[tuple[str | None, list[Any], list[Any]]]:
    """``(scene title, scene message ids, memory objects)`` for each scene in any of the
    shapes weak models produce: ``{"scenes": [...]}``, ``{"memories": [...]}``, a bare
    list of memories, or a list of scenes."""
    if isinstance(value, dict):
        if "scenes" in value:
            scenes = as_list(value.get("scenes"))
        elif "memories" in value:
            scenes = [{"title": value.get("title"), "message_ids": [], "memories": value["memories"]}]
        elif "content" in value:
            scenes = [{"title": None, "message_ids": [], "memories": [value]}]
        else:
            raise ExtractionFormatError(
                "answer has neither 'scenes' nor 'memories' (keys: "
                + ", ".join(sorted(str(k) for k in value)[:8])
                + ")"
            )
    elif isinstance(value, list):
        if value and not any(isinstance(v, dict) for v in value):
            raise ExtractionFormatError("answer is a list without a single object")
        if value and all(isinstance(v, dict) and "memories" in v for v in value):
            scenes = value
        else:
            scenes = [{"title": None, "message_ids": [], "memories": value}]
    else:
        raise ExtractionFormatError(f"answer is a {type(value).__name__}, not an object")
    out: list[tuple[str | None, list[Any], list[Any]]] = []
    for scene in scenes:
        if not isinstance(scene, dict):
            continue
        title = scene.get("title") if isinstance(scene.get("title"), str) else None
        ids = as_list(scene.get("message_ids"))
        out.append((title, ids, as_list(scene.get("memories"))))
    if scenes and not out:
        raise ExtractionFormatError("no scene in the answer is an object")
    return out


def _priority(value: Any) -> tuple[int, bool]:
    """A 0-100 priority and whether the value was usable (else 50)."""
    if isinstance(value, bool) or value is None:
        return DEFAULT_PRIORITY, value is None
    if isinstance(value, (int, float)):
        if value != value or value in (float("inf"), float("-inf")):
            return DEFAULT_PRIORITY, False
        return max(0, min(100, int(round(value)))), True
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*100|%)?\s*", value)
        if match:
            return max(0, min(100, int(round(float(match.group(1)))))), True
    return DEFAULT_PRIORITY, False


def _entities(value: Any) -> tuple[Entity, ...]:
    seen: set[str] = set()
    out: list[Entity] = []
    for item in as_list(value):
        name: Any
        kind: Any
        if isinstance(item, str):
            name, kind = item, "other"
        elif isinstance(item, dict):
            name = item.get("name")
            kind = item.get("kind", item.get("type", "other"))
        else:
            continue
        if not isinstance(name, str):
            continue
        name = " ".join(clean_text(name).split())[:200]
        if not name or name.casefold() in seen:
            continue
        try:
            entity = Entity(name=name, kind=kind if isinstance(kind, str) else "other")
        except ValueError:
            continue
        seen.add(name.casefold())
        out.append(entity)
        if len(out) >= MAX_ENTITIES:
            break
    return tuple(out)


def _said_nothing(value: Any) -> bool:
    """The answer's explicit "nothing to remember": an empty top-level list of scenes or
    memories (``{"scenes": []}`` is the prompt's form)."""
    if isinstance(value, list):
        return not value
    if isinstance(value, dict):
        for key in ("scenes", "memories"):
            if key in value:
                return value[key] == []
    return False


@dataclass
class _Tally:
    type_repairs: int = 0
    invented_ids_dropped: int = 0
    hallucination_suspects: int = 0


def parse_extraction(value: Any, window: Window, *, max_memories: int) -> ExtractionParse:
    """Read the model's answer into drafts; see the module docstring for the rules.

    Raises :class:`ExtractionFormatError` when the answer has no usable shape, and
    :class:`EmptyExtraction` when no memory is left and the model did not say that
    nothing is worth remembering; individual bad memories become :class:`DraftIssue`
    entries instead.
    """
    scenes = _memory_records(value)
    drafts: list[MemoryDraft] = []
    issues: list[DraftIssue] = []
    tally = _Tally()
    new_ids = {t.message_id for t in window.new_turns}

    for title, scene_ids, memories in scenes:
        scene_turns = [t for t in (window.resolve(r) for r in scene_ids) if t is not None]
        for raw in memories:
            if not isinstance(raw, dict):
                if isinstance(raw, str) and raw.strip():
                    raw = {"content": raw}
                else:
                    issues.append(DraftIssue("not_an_object", f"memory is {type(raw).__name__}"))
                    continue
            draft, found = _draft(raw, title, scene_turns, window, new_ids, tally)
            issues.extend(found)
            if draft is None:
                continue
            if len(drafts) >= max_memories:
                issues.append(DraftIssue("over_limit", f"more than {max_memories} memories", draft.content))
                continue
            drafts.append(draft)
    nothing = not drafts and _said_nothing(value)
    if nothing:
        issues.append(DraftIssue("nothing_to_remember", "the model answered that nothing in the window is worth remembering"))
    parsed = ExtractionParse(
        tuple(drafts),
        tuple(issues),
        len(scenes),
        type_repairs=tally.type_repairs,
        invented_ids_dropped=tally.invented_ids_dropped,
        hallucination_suspects=tally.hallucination_suspects,
        nothing_to_remember=nothing,
    )
    if not drafts and not nothing:
        reasons = "; ".join(f"{i.kind}: {i.detail}" for i in issues[:5]) or "no memory in the scenes"
        raise EmptyExtraction(f"no usable memory in the answer ({reasons})", parsed)
    return parsed


def _sources(
    raw: dict[str, Any], scene_turns: list[WindowTurn], window: Window
) -> tuple[list[WindowTurn], list[str], str | None]:
    """The turns a memory cites, the cited ids that are not turns of the window, and a
    note when the sources had to be filled in (from the scene, else the window)."""
    cited = as_list(raw.get("source_ids", raw.get("source_message_ids", raw.get("sources"))))
    resolved: list[WindowTurn] = []
    invented: list[str] = []
    for ref in cited:
        turn = window.resolve(ref)
        if turn is None:
            invented.append(str(ref)[:60])
        elif turn not in resolved:
            resolved.append(turn)
    if resolved:
        return resolved, invented, None
    from_scene = [t for t in scene_turns if not t.background]
    if from_scene:
        return from_scene, invented, "sources_from_scene"
    return list(window.new_turns), invented, "sources_from_window"


def _content(raw: dict[str, Any], notes: list[str]) -> str | None:
    """The memory's cleaned text, cut to the event limit (noted); ``None`` if empty."""
    content = raw.get("content", raw.get("memory", raw.get("text")))
    if isinstance(content, (int, float)) and not isinstance(content, bool):
        content = str(content)
    if not isinstance(content, str):
        return None
    content = clean_text(content)
    if not content:
        return None
    if len(content) > MAX_MEMORY_CHARS:
        content = content[: MAX_MEMORY_CHARS - 1].rstrip() + "…"
        notes.append("content_cut")
    return content


def _times(raw: dict[str, Any], reference: datetime, notes: list[str]) -> tuple[datetime | None, ...]:
    """``(timestamp, start, end)`` resolved against ``reference``; a reversed interval is
    swapped and every unreadable value noted."""
    times: dict[str, datetime | None] = {}
    for name in ("timestamp", "timestamp_start", "timestamp_end"):
        value = raw.get(name)
        parsed = resolve_time(value, reference)
        if parsed is None and value not in (None, ""):
            notes.append(f"bad_{name}")
        times[name] = parsed
    start, end = times["timestamp_start"], times["timestamp_end"]
    if start is not None and end is not None and end < start:
        notes.append("interval_reversed")
        start, end = end, start
    return times["timestamp"], start, end


def _draft(
    raw: dict[str, Any],
    title: str | None,
    scene_turns: list[WindowTurn],
    window: Window,
    new_ids: set[str],
    tally: _Tally,
) -> tuple[MemoryDraft | None, list[DraftIssue]]:
    notes: list[str] = []
    issues: list[DraftIssue] = []
    content = _content(raw, notes)
    if content is None:
        return None, [DraftIssue("no_content", "memory without content")]

    raw_type = raw.get("type", raw.get("memory_type"))
    typed = repair_type(raw_type)
    memory_type = typed.memory_type
    if typed.repaired:
        tally.type_repairs += 1
        shown = raw_type[:40] if isinstance(raw_type, str) else type(raw_type).__name__
        notes.append(f"type_repaired:{typed.rule}:{shown}->{memory_type.value}")

    priority, ok = _priority(raw.get("priority"))
    if not ok:
        notes.append("priority_fallback")

    resolved, invented, filled = _sources(raw, scene_turns, window)
    if invented:
        tally.invented_ids_dropped += len(invented)
        notes.append("dropped_source_ids:" + ",".join(invented))
        issues.append(DraftIssue("invented_source_ids", ", ".join(invented), content))
    if filled is not None:
        notes.append(filled)
    if not any(t.message_id in new_ids for t in resolved):
        return None, [*issues, DraftIssue("background_only", "cites only background turns", content)]
    speakers = [t.message.speaker for t in resolved if t.message.speaker]
    if not shares_content_word(content, (t.text for t in resolved), speakers):
        tally.hallucination_suspects += 1
        cited = ",".join(t.alias for t in resolved)
        return None, [
            *issues,
            DraftIssue("hallucination_suspect", f"shares no content word with its source turns {cited}", content),
        ]

    reference = max(t.message.occurred_at for t in resolved)
    timestamp, start, end = _times(raw, reference, notes)
    scene = clean_text(title)[:500].strip() if isinstance(title, str) else None
    draft = MemoryDraft(
        content=content,
        memory_type=memory_type,
        priority=priority,
        source_message_ids=tuple(t.message_id for t in resolved),
        occurred_at=reference,
        scene=scene or None,
        timestamp=timestamp,
        timestamp_start=start,
        timestamp_end=end,
        entities=_entities(raw.get("entities")),
        notes=tuple(notes),
    )
    return draft, issues
