"""The pure half of the extractor: from turns to memory drafts to events.

The pipeline (orchestrated with I/O in :mod:`memstream.streams.extractor`) is:

1. :func:`build_window` gates each turn (:mod:`memstream.domain.quality`) and gives the
   qualifying ones short aliases (``t1``, ``t2``...) that the model cites. Short aliases
   cost fewer tokens than UUIDs and are easy to check: a cited id that is not in the
   window is dropped, never invented or guessed.
2. :func:`parse_extraction` turns the model's (repaired) JSON into :class:`MemoryDraft`
   objects, validating each memory on its own: a bad priority falls back to 50, an
   unknown type is repaired by the rule of :func:`memstream.domain.weak_output.repair_type`,
   an unparsable time becomes none. Cited ids that are not turns of the window are
   dropped; a memory left with no source cites the scene's new turns, else the window's
   (flagged ``sources_from_window`` in its provenance). A memory that shares no content
   word with its sources (:func:`memstream.domain.weak_output.shares_content_word`) is
   dropped as a ``hallucination_suspect``, as is one without content. One bad memory
   never sinks the batch; but an answer with no memory left means "nothing to
   remember" only when the model said so (``{"scenes": []}``, the prompt's form, or an
   empty ``memories`` list or array): otherwise :class:`EmptyExtraction`.
3. :func:`dedupe_batch` and :func:`split_known` do exact dedup by content hash, within
   the batch and against every hash already in the memory space.
4. :func:`plan_judgment` shows each remaining draft with its recalled candidates under
   short integer ids; :func:`parse_judgment` maps the answer back to real memory ids,
   falling back to ``store`` for anything it cannot trust.
5. :func:`build_events` maps decisions to ADD-only events: ``store`` -> ``MemoryAdded``;
   ``update`` -> ``MemoryAdded`` + ``MemoryLinked(supersedes)``; ``merge`` ->
   ``MemoryLinked(duplicates)`` to the canonical memory; ``drop`` -> nothing, the decision
   kept in the provenance of the batch's other events and in the run's outcome.

Memory ids are derived from the memory space and the content hash
(:func:`memory_id_for`), and link ids from their endpoints: when a run is repeated
(a crash after producing, a rebalance), the repeat produces the same ids and the
projection's upserts absorb it.

:func:`heuristic_drafts` is the no-LLM path: each qualifying new turn becomes one
``episodic`` memory whose only source is that turn (rules in its docstring).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime, time, timedelta, timezone
from enum import StrEnum
from functools import cached_property
from typing import Any, Literal

from pydantic import TypeAdapter

from memstream.domain.content import content_hash
from memstream.domain.events import (
    MAX_MEMORY_CHARS,
    EmbeddingPayload,
    Entity,
    EntityKind,
    EventBase,
    JsonObject,
    LinkRelation,
    MemoryAdded,
    MemoryLinked,
    MemoryType,
    MessageObserved,
    Provenance,
    Scope,
)
from memstream.domain.quality import GateResult, gate
from memstream.domain.repair import UnusableAnswer
from memstream.domain.weak_output import repair_type, shares_content_word

_JSON_OBJECT: TypeAdapter[dict[str, Any]] = TypeAdapter(JsonObject)

__all__ = [
    "MAX_TURN_CHARS_IN_PROMPT",
    "MAX_ENTITIES",
    "DEFAULT_PRIORITY",
    "EXTRACTION_SCHEMA",
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

MAX_TURN_CHARS_IN_PROMPT = 4_000
"""A turn longer than this is cut in the prompt (the full turn stays in L0): ten turns
of the 32,000-character maximum would not fit a small model's context."""

MAX_ENTITIES = 20
DEFAULT_PRIORITY = 50
_PRODUCER = "memstream-extractor"

# --------------------------------------------------------------------------------------
# Windows
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowTurn:
    """A qualifying turn as the model sees it: ``alias`` (``t3``) and the gated text."""

    alias: str
    message: MessageObserved
    text: str
    background: bool

    @property
    def message_id(self) -> str:
        return self.message.message_id


@dataclass(frozen=True)
class Window:
    """One extraction's input.

    ``turns`` holds the qualifying turns, background first; ``rejected`` the new turns
    the quality gate kept out (with the verdict, for the run's record); ``new_message_ids``
    every new turn's id, qualifying or not: all of them are consumed by a successful run.
    """

    scope: Scope
    session_id: str | None
    turns: tuple[WindowTurn, ...]
    rejected: tuple[tuple[str, GateResult], ...]
    new_message_ids: tuple[str, ...]

    @property
    def new_turns(self) -> tuple[WindowTurn, ...]:
        return tuple(t for t in self.turns if not t.background)

    @property
    def background_turns(self) -> tuple[WindowTurn, ...]:
        return tuple(t for t in self.turns if t.background)

    @property
    def input_refs(self) -> tuple[str, ...]:
        """The message ids shown to the model (background and new)."""
        return tuple(t.message_id for t in self.turns)

    def resolve(self, ref: Any) -> WindowTurn | None:
        """The turn a cited id points to: an alias (``t3``, ``T3``, ``[t3]``), a bare
        alias number (``3``) or the message id itself; ``None`` for anything else."""
        if isinstance(ref, bool):
            return None
        if isinstance(ref, int):
            ref = f"t{ref}"
        if not isinstance(ref, str):
            return None
        key = ref.strip().strip("[]()").strip()
        by_alias = {t.alias: t for t in self.turns}
        if key.lower() in by_alias:
            return by_alias[key.lower()]
        if key.isdigit() and f"t{int(key)}" in by_alias:
            return by_alias[f"t{int(key)}"]
        for turn in self.turns:
            if turn.message_id == key:
                return turn
        return None


