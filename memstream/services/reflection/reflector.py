"""The reflector's state machine, without Faust: when a decision moves on (pending,
settled, emitting, reflected, expired), testable with plain dicts. The agent
(:mod:`memstream.services.reflection.agent`) feeds events in and keeps the state in
changelog-backed tables; docs/architecture-services.md states the guarantees (never
lost, never reflected twice, duplicates are no-ops, nothing pending forever).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import StrEnum
from typing import Any

from memstream.streams.log_ids import log_id
from memstream.domain.events import (
    build_event,
    DecisionExpired,
    DecisionRecorded,
    EventBase,
    MemoryReflected,
    OutcomeObserved,
    Scope,
    parse_event,
)
from memstream.domain.reflection import (
    decision_key,
    expiry_event_id,
    match_outcome,
    reflection_id_for,
    subject_key,
)

__all__ = [
    "PRODUCER",
    "DecisionState",
    "ReflectorPolicy",
    "SettledDecision",
    "ReflectorCore",
]

log = logging.getLogger(__name__)

PRODUCER = "memstream.reflector"
"""The ``producer`` field of every event the reflector writes."""


class DecisionState(StrEnum):
    pending = "pending"
    settled = "settled"
    emitting = "emitting"
    reflected = "reflected"
    expired = "expired"

    @property
    def done(self) -> bool:
        return self in (DecisionState.reflected, DecisionState.expired)


@dataclass(frozen=True)
class ReflectorPolicy:
    """Retention of the reflector's own bookkeeping (never of a pending decision).

    ``early_outcome_ttl``: how long an outcome that settled nothing is kept for a
    decision that may still arrive. ``done_retention``: how long the marker of a
    reflected or expired decision is kept, so a late duplicate of the decision (or of
    its outcome) is recognised and ignored. ``max_early_per_subject`` bounds the
    early outcomes kept per subject (oldest dropped first).
    """

    early_outcome_ttl: timedelta = timedelta(days=30)
    done_retention: timedelta = timedelta(days=90)
    max_early_per_subject: int = 256


@dataclass(frozen=True)
class SettledDecision:
    """A decision with the outcome that settled it: the input of one reflection."""

    key: str
    partition: int
    decision: DecisionRecorded
    outcome: OutcomeObserved

    @property
    def subject_key(self) -> str:
        return subject_key(self.decision.scope, self.decision.subject)


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat()


def _parse_as(raw: Mapping[str, Any], cls: type[EventBase]) -> Any:
    event = parse_event(dict(raw))
    if not isinstance(event, cls):
        raise TypeError(f"expected {cls.__name__}, found {type(event).__name__}")
    return event


class ReflectorCore:
    """Decisions, outcomes and reflections in; state changes and due events out.

    Three mappings hold all state (JSON values, so a Faust table can changelog them):

    * ``decisions``: decision key -> entry ``{"state", "partition", "skey",
      "deadline" (epoch seconds), "decision", "outcome", "reflection" (while
      emitting), "settled_at", "done_at", "reflection_id"}``; finished entries keep
      only the marker fields;
    * ``subjects``: subject key -> keys of the open (pending or settled) decisions of
      that subject in that memory space, for subject-wide outcomes;
    * ``early``: subject key -> outcomes kept for decisions that have not arrived
      yet, each ``{"outcome", "received" (epoch seconds), "partition"}``.

    ``partition`` is the work-topic partition an event was read from; it is stored
    with each entry so periodic work (expiry, polling, retries) touches only the
    entries of the partition whose tick is being handled.

    Values are always replaced, never mutated in place: a Faust table sends a
    changelog record only on assignment.
    """

    def __init__(
        self,
        decisions: MutableMapping[str, Any],
        subjects: MutableMapping[str, Any],
        early: MutableMapping[str, Any],
        *,
        policy: ReflectorPolicy | None = None,
        subject_key: Callable[[Scope, str], str] = subject_key,
        decision_key: Callable[[Scope, str], str] = decision_key,
    ) -> None:
        self._subject_key = subject_key
        """How a subject's decisions are keyed in ``subjects`` and ``early`` (keyed by a
        hash under the subject's data key when sealing: ``sealing``)."""
        self.key_of = decision_key
        """How a decision is keyed in ``decisions`` (and listed in ``subjects``): its
        scope and id, as a keyed hash under the subject's data key when sealing."""
        self.decisions = decisions
        self.subjects = subjects
        self.early = early
        self.policy = policy or ReflectorPolicy()
        # Parsed decisions by key, checked against the stored event id: the table can
        # change under us (changelog recovery after a rebalance), the cache must not lie.
        self._parsed: dict[str, DecisionRecorded] = {}

    # ------------------------------------------------------------------ reading

    def _decision(self, key: str, entry: Mapping[str, Any]) -> DecisionRecorded:
        raw = entry["decision"]
        cached = self._parsed.get(key)
        if cached is None or str(cached.event_id) != raw.get("event_id"):
            cached = _parse_as(raw, DecisionRecorded)
            self._parsed[key] = cached
        return cached

    def entries(self, partition: int | None = None) -> list[tuple[str, Mapping[str, Any]]]:
        """``(key, entry)`` pairs, optionally of one work-topic partition only: one
        pass over the table. Periodic work takes this snapshot once and hands it to
        the readers below (``snapshot=``) instead of scanning once per question."""
        return [
            (key, entry)
            for key, entry in list(self.decisions.items())
            if entry and (partition is None or entry.get("partition") == partition)
        ]

    def state(self, key: str) -> DecisionState | None:
        entry = self.decisions.get(key)
        return DecisionState(entry["state"]) if entry else None

    def _rows(
        self, partition: int | None, snapshot: Sequence[tuple[str, Mapping[str, Any]]] | None
    ) -> Sequence[tuple[str, Mapping[str, Any]]]:
        return self.entries(partition) if snapshot is None else snapshot

    def pending(
        self,
        partition: int | None = None,
        *,
        snapshot: Sequence[tuple[str, Mapping[str, Any]]] | None = None,
    ) -> list[DecisionRecorded]:
        """Pending decisions (no outcome yet), e.g. to ask an outcome provider."""
        return [
            self._decision(key, entry)
            for key, entry in self._rows(partition, snapshot)
            if entry["state"] == DecisionState.pending
        ]

    def settled(
        self,
        partition: int | None = None,
        *,
        skip: Container[str] = (),
        snapshot: Sequence[tuple[str, Mapping[str, Any]]] | None = None,
    ) -> list[SettledDecision]:
        """Settled decisions still waiting for their reflection (minus ``skip`` keys,
        e.g. those a runner already works on, which are then not even parsed)."""
        found = []
        for key, entry in self._rows(partition, snapshot):
            if entry["state"] == DecisionState.settled and key not in skip:
                found.append(
                    SettledDecision(
                        key=key,
                        partition=int(entry["partition"]),
                        decision=self._decision(key, entry),
                        outcome=_parse_as(entry["outcome"], OutcomeObserved),
                    )
                )
        return found

    def emitting(
        self,
        partition: int | None = None,
        *,
        skip: Container[str] = (),
        snapshot: Sequence[tuple[str, Mapping[str, Any]]] | None = None,
    ) -> list[MemoryReflected]:
        """Reflections chosen but not yet confirmed in the log (see
        :meth:`begin_reflection`), minus ``skip`` keys (sends still in flight)."""
        return [
            _parse_as(entry["reflection"], MemoryReflected)
            for key, entry in self._rows(partition, snapshot)
            if entry["state"] == DecisionState.emitting and key not in skip
        ]

    def counts(self) -> dict[str, int]:
        """Entries per state, plus the early outcomes held."""
        result = {s.value: 0 for s in DecisionState}
        for _, entry in self.entries():
            result[entry["state"]] += 1
        result["early_outcomes"] = sum(len(v or ()) for v in self.early.values())
        return result

    # ------------------------------------------------------------- transitions

    def _settle(
        self, key: str, entry: Mapping[str, Any], outcome: OutcomeObserved, now: datetime
    ) -> SettledDecision:
        new = dict(entry)
        new["state"] = DecisionState.settled.value
        new["outcome"] = outcome.model_dump(mode="json")
        new["settled_at"] = _iso(now)
        self.decisions[key] = new
        decision = self._decision(key, entry)
        log.info(
            "decision %s on %s settled by outcome %s",
            log_id(decision.decision_id),
            log_id(decision.subject),
            log_id(outcome.outcome_id),
        )
        return SettledDecision(key=key, partition=int(entry["partition"]), decision=decision, outcome=outcome)

    def _index_add(self, skey: str, key: str) -> None:
        keys = list(self.subjects.get(skey) or ())
        if key not in keys:
            self.subjects[skey] = [*keys, key]

    def _index_remove(self, skey: str, key: str) -> None:
        keys = [k for k in (self.subjects.get(skey) or ()) if k != key]
        if keys:
            self.subjects[skey] = keys
        elif skey in self.subjects:
            del self.subjects[skey]

    def _remember_early(
        self, skey: str, outcome: OutcomeObserved, partition: int, now: datetime
    ) -> bool:
        held = list(self.early.get(skey) or ())
        if any(item["outcome"]["outcome_id"] == outcome.outcome_id for item in held):
            return False
        held.append(
            {
                "outcome": outcome.model_dump(mode="json"),
                "received": now.timestamp(),
                "partition": partition,
            }
        )
        self.early[skey] = held[-self.policy.max_early_per_subject :]
        return True

    def on_decision(self, event: DecisionRecorded, partition: int, now: datetime) -> list[SettledDecision]:
        """A decision arrived. A known decision id (in any state) is a duplicate and
        changes nothing. A new one becomes pending, or settled at once by an outcome
        that arrived before it (one naming it wins over a subject-wide one)."""
        key = self.key_of(event.scope, event.decision_id)
        if self.decisions.get(key):
            log.debug("duplicate decision %s ignored", event.decision_id)
            return []
        skey = self._subject_key(event.scope, event.subject)
        entry = {
            "state": DecisionState.pending.value,
            "partition": partition,
            "skey": skey,
            "deadline": event.deadline.timestamp(),
            "decision": event.model_dump(mode="json"),
            "outcome": None,
            "settled_at": None,
            "done_at": None,
            "reflection_id": None,
            "reflection": None,
        }
        self.decisions[key] = entry
        self._parsed[key] = event
        self._index_add(skey, key)
        held = list(self.early.get(skey) or ())
        best: tuple[int, OutcomeObserved] | None = None
        for index, item in enumerate(held):
            outcome = _parse_as(item["outcome"], OutcomeObserved)
            if not match_outcome(event, outcome):
                continue
            if outcome.decision_id == event.decision_id:
                best = (index, outcome)
                break
            if best is None:
                best = (index, outcome)
        if best is None:
            return []
        index, outcome = best
        if outcome.decision_id is not None:
            # An outcome naming this decision is used up; subject-wide ones stay for
            # other decisions of the subject.
            del held[index]
            if held:
                self.early[skey] = held
            else:
                del self.early[skey]
        return [self._settle(key, entry, outcome, now)]

    def on_outcome(self, event: OutcomeObserved, partition: int, now: datetime) -> list[SettledDecision]:
        """An outcome arrived: settle what it covers, keep it if it may settle a
        decision that has not arrived yet, ignore it if it is a duplicate."""
        skey = self._subject_key(event.scope, event.subject)
        if event.decision_id is not None:
            key = self.key_of(event.scope, event.decision_id)
            entry = self.decisions.get(key)
            if not entry:
                if self._remember_early(skey, event, partition, now):
                    log.info("outcome %s arrived before decision %s; kept", log_id(event.outcome_id), log_id(event.decision_id))
                return []
            if entry["state"] != DecisionState.pending:
                log.debug("outcome %s for %s decision %s ignored", event.outcome_id, entry["state"], event.decision_id)
                return []
            verdict = match_outcome(self._decision(key, entry), event)
            if not verdict:
                log.info("outcome %s does not settle %s: %s", log_id(event.outcome_id), log_id(event.decision_id), verdict.reason)
                return []
            return [self._settle(key, entry, event, now)]
        if not self._remember_early(skey, event, partition, now):
            log.debug("duplicate outcome %s ignored", event.outcome_id)
            return []
        settled = []
        for key in list(self.subjects.get(skey) or ()):
            entry = self.decisions.get(key)
            if not entry or entry["state"] != DecisionState.pending:
                continue
            if match_outcome(self._decision(key, entry), event):
                settled.append(self._settle(key, entry, event, now))
        return settled

    def accept_reflection(self, event: MemoryReflected) -> bool:
        """Whether a candidate reflection is the one to emit: its decision is settled
        (no reflection chosen yet) by that very outcome, with the derived ids."""
        key = self.key_of(event.scope, event.decision_id)
        entry = self.decisions.get(key)
        if not entry or entry["state"] != DecisionState.settled:
            return False
        if event.reflection_id != reflection_id_for(event.scope, event.decision_id):
            return False
        return bool(entry["outcome"] and entry["outcome"]["outcome_id"] == event.outcome_id)

    def begin_reflection(self, event: MemoryReflected, now: datetime) -> bool:
        """Choose ``event`` as the decision's one reflection, durably, *before* it is
        sent: the entry becomes ``emitting`` and holds the event itself. Returns False
        (and changes nothing) when the candidate is not acceptable.

        From here on only this exact event can be emitted for the decision: if the
        process dies before the send is confirmed, the restarted reflector finds the
        entry ``emitting`` and sends the stored event again (an identical record, the
        same event id), never a second, different reflection.
        """
        if not self.accept_reflection(event):
            return False
        key = self.key_of(event.scope, event.decision_id)
        entry = dict(self.decisions[key])
        entry["state"] = DecisionState.emitting.value
        entry["reflection"] = event.model_dump(mode="json")
        self.decisions[key] = entry
        return True

    def _finish(self, key: str, state: DecisionState, now: datetime, **extra: Any) -> None:
        entry = self.decisions.get(key)
        if not entry:
            return
        self.decisions[key] = {
            "state": state.value,
            "partition": entry["partition"],
            "skey": entry["skey"],
            "deadline": entry["deadline"],
            "decision": None,
            "outcome": None,
            "settled_at": entry.get("settled_at"),
            "done_at": now.timestamp(),
            "reflection_id": None,
            "reflection": None,
            **extra,
        }
        self._parsed.pop(key, None)
        self._index_remove(entry["skey"], key)

    def mark_reflected(self, event: MemoryReflected, now: datetime) -> None:
        """Record that ``event`` is in the log (call after the broker acknowledged it)."""
        key = self.key_of(event.scope, event.decision_id)
        entry = self.decisions.get(key)
        if entry and entry["state"] in (DecisionState.emitting, DecisionState.settled):
            # no reflection id in the marker: derived from the decision id, unkeyed
            self._finish(key, DecisionState.reflected, now)

    def due_expiries(
        self,
        partition: int | None,
        now: datetime,
        *,
        snapshot: Sequence[tuple[str, Mapping[str, Any]]] | None = None,
    ) -> list[DecisionExpired]:
        """``DecisionExpired`` for every pending decision whose deadline has come."""
        cutoff = now.timestamp()
        due = []
        for key, entry in self._rows(partition, snapshot):
            if entry["state"] != DecisionState.pending or entry["deadline"] > cutoff:
                continue
            decision = self._decision(key, entry)
            due.append(
                build_event(
                    DecisionExpired,
                    event_id=expiry_event_id(decision.scope, decision.decision_id),
                    occurred_at=decision.deadline,
                    recorded_at=now,
                    scope=decision.scope,
                    session_id=decision.session_id,
                    task_id=decision.task_id,
                    correlation_id=decision.decision_id,
                    producer=PRODUCER,
                    decision_id=decision.decision_id,
                    subject=decision.subject,
                    deadline=decision.deadline,
                )
            )
        return due

    def mark_expired(self, event: DecisionExpired, now: datetime) -> None:
        """Record that ``event`` is in the log (call after the broker acknowledged it)."""
        key = self.key_of(event.scope, event.decision_id)
        entry = self.decisions.get(key)
        if entry and entry["state"] == DecisionState.pending:
            self._finish(key, DecisionState.expired, now)

    def sweep(
        self,
        partition: int | None,
        now: datetime,
        *,
        snapshot: Sequence[tuple[str, Mapping[str, Any]]] | None = None,
    ) -> int:
        """Drop finished markers and early outcomes past their retention; returns how
        many were dropped. Open decisions (pending, settled, emitting) never are."""
        dropped = 0
        done_cutoff = (now - self.policy.done_retention).timestamp()
        for key, entry in self._rows(partition, snapshot):
            if DecisionState(entry["state"]).done and (entry.get("done_at") or 0) < done_cutoff:
                del self.decisions[key]
                dropped += 1
        early_cutoff = (now - self.policy.early_outcome_ttl).timestamp()
        for skey, held in list(self.early.items()):
            if not held:
                continue
            kept = [
                item
                for item in held
                if item["received"] >= early_cutoff
                or (partition is not None and item.get("partition") != partition)
            ]
            if len(kept) != len(held):
                dropped += len(held) - len(kept)
                if kept:
                    self.early[skey] = kept
                else:
                    del self.early[skey]
        return dropped
