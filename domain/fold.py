"""The reference model: what a pure fold of the log says every read should answer.

The projector is fast and incremental; this is neither. It folds a sequence of events
in log order (each memory space's events in its partition's order, a turn placed
where it was written relative to them) into the state of each memory space, and
answers reads from that state by :class:`~memstream.domain.access.ReadScope`. It is
the oracle the stateful test (``tests/bench/test_fold_stack.py``) and ``memstream bench
fold`` compare the live stack with, so it says each rule once, plainly:

* a memory or turn id belongs to the agent that wrote it first (since the space's
  last forget); another agent's write of that id is refused; the owner's later write
  replaces the row (the latest position wins);
* a link id belongs to its agent (another agent's link of that id is another link);
  the agent's later write of the id replaces its earlier link whole, ends included
  (the latest write wins, as for every row kept by id: a link is a statement its
  author may correct, and an upsert cannot tell a correction from a first write);
  a memory's view comes from its own agent's links only: the latest
  ``supersedes``/``contradicts`` link to it sets ``superseded_by``, the latest
  ``duplicates`` link from it sets ``canonical_id``;
* a decision id belongs to its agent too; its ledger row's status only moves up
  (pending < expired < reflected), a later event fills the fields it knows; a lesson
  is a ``MemoryReflected`` row; outcomes change no view;
* ``SubjectForgotten`` empties its space (every space of the team with
  ``whole_team``) at its place in the log: what comes after it is kept;
* a read sees its space only, and only its agent's rows when pinned to one; a
  memory's evidence is its own agent's turns, whoever asks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from memstream.domain.access import ReadScope
from memstream.domain.content import normalize_content
from memstream.domain.events import (
    DecisionExpired,
    DecisionRecorded,
    EventBase,
    MemoryAdded,
    MemoryLinked,
    MemoryReflected,
    MessageObserved,
    SubjectForgotten,
)

__all__ = ["Memory", "Turn", "Link", "Decision", "Lesson", "Space", "Folded", "MemoryAnswer", "fold"]

_SUPERSEDING = frozenset({"supersedes", "contradicts"})
_STATUS_RANK = {"pending": 0, "expired": 1, "reflected": 2}


@dataclass(frozen=True)
class Memory:
    memory_id: str
    agent_id: str
    content: str
    memory_type: str
    source_message_ids: tuple[str, ...]
    entity_keys: tuple[str, ...]
    seq: int


@dataclass(frozen=True)
class Turn:
    message_id: str
    agent_id: str
    content: str


@dataclass(frozen=True)
class Link:
    link_id: str
    agent_id: str
    from_memory_id: str
    to_memory_id: str
    relation: str
    seq: int


@dataclass(frozen=True)
class Decision:
    decision_id: str
    agent_id: str
    subject: str
    status: str


@dataclass(frozen=True)
class Lesson:
    reflection_id: str
    agent_id: str
    subject: str
    decision_id: str
    content: str


@dataclass(frozen=True)
class MemoryAnswer:
    """What a read of one memory answers (the fields the tests compare)."""

    memory_id: str
    agent_id: str
    content: str
    memory_type: str
    status: str
    superseded_by: str | None
    canonical_id: str | None
    links_out: tuple[str, ...]
    links_in: tuple[str, ...]
    source_messages: tuple[tuple[str, str], ...]


@dataclass
class Space:
    """One memory space (team/user): its rows as the fold leaves them."""

    memories: dict[str, Memory] = field(default_factory=dict)
    turns: dict[str, Turn] = field(default_factory=dict)
    links: dict[tuple[str, str], Link] = field(default_factory=dict)
    """By (agent, link id)."""
    decisions: dict[tuple[str, str], Decision] = field(default_factory=dict)
    """By (agent, decision id)."""
    lessons: dict[str, Lesson] = field(default_factory=dict)


@dataclass
class Folded:
    """The fold's result: every space's state, and the subjects forgotten on the way
    (``(team, user)``; ``user`` is ``None`` for a whole team)."""

    spaces: dict[tuple[str, str], Space] = field(default_factory=dict)
    forgotten: list[tuple[str, str | None]] = field(default_factory=list)
    folded: int = 0
    """Events folded so far (a row's log order is the count when it was written)."""

    def _space(self, scope: ReadScope) -> Space:
        return self.spaces.get((scope.team_id, scope.user_id)) or Space()

    # ------------------------------------------------------------------ reads
    def memory(self, scope: ReadScope, memory_id: str) -> MemoryAnswer | None:
        """One memory as the read scope sees it, or ``None``."""
        space = self._space(scope)
        m = space.memories.get(memory_id)
        if m is None or not _sees(scope, m.agent_id):
            return None
        own = sorted((lk for lk in space.links.values() if lk.agent_id == m.agent_id), key=lambda lk: lk.seq)
        superseded_by = canonical_id = None
        for lk in own:
            if lk.relation in _SUPERSEDING and lk.to_memory_id == memory_id:
                superseded_by = lk.from_memory_id
            elif lk.relation == "duplicates" and lk.from_memory_id == memory_id:
                canonical_id = lk.to_memory_id
        status = "superseded" if superseded_by else "duplicate" if canonical_id else "active"
        seen = sorted((lk for lk in space.links.values() if _sees(scope, lk.agent_id)), key=lambda lk: lk.seq)
        evidence = []
        for mid in dict.fromkeys(m.source_message_ids):
            turn = space.turns.get(mid)
            if turn is not None and turn.agent_id == m.agent_id:
                evidence.append((mid, turn.content))
        return MemoryAnswer(
            memory_id=memory_id,
            agent_id=m.agent_id,
            content=m.content,
            memory_type=m.memory_type,
            status=status,
            superseded_by=superseded_by,
            canonical_id=canonical_id,
            links_out=tuple(lk.link_id for lk in seen if lk.from_memory_id == memory_id),
            links_in=tuple(lk.link_id for lk in seen if lk.to_memory_id == memory_id),
            source_messages=tuple(evidence),
        )

    def memories(self, scope: ReadScope) -> dict[str, MemoryAnswer]:
        """Every memory the read scope sees (current, superseded and duplicates)."""
        out = {mid: self.memory(scope, mid) for mid in self._space(scope).memories}
        return {mid: a for mid, a in out.items() if a is not None}

    def turns(self, scope: ReadScope) -> dict[str, str]:
        """message id -> text of the turns the read scope sees."""
        return {t.message_id: t.content for t in self._space(scope).turns.values() if _sees(scope, t.agent_id)}

    def links(self, scope: ReadScope) -> dict[tuple[str, str], tuple[str, str, str]]:
        """(agent, link id) -> (from, to, relation) of the links the read scope sees."""
        return {
            (lk.agent_id, lk.link_id): (lk.from_memory_id, lk.to_memory_id, lk.relation)
            for lk in self._space(scope).links.values()
            if _sees(scope, lk.agent_id)
        }

    def decisions(self, scope: ReadScope) -> dict[tuple[str, str], str]:
        """(agent, decision id) -> ledger status, of the rows the read scope sees."""
        return {(d.agent_id, d.decision_id): d.status for d in self._space(scope).decisions.values() if _sees(scope, d.agent_id)}

    def lessons(self, scope: ReadScope, subject: str | None = None) -> dict[str, str]:
        """reflection id -> lesson text the read scope sees (about ``subject``)."""
        return {
            r.reflection_id: r.content
            for r in self._space(scope).lessons.values()
            if _sees(scope, r.agent_id) and (subject is None or r.subject == subject)
        }

    def entity(self, scope: ReadScope, name: str) -> list[str]:
        """Ids of the memories the read scope sees that name ``name`` (normalised),
        oldest position first."""
        key = normalize_content(name)
        found = [m for m in self._space(scope).memories.values() if key and key in m.entity_keys and _sees(scope, m.agent_id)]
        return [m.memory_id for m in sorted(found, key=lambda m: m.seq)]


def _sees(scope: ReadScope, agent_id: str) -> bool:
    return scope.agent_id is None or scope.agent_id == agent_id


def fold(events: Iterable[EventBase], into: Folded | None = None) -> Folded:
    """Fold ``events`` (in log order) into the state of every memory space; ``into``
    continues an earlier fold."""
    state = into if into is not None else Folded()
    for event in events:
        _apply(state, event, state.folded)
        state.folded += 1
    return state


def _apply(state: Folded, e: EventBase, seq: int) -> None:
    s = e.scope
    if isinstance(e, SubjectForgotten):
        if e.whole_team:
            for key in [k for k in state.spaces if k[0] == s.team_id]:
                del state.spaces[key]
            state.forgotten.append((s.team_id, None))
        else:
            state.spaces.pop((s.team_id, s.user_id), None)
            state.forgotten.append((s.team_id, s.user_id))
        return
    space = state.spaces.setdefault((s.team_id, s.user_id), Space())
    if isinstance(e, MessageObserved):
        owner = space.turns.get(e.message_id)
        if owner is None or owner.agent_id == s.agent_id:
            space.turns[e.message_id] = Turn(e.message_id, s.agent_id, e.content)
    elif isinstance(e, MemoryAdded):
        owner_m = space.memories.get(e.memory_id)
        if owner_m is None or owner_m.agent_id == s.agent_id:
            keys = tuple(dict.fromkeys(k for k in (normalize_content(x.name) for x in e.entities) if k))
            space.memories[e.memory_id] = Memory(
                e.memory_id, s.agent_id, e.content, e.memory_type.value, e.source_message_ids, keys, seq
            )
    elif isinstance(e, MemoryLinked):
        space.links[(s.agent_id, e.link_id)] = Link(e.link_id, s.agent_id, e.from_memory_id, e.to_memory_id, e.relation.value, seq)
    elif isinstance(e, (DecisionRecorded, DecisionExpired, MemoryReflected)):
        status = "pending" if isinstance(e, DecisionRecorded) else "expired" if isinstance(e, DecisionExpired) else "reflected"
        old = space.decisions.get((s.agent_id, e.decision_id))
        if old is not None and _STATUS_RANK[old.status] > _STATUS_RANK[status]:
            status = old.status
        space.decisions[(s.agent_id, e.decision_id)] = Decision(e.decision_id, s.agent_id, e.subject, status)
        if isinstance(e, MemoryReflected):
            space.lessons[e.reflection_id] = Lesson(e.reflection_id, s.agent_id, e.subject, e.decision_id, e.content)
