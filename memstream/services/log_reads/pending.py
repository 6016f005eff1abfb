"""Pending decisions, for the console's decisions page: read from the log, because
the view does not hold them (the projector reads the memory log and the turns; a
``DecisionRecorded`` waits in the reflector's sealed state until an outcome settles it
or its deadline passes, and only then reaches the view's ledger).

One space's decisions and outcomes are read from the newest ``scan`` records of each
partition of the pending-reflections and outcomes topics, filtered on the record key
(the space) before anything is opened, then on the read's scope (team, user, and the
agent when the read is pinned) after decoding. Each decision comes with the outcomes
of its subject seen so far and, from ``match_outcome``, why each did or did not settle
it. Which of them the view has settled since is the caller's question (the ledger).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memstream.codec.wire import record_key
from memstream.domain.access import ReadScope, client_content_problem
from memstream.domain.events import DecisionRecorded, EventBase, OutcomeObserved
from memstream.domain.reflection import match_outcome
from memstream.streams.log_tail import LogTail
from memstream.settings import Settings
from memstream.streams.records.codec import read_record
from memstream.streams.sealing.sealed_records import RecordOpener
from memstream.streams.topics import Topics

__all__ = ["OutcomeSoFar", "PendingDecision", "PendingScan", "pair_outcomes", "in_scope", "read_pending"]

SCAN = 5_000
"""Records read from the end of each partition of each topic per page."""


@dataclass(frozen=True)
class OutcomeSoFar:
    outcome: OutcomeObserved
    settles: bool
    reason: str
    """``match_outcome``'s words: why it settles the decision, or why not."""


@dataclass(frozen=True)
class PendingDecision:
    decision: DecisionRecorded
    position: str
    outcomes: tuple[OutcomeSoFar, ...]

    @property
    def settled(self) -> bool:
        """An outcome covers the horizon: the reflector is writing its lesson."""
        return any(o.settles for o in self.outcomes)


@dataclass
class PendingScan:
    decisions: list[PendingDecision] = field(default_factory=list)
    truncated: bool = False
    """True when a partition holds older records than were read."""


def in_scope(event: EventBase, scope: ReadScope) -> bool:
    """The read's isolation rule on a decoded event: its space, and its agent when the
    read is pinned to one."""
    s = event.scope
    if (s.team_id, s.user_id) != (scope.team_id, scope.user_id):
        return False
    return scope.agent_id is None or s.agent_id == scope.agent_id


def pair_outcomes(
    decisions: Iterable[tuple[DecisionRecorded, str]], outcomes: Sequence[OutcomeObserved]
) -> list[PendingDecision]:
    """Each decision with the outcomes of its agent and subject that name it or no
    decision (a subject-wide outcome), judged by the reflector's own rule; soonest
    deadline first. Duplicates (the same decision or outcome id again) count once."""
    by_subject: dict[tuple[str, str], list[OutcomeObserved]] = {}  # one pass over the outcomes, not one per decision
    for o in outcomes:
        by_subject.setdefault((o.scope.agent_id, o.subject), []).append(o)
    seen: set[tuple[str, str]] = set()
    found = []
    for decision, position in decisions:
        if (decision.scope.agent_id, decision.decision_id) in seen:
            continue
        seen.add((decision.scope.agent_id, decision.decision_id))
        mine: dict[str, OutcomeSoFar] = {}
        for o in by_subject.get((decision.scope.agent_id, decision.subject), ()):
            if o.decision_id not in (None, decision.decision_id):
                continue
            verdict = match_outcome(decision, o)
            mine.setdefault(o.outcome_id, OutcomeSoFar(o, verdict.settles, verdict.reason))
        found.append(PendingDecision(decision, position, tuple(sorted(mine.values(), key=lambda x: x.outcome.occurred_at))))
    found.sort(key=lambda p: (p.decision.deadline, p.decision.decision_id))
    return found


async def read_pending(settings: Settings, tail: LogTail, keys: Any, scope: ReadScope, *, scan: int = SCAN) -> PendingScan:
    """The scope's decisions and outcomes in the log (newest ``scan`` records of each
    partition), paired. ``keys``: a started ``SubjectKeys`` (None: a plaintext log)."""
    topics = Topics.from_settings(settings.broker)
    wanted = record_key(scope)  # the record key routes by space: nothing else is opened
    found = await tail.read([topics.pending_reflections, topics.outcomes], scan, lambda r: r.key == wanted)
    events = await _open(keys, found.records)
    decisions = [(e, p) for e, p in events if isinstance(e, DecisionRecorded) and in_scope(e, scope)]
    outcomes = [e for e, _ in events if isinstance(e, OutcomeObserved) and in_scope(e, scope)]
    return PendingScan(pair_outcomes(decisions, outcomes), found.truncated)


async def _open(keys: Any, records: Sequence[Any]) -> list[tuple[EventBase, str]]:
    """Decoded events of ``records``, skipping what the reflector would never hold:
    records that do not decode or open, and client texts its quality gate refuses
    (the worker's own outcomes are the signed ones and carry no client text)."""
    opener = None
    if keys is not None:
        await keys.ensure_readable(r.value for r in records)
        opener = RecordOpener(keys.keyring)
    events = []
    for r in records:
        item = read_record(opener, r.topic, r.partition, r.offset, r.key, r.value, r.headers)
        event = getattr(item, "event", None)
        if event is None or (isinstance(event, DecisionRecorded) and client_content_problem(event) is not None):
            continue
        events.append((event, f"{r.topic}:{r.partition}:{r.offset}"))
    return events