def build_window(
    scope: Scope,
    session_id: str | None,
    new_turns: Sequence[MessageObserved],
    background_turns: Sequence[MessageObserved] = (),
    *,
    max_background: int | None = None,
) -> Window:
    """Gate the turns and number the qualifying ones.

    Background turns that fail the gate are left out silently (they were recorded when
    they were new); at most ``max_background`` of the latest qualifying ones are kept.
    A turn id seen among the new turns is never repeated as background.
    """
    new_ids = {m.message_id for m in new_turns}
    background: list[tuple[MessageObserved, str]] = []
    for message in background_turns:
        if message.message_id in new_ids:
            continue
        verdict = gate(message.content)
        if verdict.passed:
            background.append((message, verdict.text))
    if max_background is not None:
        background = background[-max_background:] if max_background > 0 else []

    turns: list[WindowTurn] = []
    for message, text in background:
        turns.append(WindowTurn(f"t{len(turns) + 1}", message, text, True))
    rejected: list[tuple[str, GateResult]] = []
    seen: set[str] = set()
    for message in new_turns:
        if message.message_id in seen:
            continue
        seen.add(message.message_id)
        verdict = gate(message.content)
        if verdict.passed:
            turns.append(WindowTurn(f"t{len(turns) + 1}", message, verdict.text, False))
        else:
            rejected.append((message.message_id, verdict))
    new_message_ids = tuple(dict.fromkeys(m.message_id for m in new_turns))
    return Window(scope, session_id, tuple(turns), tuple(rejected), new_message_ids)


def _format_time(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC (%A)")


def _render_turn(turn: WindowTurn) -> str:
    m = turn.message
    who = m.role if not m.speaker else f"{m.role} {m.speaker}"
    text = turn.text
    if len(text) > MAX_TURN_CHARS_IN_PROMPT:
        text = text[:MAX_TURN_CHARS_IN_PROMPT] + " [...cut]"
    body = text.replace("\r\n", "\n").replace("\n", "\n    ")
    return f"[{turn.alias}] {_format_time(m.occurred_at)} | {who}: {body}"


def render_turns(window: Window) -> tuple[str, str]:
    """``(background, new)`` prompt text: one ``[alias] time | role speaker: text`` line
    per turn (continuation lines indented)."""
    background = "\n".join(_render_turn(t) for t in window.background_turns) or "(none)"
    new = "\n".join(_render_turn(t) for t in window.new_turns) or "(none)"
    return background, new


# --------------------------------------------------------------------------------------
# The model's extraction output
# --------------------------------------------------------------------------------------

_MEMORY_TYPES = [t.value for t in MemoryType]
_ENTITY_KINDS = [k.value for k in EntityKind]

_KNOWN_RELATIONS = [
    "supersedes", "preference_update", "contradicts", "same_entity", "narrative_continuation", "duplicates"
]
"""What a new memory may say of a known one (``memstream.domain.known`` reads them)."""

EXTRACTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "scenes": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "title": {"type": "string"},
                    "message_ids": {"type": "array", "items": {"type": "string"}},
                    "memories": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "content": {"type": "string"},
                                "type": {"type": "string", "enum": _MEMORY_TYPES},
                                "priority": {"type": "integer"},
                                "source_ids": {"type": "array", "items": {"type": "string"}},
                                "timestamp": {"type": ["string", "null"]},
                                "timestamp_start": {"type": ["string", "null"]},
                                "timestamp_end": {"type": ["string", "null"]},
                                "entities": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "name": {"type": "string"},
                                            "kind": {"type": "string", "enum": _ENTITY_KINDS},
                                        },
                                        "required": ["name", "kind"],
                                        "additionalProperties": False,
                                    },
                                },
                                "links": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "known": {"type": "string"},
                                            "relation": {"type": "string", "enum": _KNOWN_RELATIONS},
                                        },
                                        "required": ["known", "relation"],
                                        "additionalProperties": False,
                                    },
                                },
                            },
                            "required": [
                                "content",
                                "type",
                                "priority",
                                "source_ids",
                                "timestamp",
                                "timestamp_start",
                                "timestamp_end",
                                "entities",
                                "links",
                            ],
                            "additionalProperties": False,
                        },
                    },
                },
                "required": ["title", "message_ids", "memories"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["scenes"],
    "additionalProperties": False,
}
"""The JSON schema sent as structured output (strict-mode compatible: every property
required, nullable times as type unions, no numeric bounds; the parser clamps)."""


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


