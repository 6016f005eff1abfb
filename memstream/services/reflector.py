"""The reflector's state machine, reflection writers and retry runner, without Faust.

Why split from the Faust agent (:mod:`memstream.services.reflector_agent`): the rules
for *when* a decision moves on live here and in :mod:`memstream.domain.reflection`,
and they must be testable with plain dicts. The agent only feeds events in, sends
what this module asks it to send, and keeps the state in changelog-backed Faust tables
(any ``MutableMapping`` of JSON values works here).

Per decision (keyed by :func:`~memstream.domain.reflection.decision_key`: memory space
plus decision id, since ids are unique per space, not across tenants)::

    pending --outcome covering the horizon--> settled --first candidate--> emitting
       |                                                                      |
       |                                                 send confirmed       v
       +--deadline passed, no outcome--> expired                          reflected

``settled`` is "pending with outcome": it is durable (in the table) before any LLM
call starts. "Reflecting" (the LLM call) is deliberately *not* durable: it is the
in-flight set of the :class:`ReflectionRunner` of one process, so a crash forgets it
and the settled decision is picked up again after the restart. The guarantees:

* **Never lost.** A settled decision stays settled until a reflection is chosen;
  LLM failures are retried with exponential backoff (capped), without end. A chosen
  reflection is stored in the entry (``emitting``) *before* it is sent, and the entry
  becomes ``reflected`` only once the broker confirmed the send; an unconfirmed one is
  sent again.
* **Never reflected twice.** The runner never emits a reflection itself: it hands a
  *candidate* ``MemoryReflected`` back through the reflector's ordered work topic.
  The first candidate for a settled decision is chosen
  (:meth:`ReflectorCore.begin_reflection`); a later candidate finds the decision
  ``emitting`` or ``reflected`` and is dropped. After a crash only the stored, chosen
  event can be sent again: the same bytes and the same event id (and reflection ids
  derive from the decision), which every reader already treats as one event.
* **Duplicates are no-ops.** The same decision id twice is one decision; the same
  outcome twice settles once; an outcome that arrives before its decision waits in
  the early-outcome table and is applied when the decision arrives.
* **Nothing pending forever.** A pending decision expires at its deadline
  (``DecisionExpired``, :meth:`ReflectorCore.due_expiries`); early outcomes and the
  markers of finished decisions are dropped after a retention period
  (:class:`ReflectorPolicy`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Container, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import StrEnum
from typing import Any, Protocol

from memstream.domain.events import (
    DecisionExpired,
    DecisionRecorded,
    EventBase,
    MemoryReflected,
    OutcomeObserved,
    Provenance,
    parse_event,
    utcnow,
)
from memstream.domain.prompts import PromptLibrary
from memstream.domain.reflection import (
    REFLECTION_ANSWER_SCHEMA,
    decision_key,
    direction_correct,
    expiry_event_id,
    match_outcome,
    parse_reflection_answer,
    performance,
    reflection_event_id,
    reflection_id_for,
    reflection_prompt_fields,
    subject_key,
    templated_reflection,
)
from memstream.llm import ChatModel, LLMError, build_llm, call_with_retry
from memstream.settings import Settings

__all__ = [
    "PRODUCER",
    "DecisionState",
    "ReflectorPolicy",
    "SettledDecision",
    "ReflectorCore",
    "REFLECTION_PROMPT_ID",
    "TEMPLATE_PROMPT_ID",
    "TEMPLATE_VERSION",
    "build_reflection_writer",
    "ReflectionWriter",
    "TemplateReflectionWriter",
    "LLMReflectionWriter",
    "build_reflection",
    "Backoff",
    "ReflectionRunner",
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
    ) -> None:
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

    def state_of(self, decision: DecisionRecorded | DecisionExpired | MemoryReflected) -> DecisionState | None:
        return self.state(decision_key(decision.scope, decision.decision_id))

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
            decision.decision_id,
            decision.subject,
            outcome.outcome_id,
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
        key = decision_key(event.scope, event.decision_id)
        if self.decisions.get(key):
            log.debug("duplicate decision %s ignored", event.decision_id)
            return []
        skey = subject_key(event.scope, event.subject)
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
        skey = subject_key(event.scope, event.subject)
        if event.decision_id is not None:
            key = decision_key(event.scope, event.decision_id)
            entry = self.decisions.get(key)
            if not entry:
                if self._remember_early(skey, event, partition, now):
                    log.info("outcome %s arrived before decision %s; kept", event.outcome_id, event.decision_id)
                return []
            if entry["state"] != DecisionState.pending:
                log.debug("outcome %s for %s decision %s ignored", event.outcome_id, entry["state"], event.decision_id)
                return []
            verdict = match_outcome(self._decision(key, entry), event)
            if not verdict:
                log.info("outcome %s does not settle %s: %s", event.outcome_id, event.decision_id, verdict.reason)
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
        key = decision_key(event.scope, event.decision_id)
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
        key = decision_key(event.scope, event.decision_id)
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
        key = decision_key(event.scope, event.decision_id)
        entry = self.decisions.get(key)
        if entry and entry["state"] in (DecisionState.emitting, DecisionState.settled):
            self._finish(key, DecisionState.reflected, now, reflection_id=event.reflection_id)

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
                DecisionExpired(
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
        key = decision_key(event.scope, event.decision_id)
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


# ------------------------------------------------------------------- reflections


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
    return MemoryReflected(
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
    retries the decision later; within one attempt :func:`memstream.llm.call_with_retry`
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
    """The LLM writer when an LLM endpoint is configured (``MEMSTREAM_LLM_BASE_URL``),
    else the templated one."""
    client = build_llm(settings)
    if client is None:
        return TemplateReflectionWriter()
    return LLMReflectionWriter(
        client, prompts=PromptLibrary(settings.prompts_dir), retries=settings.llm_max_retries
    )


# ------------------------------------------------------------------------ runner


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: ``initial * factor**(attempt-1)``, capped."""

    initial: float = 1.0
    factor: float = 2.0
    maximum: float = 300.0
    jitter: float = 0.1

    def delay(self, attempt: int) -> float:
        base = min(self.maximum, self.initial * self.factor ** max(attempt - 1, 0))
        return base * (1.0 + random.uniform(-self.jitter, self.jitter))


