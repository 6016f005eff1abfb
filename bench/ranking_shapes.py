"""The four shapes of ``memstream bench ranking``: what each writes and what each asks.

1. ``locomo_turns``: LoCoMo dev as turns (one memory per turn, as ``bench locomo``);
2. ``locomo_atomic``: LoCoMo dev's ``observation`` facts (per session and speaker, each
   with its evidence turn ids) written as memories, one space per conversation; a
   question is scored by evidence recall over the evidence of the facts returned, on
   the evidence ids some fact covers (items whose evidence no fact covers are not
   scored, and counted);
3. ``person_facts``: the generated person-facts set (:mod:`.person_facts`): facts and
   distractors as memories in one space, one question per fact;
4. ``mixed``: the same facts and distractors in another space, plus chit-chat turns of
   the same persons written as turns, which the extractor stores as it would.

Memories are ``MemoryAdded`` events as ``POST /v1/memories`` writes them (built by
``build_event``, no vector: the projector embeds them); turns are ``MessageObserved``.
The LoCoMo data is CC BY-NC: read from where the caller says, never copied.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from memstream.bench import locomo
from memstream.bench.person_facts import chit_chat, distractors, person_facts
from memstream.domain.events import MemoryAdded, MessageObserved, Scope, build_event

__all__ = ["PERSON_SEED", "SHAPES", "Query", "Shape", "build_shapes"]

SHAPES: tuple[str, ...] = ("locomo_turns", "locomo_atomic", "person_facts", "mixed")
PERSON_SEED = 41
"""The seed the ranking was tuned with; other seeds check it was not fitted to one draw."""
_FACTS_SCOPE = Scope(team_id="ranking-facts", user_id="persons")
_MIXED_SCOPE = Scope(team_id="ranking-mixed", user_id="persons")
_WHEN = datetime(2025, 1, 1, tzinfo=timezone.utc)
_OBSERVATION = re.compile(r"^session_(\d+)_observation$")


@dataclass(frozen=True)
class Query:
    scope: Scope
    text: str
    wanted: frozenset[str]
    """What a result must bring: evidence turn ids (LoCoMo) or the fact's memory id."""
    category: int = 0
    group: str = ""
    """The conversation (LoCoMo) or the person asked about: the unit a fit leaves out."""


@dataclass
class Shape:
    name: str
    events: list[Any] = field(default_factory=list)
    queries: list[Query] = field(default_factory=list)
    evidence: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """memory id -> evidence ids (atomic shape); other shapes score memory or turn ids."""
    unscored: int = 0

    def found(self, result: Any) -> Sequence[str]:
        """What one result brings: its evidence ids, turn ids or its own id."""
        if self.name == "locomo_turns":
            return tuple(result.source_message_ids)
        if self.name == "locomo_atomic":
            return self.evidence.get(result.memory_id, ())
        return (result.memory_id,)


def _memory(scope: Scope, memory_id: str, content: str, when: datetime) -> MemoryAdded:
    return build_event(
        MemoryAdded, scope=scope, memory_id=memory_id, content=content, memory_type="episodic",
        occurred_at=when, recorded_at=when, producer="memstream-bench-ranking",
    )


def _turns(conversations: Sequence[locomo.Conversation]) -> Shape:
    shape = Shape("locomo_turns")
    for conv in conversations:
        shape.events.extend(locomo.conversation_events(conv))
        scope = locomo.scope_of(conv)
        for item in conv.qa:
            valid, _ = locomo.resolve_evidence(item.evidence, conv.turn_ids)
            if not valid:
                shape.unscored += 1
                continue
            shape.queries.append(Query(scope, item.question, frozenset(valid), item.category, conv.sample_id))
    return shape


def _atomic(conversations: Sequence[locomo.Conversation], raw: Sequence[dict[str, Any]]) -> Shape:
    shape = Shape("locomo_atomic")
    by_id = {str(r["sample_id"]): r for r in raw}
    for conv in conversations:
        scope = Scope(team_id="ranking-atomic", user_id=locomo.scope_of(conv).user_id)
        when = {t.session: t.occurred_at for t in conv.turns}
        n0 = n = len(shape.evidence)
        for key, per_speaker in (by_id[conv.sample_id].get("observation") or {}).items():
            m = _OBSERVATION.match(key)
            if not m or not isinstance(per_speaker, dict):
                continue
            at = when.get(int(m.group(1)), _WHEN)
            for facts in per_speaker.values():
                for text, evidence in facts:
                    n += 1
                    mid = f"obs-{n}"
                    ids = locomo.split_evidence(evidence if isinstance(evidence, list) else [evidence])
                    shape.evidence[mid] = tuple(ids)
                    shape.events.append(_memory(scope, mid, str(text), at + timedelta(seconds=n)))
        covered = {e for ids in list(shape.evidence.values())[n0:] for e in ids}
        for item in conv.qa:
            valid, _ = locomo.resolve_evidence(item.evidence, conv.turn_ids)
            wanted = frozenset(valid) & covered
            if not wanted:
                shape.unscored += 1
                continue
            shape.queries.append(Query(scope, item.question, wanted, item.category, conv.sample_id))
    return shape


def _facts(name: str, scope: Scope, seed: int) -> Shape:
    shape = Shape(name)
    facts = person_facts(seed)
    for i, f in enumerate([*facts, *distractors(seed)]):
        shape.events.append(_memory(scope, f.memory_id, f.text, _WHEN + timedelta(minutes=i)))
    for f in facts:
        assert f.question is not None
        shape.queries.append(Query(scope, f.question, frozenset({f.memory_id}), 0, f.person))
    return shape


def _mixed(seed: int) -> Shape:
    shape = _facts("mixed", _MIXED_SCOPE, seed)
    start = _WHEN + timedelta(days=1)
    for i, turn in enumerate(chit_chat(seed=seed)):
        at = start + timedelta(days=turn.session, seconds=i)
        shape.events.append(
            build_event(
                MessageObserved, scope=_MIXED_SCOPE, message_id=turn.message_id, role="user",
                speaker=turn.speaker, content=turn.text, occurred_at=at, recorded_at=at,
                session_id=f"session_{turn.session}", producer="memstream-bench-ranking",
            )
        )
    return shape


def build_shapes(
    conversations: Sequence[locomo.Conversation], raw: Sequence[dict[str, Any]], seed: int = PERSON_SEED
) -> dict[str, Shape]:
    """Every shape's events and queries (see the module docstring)."""
    shapes = [_turns(conversations), _atomic(conversations, raw), _facts("person_facts", _FACTS_SCOPE, seed), _mixed(seed)]
    return {s.name: s for s in shapes}