@dataclass(frozen=True)
class MemoryDraft:
    """A validated memory that is not an event yet (no id, no embedding)."""

    content: str
    memory_type: MemoryType
    priority: int
    source_message_ids: tuple[str, ...]
    occurred_at: datetime
    scene: str | None = None
    timestamp: datetime | None = None
    timestamp_start: datetime | None = None
    timestamp_end: datetime | None = None
    entities: tuple[Entity, ...] = ()
    notes: tuple[str, ...] = ()

    @cached_property
    def content_hash(self) -> str:
        """Computed once (dedup, the lookup and the event all ask for it)."""
        return content_hash(self.content)


@dataclass(frozen=True)
class DraftIssue:
    """Something the parser dropped or fixed, kept for the run's record and provenance."""

    kind: str
    detail: str
    content: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"issue": self.kind, "detail": self.detail}
        if self.content is not None:
            out["content"] = self.content[:200]
        return out


@dataclass(frozen=True)
class ExtractionParse:
    """The drafts and issues of one answer, with the weak-output counts for metrics:
    memory types repaired, cited ids dropped, memories dropped as hallucination
    suspects; ``nothing_to_remember`` when the model explicitly found nothing."""

    drafts: tuple[MemoryDraft, ...]
    issues: tuple[DraftIssue, ...]
    scenes: int
    type_repairs: int = 0
    invented_ids_dropped: int = 0
    hallucination_suspects: int = 0
    nothing_to_remember: bool = False


_UNSAFE_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Model text made storable: C0 control characters other than tab, newline and
    carriage return, and unpaired surrogates, removed (events refuse both); trimmed."""
    return _UNSAFE_CHARS.sub("", text).strip()


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list):
        return value
    if isinstance(value, (tuple, set)):
        return list(value)
    return [value]


def _memory_records(value: Any) -> list[tuple[str | None, list[Any], list[Any]]]:
    """``(scene title, scene message ids, memory objects)`` for each scene in any of the
    shapes weak models produce: ``{"scenes": [...]}``, ``{"memories": [...]}``, a bare
    list of memories, or a list of scenes."""
    if isinstance(value, dict):
        if "scenes" in value:
            scenes = _as_list(value.get("scenes"))
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
        ids = _as_list(scene.get("message_ids"))
        out.append((title, ids, _as_list(scene.get("memories"))))
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
    for item in _as_list(value):
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
    cited = _as_list(raw.get("source_ids", raw.get("source_message_ids", raw.get("sources"))))
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
    content = raw.get("content", raw.get("memory", raw.get("text")))
    if isinstance(content, (int, float)) and not isinstance(content, bool):
        content = str(content)
    if not isinstance(content, str):
        return None, [DraftIssue("no_content", "memory without content")]
    content = clean_text(content)
    if not content:
        return None, [DraftIssue("no_content", "memory without content")]
    if len(content) > MAX_MEMORY_CHARS:
        content = content[: MAX_MEMORY_CHARS - 1].rstrip() + "…"
        notes.append("content_cut")

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

    sources = tuple(t.message_id for t in resolved)
    reference = max(t.message.occurred_at for t in resolved)
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

    scene = clean_text(title)[:500].strip() if isinstance(title, str) else None
    scene = scene or None
    draft = MemoryDraft(
        content=content,
        memory_type=memory_type,
        priority=priority,
        source_message_ids=sources,
        occurred_at=reference,
        scene=scene,
        timestamp=times["timestamp"],
        timestamp_start=start,
        timestamp_end=end,
        entities=_entities(raw.get("entities")),
        notes=tuple(notes),
    )
    return draft, issues


# --------------------------------------------------------------------------------------
# Times
# --------------------------------------------------------------------------------------

_WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
_UNITS = {"day": 1, "week": 7, "fortnight": 14}
_NUMBER_WORDS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
}
_RELATIVE_AGO = re.compile(
    r"^(\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)\s+"
    r"(day|week|fortnight|month|year)s?\s+ago$"
)
_RELATIVE_IN = re.compile(
    r"^in\s+(\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)\s+"
    r"(day|week|fortnight|month|year)s?$"
)
_LAST_NEXT = re.compile(r"^(last|next|this|coming|past|previous)\s+(\w+)$")


def _midnight(d: date) -> datetime:
    return datetime.combine(d, time(0), tzinfo=timezone.utc)


def _shift_months(d: date, months: int) -> date:
    index = d.year * 12 + (d.month - 1) + months
    year, month = divmod(index, 12)
    month += 1
    days_in_month = [31, 29 if (year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)) else 28,
                     31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1]
    return date(year, month, min(d.day, days_in_month))


def resolve_time(value: Any, reference: datetime) -> datetime | None:
    """A timezone-aware UTC time for what the model wrote, or ``None``.

    Accepted: ISO 8601 date-times (a naive one is taken as UTC), dates (midnight UTC),
    ``YYYY-MM`` and ``YYYY`` (the first day), and, as a safety net when the model did not
    resolve them itself, relative expressions against ``reference`` (the time of the turn
    that said them): ``today``, ``yesterday``, ``tomorrow``, ``the day before
    yesterday``, ``the day after tomorrow``, ``N days|weeks|months|years ago``, ``in N
    ...``, ``last|next week|month|year``, ``last|next|this <weekday>``. Relative results
    are dates (midnight UTC). Anything else is ``None``: a bad time never sinks a memory.
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        if 1900 <= value <= 2200 and float(value).is_integer():
            return _midnight(date(int(value), 1, 1))
        return None
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not text or len(text) > 80:
        return None
    iso = text.replace("Z", "+00:00").replace("z", "+00:00")
    try:
        parsed = datetime.fromisoformat(iso)
    except ValueError:
        parsed = None
    if parsed is not None:
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        try:
            return parsed.astimezone(timezone.utc)
        except (OverflowError, ValueError):
            return None  # e.g. year 1 at +05:00 leaves the representable range
    match = re.fullmatch(r"(\d{4})-(\d{1,2})", text)
    if match:
        try:
            return _midnight(date(int(match.group(1)), int(match.group(2)), 1))
        except ValueError:
            return None
    if re.fullmatch(r"\d{4}", text):
        return _midnight(date(int(text), 1, 1))
    return _relative(text.lower().rstrip("."), reference.astimezone(timezone.utc).date())