Deliver = Callable[[MemoryReflected, SettledDecision], Awaitable[None]]


class ReflectionRunner:
    """Writes reflections in the background, a few at a time, retrying failures.

    ``submit`` is cheap and idempotent: a decision that is queued, being written,
    waiting for a retry, or delivered and not yet confirmed is not queued again. Each
    finished reflection goes to ``deliver`` (the agent sends it through the work
    topic); the agent calls :meth:`finished` once the decision left the settled state.
    A delivered decision that was never confirmed (its partition moved to another
    worker, say) becomes eligible again after ``redeliver_after`` seconds; the state
    machine drops the extra candidate if the first one made it after all.

    A writer or delivery failure is retried after :class:`Backoff` without holding a
    worker, so one failing decision never blocks the others.
    """

    def __init__(
        self,
        writer: ReflectionWriter,
        deliver: Deliver,
        *,
        concurrency: int = 4,
        backoff: Backoff | None = None,
        clock: Callable[[], datetime] = utcnow,
        redeliver_after: float = 600.0,
    ) -> None:
        self.writer = writer
        self.deliver = deliver
        self.concurrency = max(1, concurrency)
        self.backoff = backoff or Backoff()
        self.clock = clock
        self.redeliver_after = redeliver_after
        self.attempts: dict[str, int] = {}
        self.delivered = 0
        self.failures = 0
        # key -> monotonic time it was delivered (None while queued or being written)
        self._tracked: dict[str, float | None] = {}
        self._queue: asyncio.Queue[SettledDecision] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._timers: set[asyncio.TimerHandle] = set()

    @property
    def running(self) -> bool:
        return bool(self._workers)

    @property
    def in_flight(self) -> frozenset[str]:
        """Keys queued, being written, waiting for a retry or awaiting confirmation."""
        return frozenset(self._tracked)

    def start(self) -> None:
        """Start the workers on the running loop (no-op when running)."""
        if self._workers:
            return
        self._queue = asyncio.Queue()
        self._workers = [
            asyncio.create_task(self._work(), name=f"reflection-writer-{i}")
            for i in range(self.concurrency)
        ]

    async def stop(self) -> None:
        """Cancel the workers and pending retries; queued work is forgotten (the
        decisions stay settled in the table and are submitted again after a restart)."""
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
        workers, self._workers = self._workers, []
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        self._tracked.clear()
        self._queue = None

    def submit(self, settled: SettledDecision) -> bool:
        """Queue a reflection unless one for this decision is already under way."""
        if settled.key in self._tracked:
            delivered_at = self._tracked[settled.key]
            if delivered_at is None or time.monotonic() - delivered_at < self.redeliver_after:
                return False
        self.start()
        assert self._queue is not None
        self._tracked[settled.key] = None
        self._queue.put_nowait(settled)
        return True

    def finished(self, key: str) -> None:
        """The decision is reflected (or no longer ours): stop tracking it."""
        self._tracked.pop(key, None)
        self.attempts.pop(key, None)

    def _requeue(self, settled: SettledDecision, box: list[asyncio.TimerHandle]) -> None:
        for handle in box:
            self._timers.discard(handle)
        if self._queue is not None and settled.key in self._tracked:
            self._queue.put_nowait(settled)

    async def _work(self) -> None:
        assert self._queue is not None
        queue = self._queue
        while True:
            settled = await queue.get()
            try:
                reflection = await self.writer.write(settled, self.clock())
                await self.deliver(reflection, settled)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure means "retry later"
                self.failures += 1
                attempt = self.attempts.get(settled.key, 0) + 1
                self.attempts[settled.key] = attempt
                delay = self.backoff.delay(attempt)
                log.warning(
                    "reflection of decision %s failed (attempt %d, retry in %.1fs): %s: %s",
                    settled.decision.decision_id,
                    attempt,
                    delay,
                    type(exc).__name__,
                    " ".join(str(exc).split())[:300],
                )
                box: list[asyncio.TimerHandle] = []
                handle = asyncio.get_running_loop().call_later(delay, self._requeue, settled, box)
                box.append(handle)
                self._timers.add(handle)
            else:
                self.delivered += 1
                if settled.key in self._tracked:
                    self._tracked[settled.key] = time.monotonic()
