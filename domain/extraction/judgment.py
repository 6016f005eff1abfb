"""The judgment: each new draft against the memories recalled for it, and the answer.

:func:`plan_judgment` shows each draft with its candidates under short integer ids;
:func:`parse_judgment` maps the answer back to real memory ids, falling back to
``store`` for anything it cannot trust.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from memstream.domain.events import LinkRelation
from memstream.domain.extraction.drafts import MemoryDraft, as_list

__all__ = [
    "JUDGE_LINK_RELATIONS",
    "JUDGMENT_SCHEMA",
    "Action",
    "Candidate",
    "JudgmentPlan",
    "plan_judgment",
    "render_judgment",
    "JudgmentFormatError",
    "Decision",
    "store_all",
    "parse_judgment",
]


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


def _decision_list(value: Any) -> list[Any]:
    if isinstance(value, dict):
        raw = value.get("decisions", value.get("results"))
    elif isinstance(value, list):
        raw = value
    else:
        raw = None
    if not isinstance(raw, list):
        raise JudgmentFormatError("answer has no 'decisions' list")
    return raw


def _action_and_target(item: dict[str, Any], allowed: Mapping[int, str], notes: list[str]) -> tuple[Action, str | None]:
    """The judge's action; an ``update``/``merge`` whose target is not one of the
    draft's candidates becomes ``store`` (the id would be invented)."""
    action_text = item.get("action")
    try:
        action = Action(str(action_text).strip().lower())
    except ValueError:
        action = Action.store
        notes.append(f"unknown_action:{str(action_text)[:40]}")
    target: str | None = None
    if action in (Action.update, Action.merge):
        ref = _int_ref(item.get("target"))
        if ref is not None and ref in allowed:
            target = allowed[ref]
        else:
            notes.append(f"invalid_target:{str(item.get('target'))[:40]}")
            action = Action.store
    return action, target


def _judged_links(item: dict[str, Any], allowed: Mapping[int, str], notes: list[str]) -> list[tuple[str, LinkRelation]]:
    """The links the judge named to the draft's own candidates, with relations it may name."""
    links: list[tuple[str, LinkRelation]] = []
    for link in as_list(item.get("links")):
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
        if ref is None or ref not in allowed:
            notes.append(f"invalid_link_target:{str(link.get('target'))[:40]}")
            continue
        pair = (allowed[ref], relation)
        if pair not in links:
            links.append(pair)
    return links


def _judged(item: dict[str, Any], index: int, allowed: Mapping[int, str]) -> Decision:
    notes: list[str] = []
    action, target = _action_and_target(item, allowed, notes)
    links = _judged_links(item, allowed, notes)
    reason = item.get("reason")
    return Decision(
        index,
        action,
        target=target,
        links=tuple(links),
        reason=reason[:1000] if isinstance(reason, str) and reason.strip() else None,
        decided_by="llm",
        notes=tuple(notes),
        candidates=tuple(allowed.values()),
    )


def parse_judgment(value: Any, plan: JudgmentPlan, draft_count: int) -> dict[int, Decision]:
    """One decision per draft (index -> decision).

    Drafts the judge was not asked about, or did not answer for, are stored. An
    ``update``/``merge`` whose target is not one of that draft's candidates becomes
    ``store`` (the id would be invented). Links to numbers outside the draft's
    candidates, or with a relation the judge may not name, are dropped.
    Raises :class:`JudgmentFormatError` when no decision list can be found at all.
    """
    raw = _decision_list(value)
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
        decisions[index] = _judged(item, index, allowed)
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