def _relative(text: str, today: date) -> datetime | None:
    text = " ".join(text.split())
    if text.startswith("the "):
        text = text[4:]
    fixed = {
        "today": 0, "now": 0, "tonight": 0, "this morning": 0, "this evening": 0,
        "yesterday": -1, "last night": -1, "tomorrow": 1,
        "day before yesterday": -2, "day after tomorrow": 2,
    }
    if text in fixed:
        return _midnight(today + timedelta(days=fixed[text]))
    for pattern, sign in ((_RELATIVE_AGO, -1), (_RELATIVE_IN, 1)):
        match = pattern.match(text)
        if match:
            raw_n, unit = match.group(1), match.group(2)
            n = int(raw_n) if raw_n.isdigit() else _NUMBER_WORDS[raw_n]
            if n > 10_000:
                return None
            if unit in _UNITS:
                return _midnight(today + timedelta(days=sign * n * _UNITS[unit]))
            months = n if unit == "month" else 12 * n
            try:
                return _midnight(_shift_months(today, sign * months))
            except ValueError:
                return None
    match = _LAST_NEXT.match(text)
    if match:
        which, what = match.groups()
        sign = 1 if which in ("next", "coming") else (0 if which == "this" else -1)
        if what == "week":
            return _midnight(today + timedelta(days=7 * sign))
        if what == "month":
            return _midnight(_shift_months(today, sign))
        if what == "year":
            return _midnight(_shift_months(today, 12 * sign))
        if what in _WEEKDAYS:
            target = _WEEKDAYS.index(what)
            delta = target - today.weekday()
            if sign < 0:
                delta = delta - 7 if delta >= 0 else delta
            elif sign > 0:
                delta = delta + 7 if delta <= 0 else delta
            return _midnight(today + timedelta(days=delta))
    return None


# --------------------------------------------------------------------------------------
# Ids and exact dedup
# --------------------------------------------------------------------------------------


def memory_id_for(scope: Scope, digest: str) -> str:
    """The memory id of a content hash in a memory space and agent: the same statement
    of the same agent always gets the same id, so a repeated run is absorbed by
    upserts, and two agents never share one (the "default" agent keeps the id it had
    before agents were part of it)."""
    parts = [scope.team_id, scope.user_id, digest]
    if scope.agent_id != "default":
        parts.insert(2, scope.agent_id)
    key = "\x1f".join(parts).encode()
    return "mem-" + hashlib.sha256(key).hexdigest()[:32]


def link_id_for(from_id: str, to_id: str, relation: LinkRelation | str) -> str:
    key = f"{from_id}\x1f{to_id}\x1f{relation}".encode()
    return "lnk-" + hashlib.sha256(key).hexdigest()[:32]


def dedupe_batch(drafts: Sequence[MemoryDraft]) -> tuple[list[MemoryDraft], list[DraftIssue]]:
    """Drop drafts whose content hash repeats an earlier draft of the same batch; the
    kept draft takes the union of their sources and the highest priority."""
    kept: dict[str, MemoryDraft] = {}
    issues: list[DraftIssue] = []
    for draft in drafts:
        digest = draft.content_hash
        first = kept.get(digest)
        if first is None:
            kept[digest] = draft
            continue
        sources = tuple(dict.fromkeys(first.source_message_ids + draft.source_message_ids))
        kept[digest] = replace(
            first,
            source_message_ids=sources,
            priority=max(first.priority, draft.priority),
            occurred_at=max(first.occurred_at, draft.occurred_at),
        )
        issues.append(DraftIssue("duplicate_in_batch", digest, draft.content))
    return list(kept.values()), issues


def split_known(
    drafts: Sequence[MemoryDraft], known: Mapping[str, str]
) -> tuple[list[MemoryDraft], list[tuple[MemoryDraft, str]]]:
    """``(new drafts, [(draft, existing memory id)])`` given the hashes already stored in
    the memory space (``{content_hash: memory_id}``)."""
    new: list[MemoryDraft] = []
    duplicates: list[tuple[MemoryDraft, str]] = []
    for draft in drafts:
        existing = known.get(draft.content_hash)
        if existing is None:
            new.append(draft)
        else:
            duplicates.append((draft, existing))
    return new, duplicates


# --------------------------------------------------------------------------------------
# Judgment
# --------------------------------------------------------------------------------------

JUDGE_LINK_RELATIONS = frozenset(
    {
        LinkRelation.same_entity,
        LinkRelation.preference_update,
        LinkRelation.narrative_continuation,
        LinkRelation.contradicts,
    }
)
"""Relations the judge may name besides its action (``supersedes`` and ``duplicates``
come from the ``update`` and ``merge`` actions themselves)."""


class Action(StrEnum):
    store = "store"
    update = "update"
    merge = "merge"
    drop = "drop"


JUDGMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "decisions": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "new": {"type": "integer"},
                    "action": {"type": "string", "enum": [a.value for a in Action]},
                    "target": {"type": ["integer", "null"]},
                    "links": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "target": {"type": "integer"},
                                "relation": {
                                    "type": "string",
                                    "enum": sorted(r.value for r in JUDGE_LINK_RELATIONS),
                                },
                            },
                            "required": ["target", "relation"],
                            "additionalProperties": False,
                        },
                    },
                    "reason": {"type": "string"},
                },
                "required": ["new", "action", "target", "links", "reason"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["decisions"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Candidate:
    """An existing memory recalled for a draft (from the projection, same scope)."""

    memory_id: str
    content: str
    memory_type: str | None = None
    score: float | None = None
    when: datetime | None = None


@dataclass(frozen=True)
class JudgmentPlan:
    """What the judge sees. ``items`` maps the ``N<k>`` numbers (1-based) to draft
    indexes and their candidates' short ids; ``candidates`` maps a short id to a memory."""

    items: tuple[tuple[int, int, tuple[int, ...]], ...]
    candidates: Mapping[int, Candidate]

    @property
    def empty(self) -> bool:
        return not self.items


def plan_judgment(
    drafts: Sequence[MemoryDraft], candidates: Sequence[Sequence[Candidate]]
) -> JudgmentPlan:
    """Number the drafts that have candidates, and the distinct candidates (1, 2, ...).

    A candidate recalled for several drafts keeps one number. Drafts without candidates
    are not shown: they are stored without asking.
    """
    if len(drafts) != len(candidates):
        raise ValueError("one candidate list per draft is required")
    numbers: dict[str, int] = {}
    table: dict[int, Candidate] = {}
    items: list[tuple[int, int, tuple[int, ...]]] = []
    for index, found in enumerate(candidates):
        ids: list[int] = []
        for cand in found:
            number = numbers.get(cand.memory_id)
            if number is None:
                number = len(numbers) + 1
                numbers[cand.memory_id] = number
                table[number] = cand
            if number not in ids:
                ids.append(number)
        if ids:
            items.append((len(items) + 1, index, tuple(ids)))
    return JudgmentPlan(tuple(items), table)


def _short(text: str, limit: int = 600) -> str:
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"


def render_judgment(plan: JudgmentPlan, drafts: Sequence[MemoryDraft]) -> str:
    """The judge's ``$items`` text."""
    blocks: list[str] = []
    for number, index, cand_ids in plan.items:
        draft = drafts[index]
        lines = [f'N{number} [{draft.memory_type.value}] "{_short(draft.content)}"', "  CANDIDATES:"]
        for cid in cand_ids:
            cand = plan.candidates[cid]
            kind = f"[{cand.memory_type}] " if cand.memory_type else ""
            when = f" (from {cand.when.date().isoformat()})" if cand.when else ""
            lines.append(f'  [{cid}] {kind}"{_short(cand.content)}"{when}')
        blocks.append("\n".join(lines))
    return "NEW MEMORIES AND THEIR CANDIDATES:\n\n" + "\n\n".join(blocks)


class JudgmentFormatError(ValueError):
    """The judge's answer has no usable shape (the caller then stores every draft)."""


@dataclass(frozen=True)
class Decision:
    """What happens to one draft. ``target`` and link targets are real memory ids."""

    draft_index: int
    action: Action
    target: str | None = None
    links: tuple[tuple[str, LinkRelation], ...] = ()
    reason: str | None = None
    decided_by: Literal["llm", "rule"] = "rule"
    notes: tuple[str, ...] = ()
    candidates: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.action.value, "decided_by": self.decided_by}
        if self.target:
            out["target"] = self.target
        if self.links:
            out["links"] = [{"to": to, "relation": rel.value} for to, rel in self.links]
        if self.reason:
            out["reason"] = self.reason[:500]
        if self.notes:
            out["notes"] = list(self.notes)
        if self.candidates:
            out["candidates"] = list(self.candidates)
        return out


def store_all(count: int, reason: str, *, candidates: Sequence[Sequence[Candidate]] = ()) -> dict[int, Decision]:
    """``store`` for every draft: the rule when there is no judge or it failed."""
    return {
        i: Decision(
            i,
            Action.store,
            reason=reason,
            decided_by="rule",
            candidates=tuple(c.memory_id for c in candidates[i]) if i < len(candidates) else (),
        )
        for i in range(count)
    }


def _int_ref(value: Any, prefix: str = "") -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip().strip("[]()").strip()
        if prefix and text[:1].upper() == prefix:
            text = text[1:]
        if text.isdigit():
            return int(text)
    return None


def parse_judgment(value: Any, plan: JudgmentPlan, draft_count: int) -> dict[int, Decision]:
    """One decision per draft (index -> decision).

    Drafts the judge was not asked about, or did not answer for, are stored. An
    ``update``/``merge`` whose target is not one of that draft's candidates becomes
    ``store`` (the id would be invented). Links to numbers outside the draft's
    candidates, or with a relation the judge may not name, are dropped.
    Raises :class:`JudgmentFormatError` when no decision list can be found at all.
    """
    if isinstance(value, dict):
        raw = value.get("decisions", value.get("results"))
    elif isinstance(value, list):
        raw = value
    else:
        raw = None
    if not isinstance(raw, list):
        raise JudgmentFormatError("answer has no 'decisions' list")

    by_number = {number: (index, cands) for number, index, cands in plan.items}
    decisions = store_all(draft_count, "no candidates: nothing to judge against")
    answered: set[int] = set()
    for position, item in enumerate(raw):
        if not isinstance(item, dict):
            continue
        number = _int_ref(item.get("new", item.get("id")), "N")
        if number is None and len(raw) == len(plan.items):
            number = plan.items[position][0]
        if number not in by_number or number in answered:
            continue
        answered.add(number)
        index, cand_ids = by_number[number]
        allowed = {cid: plan.candidates[cid].memory_id for cid in cand_ids}
        notes: list[str] = []
        action_text = item.get("action")
        try:
            action = Action(str(action_text).strip().lower())
        except ValueError:
            action = Action.store
            notes.append(f"unknown_action:{str(action_text)[:40]}")
        target: str | None = None
        if action in (Action.update, Action.merge):
            ref = _int_ref(item.get("target"))
            if ref in allowed:
                target = allowed[ref]
            else:
                notes.append(f"invalid_target:{str(item.get('target'))[:40]}")
                action = Action.store
        links: list[tuple[str, LinkRelation]] = []
        for link in _as_list(item.get("links")):
            if not isinstance(link, dict):
                continue
            ref = _int_ref(link.get("target"))
            try:
                relation = LinkRelation(str(link.get("relation", "")).strip().lower())
            except ValueError:
                notes.append(f"unknown_relation:{str(link.get('relation'))[:40]}")
                continue
            if relation not in JUDGE_LINK_RELATIONS:
                notes.append(f"relation_not_allowed:{relation.value}")
                continue
            if ref not in allowed:
                notes.append(f"invalid_link_target:{str(link.get('target'))[:40]}")
                continue
            pair = (allowed[ref], relation)
            if pair not in links:
                links.append(pair)
        reason = item.get("reason")
        decisions[index] = Decision(
            index,
            action,
            target=target,
            links=tuple(links),
            reason=reason[:1000] if isinstance(reason, str) and reason.strip() else None,
            decided_by="llm",
            notes=tuple(notes),
            candidates=tuple(allowed.values()),
        )
    for number, index, cand_ids in plan.items:
        if number not in answered:
            decisions[index] = Decision(
                index,
                Action.store,
                reason="the judge gave no decision",
                decided_by="rule",
                notes=("no_decision",),
                candidates=tuple(plan.candidates[c].memory_id for c in cand_ids),
            )
    return decisions


# --------------------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------------------


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
    correlation_id: str | None = None,
    own_refs: bool = False,
) -> BuiltEvents:
    """The ADD-only events for one run, in a stable order (each memory, then its links).

    ``batch_record`` (exact duplicates, gate rejections, parser issues) and every
    ``drop`` decision are written into the provenance of each event, so a decision
    that emitted nothing is still on the record wherever the batch left a trace.

    ``embeddings`` are payloads as the model validates them (``EmbeddingPayload(...)``,
    or built so that they hold, as the extractor builds them from a checked matrix):
    they are attached to the validated memories as they are, not validated a second
    time (a payload's check decodes its whole vector; it was half the cost of building
    a memory event).

    A memory's provenance names the run's inputs and outputs (what the model read and
    wrote). With ``own_refs`` (the heuristic, which makes each memory from its own
    turns alone) it names the memory's own turns and itself instead: the run's lists
    on every event grow with the square of the window, and the heuristic's windows
    are whole sessions; the run stays one ``correlation_id``.
    """
    if len(embeddings) != len(drafts):
        raise ValueError("one embedding slot per draft is required")
    ids = [memory_id_for(scope, d.content_hash) for d in drafts]
    envelope: dict[str, Any] = {
        "scope": scope,
        "session_id": session_id,
        "correlation_id": correlation_id,
        "producer": _PRODUCER,
        "recorded_at": recorded_at,
    }

    def decision_of(i: int) -> Decision:
        return decisions.get(i) or Decision(i, Action.store)

    # Pass 1: which memories can be events at all (validated without provenance).
    rejected: list[dict[str, Any]] = []
    valid: set[int] = set()
    checked: dict[int, MemoryAdded] = {}
    for i, draft in enumerate(drafts):
        if decision_of(i).action is not Action.store and decision_of(i).action is not Action.update:
            valid.add(i)
            continue
        try:
            checked[i] = _memory_event(envelope, ids[i], draft, None, None)
        except ValueError as exc:
            reason = " ".join(str(exc).split())[:300]
            rejected.append({"issue": "invalid_memory", "detail": reason, "content": draft.content[:200]})
            continue
        valid.add(i)

    added = [
        ids[i] for i in sorted(valid) if decision_of(i).action in (Action.store, Action.update)
    ]
    dropped = [
        {"memory_id": ids[i], "content": drafts[i].content[:200], **decision_of(i).as_dict()}
        for i in sorted(valid)
        if decision_of(i).action is Action.drop
    ]
    shared_record = [dict(r) for r in batch_record] + rejected + dropped
    judge_info = judgment.as_dict() if judgment is not None else None
    status_parts = [extraction.status] if extraction.status != "ok" else []
    if judgment is not None and judgment.status != "ok":
        status_parts.append(f"judgment_{judgment.status}")
    status = "+".join(status_parts) or "ok"
    note_parts = [n for n in (extraction.note, judgment.note if judgment else None) if n]
    note = "; ".join(note_parts)[:2000] or None

    # The batch's part of every provenance is validated once; each event adds its own
    # decision in front (validated alone) to a copy: validating the whole record per
    # event made a window of n memories cost n² (measured: most of build_events).
    base_provenance = _provenance(
        extraction, input_refs=input_refs, output_refs=added, decisions=shared_record, status=status, note=note
    )
    link_bases: dict[bool, Provenance] = {}

    def with_own(base: Provenance, own: dict[str, Any], **more: Any) -> Provenance:
        return base.model_copy(
            update={"decisions": (_JSON_OBJECT.validate_python(own), *base.decisions), **more}
        )

    def link_provenance(draft: MemoryDraft, by_llm: bool, own: dict[str, Any]) -> Provenance:
        base = link_bases.get(by_llm)
        if base is None:
            stage = judgment if by_llm and judgment is not None else StageReport("rule")
            base = link_bases[by_llm] = _provenance(
                stage, input_refs=(), output_refs=added, decisions=shared_record, status=status, note=note
            )
        # input refs are the draft's own turns
        return with_own(base, own).model_copy(update={"input_refs": tuple(draft.source_message_ids)})

    events: list[EventBase] = []
    for i, draft in enumerate(drafts):
        decision = decision_of(i)
        if i not in valid or decision.action is Action.drop:
            continue
        mine: dict[str, Any] = {"memory_id": ids[i], "stage": "judgment", **decision.as_dict()}
        if judge_info is not None and decision.decided_by == "llm":
            mine["judgment"] = judge_info
        if draft.notes:
            mine["draft_notes"] = list(draft.notes)
        by_llm = judgment is not None and decision.decided_by == "llm"
        if decision.action is Action.merge:
            if decision.target and decision.target != ids[i]:
                events.append(
                    MemoryLinked(
                        **envelope,
                        occurred_at=draft.occurred_at,
                        link_id=link_id_for(ids[i], decision.target, LinkRelation.duplicates),
                        from_memory_id=ids[i],
                        to_memory_id=decision.target,
                        relation=LinkRelation.duplicates,
                        decided_by=decision.decided_by,
                        reason=decision.reason or "same statement as an existing memory",
                        provenance=link_provenance(draft, by_llm, mine),
                    )
                )
            continue
        # Validated in pass 1; the provenance and the payload are validated models too,
        # so a copy with them set needs no second validation of the memory.
        # With own refs: both are valid refs already (pass 1 validated them as the
        # event's ids).
        refs = {"input_refs": tuple(draft.source_message_ids), "output_refs": (ids[i],)} if own_refs else {}
        provenance = with_own(base_provenance, mine, **refs)
        update: dict[str, Any] = {"provenance": provenance}
        if embeddings[i] is not None:
            update["embedding"] = embeddings[i]
        events.append(checked[i].model_copy(update=update))
        relations: list[tuple[str, LinkRelation]] = []
        if decision.action is Action.update and decision.target:
            relations.append((decision.target, LinkRelation.supersedes))
        relations.extend(decision.links)
        for target, relation in dict.fromkeys(relations):
            if target == ids[i]:
                continue
            events.append(
                MemoryLinked(
                    **envelope,
                    occurred_at=draft.occurred_at,
                    link_id=link_id_for(ids[i], target, relation),
                    from_memory_id=ids[i],
                    to_memory_id=target,
                    relation=relation,
                    decided_by=decision.decided_by,
                    reason=decision.reason,
                    provenance=link_provenance(draft, by_llm, mine),
                )
            )
    return BuiltEvents(tuple(events), tuple(rejected))


def _memory_event(
    envelope: Mapping[str, Any],
    memory_id: str,
    draft: MemoryDraft,
    embedding: EmbeddingPayload | None,
    provenance: Provenance | None,
) -> MemoryAdded:
    return MemoryAdded(
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


# --------------------------------------------------------------------------------------
# The heuristic extractor (no LLM configured)
# --------------------------------------------------------------------------------------

_STOPWORDS = frozenset(
    """
    i i'm i've i'll i'd me my mine we we're our us you you're your he he's him his she she's
    her it it's its they they're them their this that these those there here the a an and
    but or so if then than also just not no yes yeah yep ok okay hi hello hey thanks thank
    please sorry sure well oh ah maybe what when where why how who whom which whose can
    could would should will shall do does did is are was were be been have has had let
    let's at in on for to from with by of as after before since until about into over
    under again today tomorrow yesterday tonight now later soon great good nice cool fine
    monday tuesday wednesday thursday friday saturday sunday january february march april
    may june july august september october november december user assistant system
    """.split()
)
"""Capitalised words that are never entities on their own (sentence starters, pronouns,
greetings, weekdays, months)."""

_NOT_ASCII_LOWER_WORD = re.compile(r"(?<![\w'’.-])[\d_'’.-]*([^\W\d_a-z])[\w'’.-]*", re.UNICODE)
r"""The words of a text except those starting with an ASCII lower-case letter (group 1
starts the word). A word is a letter, then word characters and ``'’.-``
(``[^\W\d_][\w'’.-]*`` scanned left to right): the rest of a run of those
characters from the run's first letter; here, of a run whose first letter is not
``a-z``. Most words of a text start lower-case and can never begin a name;
skipping them in C instead of the loop makes the entity finder about 3x faster. They
still end a name: the text between two names' words is then not a single space."""


_ENTITY_CACHE_SIZE = 16_384
_entities_seen: dict[tuple[str, EntityKind], Entity] = {}


def _entity(name: str, kind: EntityKind) -> Entity:
    """``Entity(name=name, kind=kind)``, shared when built before (entities are
    immutable, and the same speakers and names recur turn after turn)."""
    key = (name, kind)
    found = _entities_seen.get(key)
    if found is None:
        found = Entity(name=name, kind=kind)
        if len(_entities_seen) >= _ENTITY_CACHE_SIZE:
            _entities_seen.clear()
        _entities_seen[key] = found
    return found


def heuristic_entities(text: str, speaker: str | None) -> tuple[Entity, ...]:
    """Entities without a model: the speaker (a ``person``), then every run of up to four
    capitalised words of two or more letters separated by single spaces (kind ``other``: the heuristic cannot
    tell a person from a place). Stopwords (:data:`_STOPWORDS`: pronouns, sentence
    starters, greetings, weekdays, months) are never part of a name; punctuation
    attached to a word ("Paris.", "Bob's") ends the name there. Case-insensitively
    unique, at most :data:`MAX_ENTITIES`."""
    found: list[Entity] = []
    seen: set[str] = set()

    def add(name: str, kind: EntityKind) -> None:
        key = name.casefold()
        if name and key not in seen and len(found) < MAX_ENTITIES:
            seen.add(key)
            found.append(_entity(name[:200], kind))

    if speaker and speaker.strip():
        add(" ".join(speaker.split()), EntityKind.person)
    run: list[str] = []

    def flush() -> None:
        if run:
            add(" ".join(run), EntityKind.other)
            run.clear()

    last_end = -1
    for match in _NOT_ASCII_LOWER_WORD.finditer(text):
        word = text[match.start(1) : match.end()]
        if not word[0].isupper():
            # Not a name (the word's first character is its bare form's first: only
            # its end is ever stripped), which ends any run.
            if run:
                flush()
            last_end = match.end()
            continue
        bare = word.rstrip(".'’-")
        if bare.endswith(("'s", "’s")):
            bare = bare[:-2]
        is_name = len(bare) >= 2 and bare[0].isupper() and bare.casefold() not in _STOPWORDS
        gap = text[last_end : match.start(1)] if last_end >= 0 else ""
        if run and (not is_name or gap != " " or len(run) >= 4):
            flush()
        if is_name:
            run.append(bare)
            if word != bare:
                flush()
        last_end = match.end()
    flush()
    return tuple(found)


def heuristic_drafts(window: Window) -> list[MemoryDraft]:
    """Memories without a model: each qualifying new turn becomes one ``episodic``
    memory of priority 50 whose only source is that turn. The content is the gated text,
    prefixed with ``"<speaker>: "`` when the turn names its speaker (so "what did Alice
    say" finds it), cut to the memory size limit. Its point time is the turn's time;
    its entities follow :func:`heuristic_entities`."""
    drafts: list[MemoryDraft] = []
    for turn in window.new_turns:
        speaker = turn.message.speaker
        content = f"{speaker.strip()}: {turn.text}" if speaker and speaker.strip() else turn.text
        notes: tuple[str, ...] = ()
        if len(content) > MAX_MEMORY_CHARS:
            content = content[: MAX_MEMORY_CHARS - 1].rstrip() + "…"
            notes = ("content_cut",)
        drafts.append(
            MemoryDraft(
                content=content,
                memory_type=MemoryType.episodic,
                priority=DEFAULT_PRIORITY,
                source_message_ids=(turn.message_id,),
                occurred_at=turn.message.occurred_at,
                timestamp=turn.message.occurred_at,
                entities=heuristic_entities(turn.text, speaker),
                notes=notes,
            )
        )
    return drafts


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
