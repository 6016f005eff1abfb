"""The reflector as Faust agents: pending decisions in changelog-backed tables, outcomes
applied over the full horizon, reflections written in the background, expiry on time.

Decisions and outcomes are re-keyed by ``team|user|subject`` into one work topic, so
the ones that must meet land on one partition (docs/architecture-services.md has the
topology and why ticks and candidates travel through that topic too). Tests inject a
clock: set :data:`clock` or pass ``clock=`` to :func:`register_reflector`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import faust

from memstream.domain.access import client_content_problem
from memstream.streams.log_ids import log_id
from memstream.domain.events import (
    DecisionRecorded,
    EventBase,
    MemoryReflected,
    OutcomeObserved,
    parse_event,
    utcnow,
)
from memstream.services.reflection.outcomes import OutcomeProvider, build_outcome_provider
from memstream.services.reflection.runner import ReflectionRunner
from memstream.services.reflection.sealing import ReflectorSeal, SealedEntries, SubjectGone
from memstream.services.reflection.writers import ReflectionWriter, build_reflection_writer
from memstream.services.reflection.reflector import ReflectorCore, ReflectorPolicy, SettledDecision
from memstream.sealing import Subject, is_sealed
from memstream.settings import Settings
from memstream.streams.records.codec import read_record, screen
from memstream.streams.dead_letters.publisher import DeadLetter, dead_letter_record, seal_dead_letter
from memstream.streams.sealing.keys import LazyKeys
from memstream.streams.sealing.sealed_records import NotAnEvent, RecordOpener, header_of, ingress_header, seal_value, subject_of
from memstream.codec.wire import encode_event
from memstream.streams.topics import Topics
from memstream.streams.trust.worker_identity import signed_headers, verifier, worker_key

__all__ = [
    "clock",
    "WORK_TOPIC_SUFFIX",
    "WORK_RETENTION",
    "ReflectorHandle",
    "work_topic_name",
    "state_topics",
    "register_reflector",
]

log = logging.getLogger(__name__)

clock: Callable[[], datetime] = utcnow
"""The reflector's "now" (a hook for tests); read at call time, so reassigning it
affects apps that are already running."""

WORK_TOPIC_SUFFIX = "reflector-work"
WORK_RETENTION = timedelta(days=30)
"""The work topic only carries records between the forwarders and the reflector (the
inputs stay forever in their own topics and the state in the compacted changelogs),
so it need not be kept forever; 30 days covers any realistic outage of the reflector."""

_TICK_KEY = b"__tick__"
_UNSET: Any = object()


def work_topic_name(settings: Settings) -> str:
    """``<app_id>-reflector-work``: named like Faust's own internal topics."""
    return f"{settings.worker.app_id}-{WORK_TOPIC_SUFFIX}"


TABLE_NAMES = ("reflector-decisions", "reflector-subjects", "reflector-early-outcomes")


def state_topics(settings: Settings) -> list[str]:
    """Every topic holding the reflector's state: its work topic and the changelogs
    of its tables (Faust names them ``<app_id>-<table>-changelog``)."""
    return [work_topic_name(settings), *(f"{settings.worker.app_id}-{name}-changelog" for name in TABLE_NAMES)]


@dataclass
class ReflectorHandle:
    """What ``register_reflector`` wired up, for introspection (tests, bench, CLI)."""

    core: ReflectorCore
    runner: ReflectionRunner
    writer: ReflectionWriter
    provider: OutcomeProvider | None
    work_topic: str
    stats: dict[str, int] = field(default_factory=dict)

    def bump(self, name: str, by: int = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + by


class _Reflector:
    """The reflector's topics, tables and state, and what its agents do with a record.

    ``register_reflector`` builds one per app and wires its methods to Faust agents and
    a timer; everything here runs inside the app's event loop."""

    def __init__(
        self,
        app: faust.App,
        settings: Settings,
        topics: Topics,
        *,
        writer: ReflectionWriter,
        provider: OutcomeProvider | None,
        policy: ReflectorPolicy | None,
        concurrency: int,
        clock: Callable[[], datetime] | None,
    ) -> None:
        self.provider = provider
        self._clock = clock
        self.partitions = topics.partitions
        self.work = app.topic(
            work_topic_name(settings),
            partitions=self.partitions,
            replicas=settings.broker.replication_factor,
            internal=True,
            retention=WORK_RETENTION,
            key_serializer="raw",
            value_serializer="json",
        )
        self.pending_in = app.topic(topics.pending_reflections, key_serializer="raw", value_serializer="raw")
        self.outcomes = app.topic(topics.outcomes, key_serializer="raw", value_serializer="raw")
        self.events_out = app.topic(topics.events, key_serializer="raw", value_serializer="raw")
        self.dead_out = app.topic(topics.dead_letter, key_serializer="raw", value_serializer="raw")
        self.seal = ReflectorSeal()
        decisions, subjects, early = self._tables(app)
        self.decisions = SealedEntries(decisions, self.seal, "decision")
        self.early = SealedEntries(early, self.seal, "early")
        self.core = ReflectorCore(
            self.decisions, subjects, self.early, policy=policy,
            subject_key=self.seal.subject_key, decision_key=self.seal.decision_key,
        )
        self.signing_key = worker_key(settings.resolved_worker_key_file)  # its events are system events: signed
        self.verify = verifier(self.signing_key)
        self.keyring = LazyKeys(settings.streams, topics, client_id=f"{settings.worker.app_id}-reflector-keys")
        # Reflections whose send is not confirmed yet: key -> (partition, event). The
        # entry is durably "emitting" meanwhile. The ack's callback queues the key on its
        # partition's list; the next record handled on that partition (stream iteration,
        # where tables may change) marks it reflected, so the stream never waits on acks.
        self.emits: dict[str, tuple[int, MemoryReflected]] = {}
        self.acked: dict[int, list[tuple[str, BaseException | None]]] = {}
        self.runner = ReflectionRunner(writer, self.deliver, concurrency=concurrency, clock=self.now)
        self.handle = ReflectorHandle(
            core=self.core,
            runner=self.runner,
            writer=writer,
            provider=provider,
            work_topic=self.work.get_topic_name(),
        )

    def _tables(self, app: faust.App) -> tuple[Any, Any, Any]:
        decisions = app.Table(
            TABLE_NAMES[0],
            partitions=self.partitions,
            help="decision key -> reflector state (pending, settled, emitting, reflected, expired)",
        )
        subjects = app.Table(
            TABLE_NAMES[1],
            partitions=self.partitions,
            help="space|subject -> keys of its open decisions",
        )
        early = app.Table(
            TABLE_NAMES[2],
            partitions=self.partitions,
            help="space|subject -> outcomes waiting for a decision",
        )
        return decisions, subjects, early

    def now(self) -> datetime:
        return (self._clock or _module_clock())()

    async def sealing(self) -> None:
        """Start the keyring (sealing on) and hand it to the seal, once."""
        if self.seal.keys is None:
            keys = await self.keyring.get()
            if keys is not None and self.seal.keys is None:
                keys.on_forget(lambda _subject: self.seal.forget_cache())
                self.seal.keys = keys

    async def key_for_plaintext(self, keys: Any, value: bytes | None) -> None:
        """A plaintext input (a log from before sealing) whose subject has no key yet
        gets one, so that its state can be sealed; never a subject seen forgotten."""
        try:
            header = ingress_header(value)
        except NotAnEvent:
            return  # not an event: dead-lettered below
        subject = Subject(header.team_id, header.user_id)
        ring = keys.keyring
        if ring.key_for(subject) is None and subject not in ring.forgotten_subjects(subject.team_id, subject.user_id):
            await keys.key_for(subject)

    async def send_event(self, topic: Any, event: EventBase) -> Any:
        """Hand ``event`` to the producer (sealed, then signed); returns the future of
        the broker's ack. Raises :class:`SubjectGone` when the subject holds no key:
        what the reflector writes comes from what it kept of the subject, which must
        never be sealed under a key made after a forget."""
        record = encode_event(event)
        value = record.value
        await self.sealing()
        if self.seal.keys is not None:
            assert self.seal.keys.keyring is not None
            key = self.seal.keys.keyring.key_for(subject_of(event.scope))
            if key is None:
                raise SubjectGone(str(subject_of(event.scope)))
            value = seal_value(key, header_of(event), value)
        headers = signed_headers(self.signing_key, value, record.headers)
        return await topic.send(key=record.key, value=value, headers=headers, force=True)

    async def send_all(self, topic: Any, events: list[Any]) -> None:
        """Send a batch and wait for every acknowledgement (one round trip, not N);
        events of a forgotten subject are not sent."""
        futures = []
        for e in events:
            try:
                futures.append(await self.send_event(topic, e))
            except SubjectGone:
                self.handle.bump("forgotten")
        if futures:
            await asyncio.gather(*futures)

    async def emit_reflection(self, event: MemoryReflected, partition: int) -> None:
        try:
            key = self.core.key_of(event.scope, event.decision_id)
            future = await self.send_event(self.events_out, event)
        except SubjectGone:  # forgotten after it was chosen: never written
            self.runner.forget_subject(event.scope)
            self.handle.bump("forgotten")
            return
        self.emits[key] = (partition, event)

        def on_done(fut: Any) -> None:
            error = asyncio.CancelledError() if fut.cancelled() else fut.exception()
            self.acked.setdefault(partition, []).append((key, error))

        future.add_done_callback(on_done)
        self.handle.bump("emitted")

    def confirm_emits(self, partition: int, moment: datetime) -> None:
        done = self.acked.pop(partition, None)
        for key, error in done or ():
            item = self.emits.pop(key, None)
            if item is None:
                continue
            event = item[1]
            if error is not None:
                # Still "emitting" in the table: the next tick sends the stored event again.
                log.warning("sending the reflection of %s failed: %s", log_id(event.decision_id), error)
                self.handle.bump("emit_failures")
                continue
            self.core.mark_reflected(event, moment)
            self.runner.finished(key)
            self.handle.bump("reflected")
            log.info("decision %s on %s reflected", log_id(event.decision_id), log_id(event.subject))

    async def deliver(self, reflection: MemoryReflected, settled: SettledDecision) -> None:
        """The runner's finished reflection goes back through the work topic as a candidate."""
        await self.sealing()
        scope = settled.decision.scope
        try:
            key = self.seal.subject_key(scope, settled.decision.subject)
            value = self.seal.work_value("reflection", reflection.model_dump(mode="json"), scope)
        except SubjectGone:  # forgotten while the reflection was written: dropped
            self.handle.bump("forgotten")
            return
        pending = await self.work.send(key=key.encode("utf-8"), value=value, force=True)
        await pending

    async def dead_letter(self, item: DeadLetter) -> None:
        keys = await self.keyring.get()
        if keys is not None:  # never the plaintext of a sealed record
            item = await seal_dead_letter(item, keys)
        record = dead_letter_record(item)
        pending = await self.dead_out.send(key=record.key, value=record.value, headers=record.headers, force=True)
        await pending
        self.handle.bump("dead_letters")

    async def forward(self, stream: Any) -> None:
        """Decode input records and re-key them by space|subject into the work topic."""
        async for event in stream.events():
            message = event.message
            value, headers = message.value, message.headers
            keys = await self.keyring.get()
            opener = None
            if keys is not None:
                await keys.prepare([(value, headers)])
                opener = RecordOpener(keys.keyring)
                if not is_sealed(value) and message.key and screen(message.key, headers) is None:
                    await self.key_for_plaintext(keys, value)  # plaintext (a log from before sealing)
            item = read_record(opener, message.topic, message.partition, message.offset, message.key, value, headers)
            if item is None:  # a forgotten subject's decision or outcome
                self.handle.bump("unreadable")
                continue
            if isinstance(item, DeadLetter):
                await self.dead_letter(item)
                continue
            decoded = item.event
            kind = _input_kind(decoded)
            if kind is None:
                await self.dead_letter(_unexpected(decoded, message))
                continue
            problem = client_content_problem(decoded)  # the worker's own outcomes are signed
            if problem is not None and not self.verify(message.value, message.headers):
                await self.dead_letter(_refused(f"a client text refused by the quality gate: {problem}", message))
                continue
            await self.sealing()
            try:
                key = self.seal.subject_key(decoded.scope, decoded.subject)
                work = self.seal.work_value(kind, decoded.model_dump(mode="json"), decoded.scope)
            except SubjectGone:  # forgotten since it was opened
                self.handle.bump("unreadable")
                continue
            await self.work.send(key=key.encode("utf-8"), value=work, force=True)
            self.handle.bump(f"forwarded_{kind}s")

    async def poll_provider(self, partition: int, moment: datetime, snapshot: Any) -> Any:
        """Ask the outcome provider about this partition's pending decisions; returns
        the entries to go on with (read again when outcomes arrived)."""
        pending = self.core.pending(partition, snapshot=snapshot)
        if self.provider is None or not pending:
            return snapshot
        try:
            found = await self.provider.resolve(pending, moment)
        except Exception as exc:  # noqa: BLE001 - a broken provider must not stop expiry
            log.warning("outcome provider %s failed: %s", self.provider.name, exc)
            found = []
        await self.send_all(self.outcomes, found)  # each outcome is a fact in the log first
        for outcome in found:
            for settled in self.core.on_outcome(outcome, partition, moment):
                self.runner.submit(settled)
        self.handle.bump("provider_outcomes", len(found))
        return self.core.entries(partition) if found else snapshot

    async def on_tick(self, partition: int, moment: datetime) -> None:
        snapshot = self.core.entries(partition)  # one pass over the table per tick
        if self.provider is not None:
            snapshot = await self.poll_provider(partition, moment, snapshot)
        expired = self.core.due_expiries(partition, moment, snapshot=snapshot)
        await self.send_all(self.events_out, expired)
        for event in expired:
            self.core.mark_expired(event, moment)
            self.handle.bump("expired")
            log.info("decision %s on %s expired at %s", log_id(event.decision_id), log_id(event.subject), event.deadline)
        for event in self.core.emitting(partition, skip=self.emits, snapshot=snapshot):
            await self.emit_reflection(event, partition)  # chosen before a restart: send it again
        for settled in self.core.settled(partition, skip=self.runner.in_flight, snapshot=snapshot):
            self.runner.submit(settled)
        self.core.sweep(partition, moment, snapshot=snapshot)
        self.drop_forgotten(partition)
        self.handle.bump("ticks")

    def drop_forgotten(self, partition: int) -> None:
        """Delete this partition's entries that no longer open (their subject was
        forgotten), so the changelogs compact them away."""
        for entries in (self.decisions, self.early):
            for key in entries.take_unreadable(partition):
                if key in entries.table:
                    del entries.table[key]
                    self.handle.bump("forgotten_entries")

    async def handle_work(self, value: Any, partition: int) -> None:
        kind = value.get("kind") if isinstance(value, dict) else None
        moment = self.now()
        self.confirm_emits(partition, moment)
        await self.sealing()
        if kind == "tick":
            await self.on_tick(partition, datetime.fromisoformat(value["now"]))
            return
        event = parse_event(self.seal.work_event(value))
        if kind == "decision" and isinstance(event, DecisionRecorded):
            for settled in self.core.on_decision(event, partition, moment):
                self.runner.submit(settled)
        elif kind == "outcome" and isinstance(event, OutcomeObserved):
            for settled in self.core.on_outcome(event, partition, moment):
                self.runner.submit(settled)
        elif kind == "reflection" and isinstance(event, MemoryReflected):
            if self.core.begin_reflection(event, moment):
                await self.emit_reflection(event, partition)
            else:
                self.runner.finished(self.core.key_of(event.scope, event.decision_id))
                self.handle.bump("candidates_dropped")
        else:
            raise ValueError(f"unknown work record kind {kind!r}")

    async def run(self, stream: Any) -> None:
        """The reflector agent's body: one work record at a time, in partition order."""
        try:
            async for event in stream.events():
                try:
                    await self.handle_work(event.value, event.message.partition)
                except SubjectGone:  # its subject was forgotten: nothing of it is kept
                    self.handle.bump("forgotten")
                except Exception:  # noqa: BLE001 - one bad record must not stop the reflector
                    # The state is unchanged by a failed step; ticks retry expiries and
                    # resubmit settled decisions, so nothing is lost by moving on.
                    self.handle.bump("errors")
                    log.exception("reflector failed on a %s record", _kind_of(event.value))
        finally:
            await self.runner.stop()
            await self.keyring.stop()

    async def tick(self) -> None:
        """One tick per partition, all carrying the leader's "now"."""
        moment = self.now().isoformat()
        for partition in range(self.partitions):
            await self.work.send(key=_TICK_KEY, value={"kind": "tick", "now": moment}, partition=partition, force=True)


def _input_kind(event: EventBase) -> str | None:
    if isinstance(event, DecisionRecorded):
        return "decision"
    if isinstance(event, OutcomeObserved):
        return "outcome"
    return None


def _unexpected(event: EventBase, message: Any) -> DeadLetter:
    return _refused(
        f"unexpected {event.type} on {message.topic}: the reflector reads DecisionRecorded and OutcomeObserved only",
        message,
    )


def _refused(reason: str, message: Any) -> DeadLetter:
    return DeadLetter(
        reason=reason,
        source_topic=message.topic,
        source_partition=message.partition,
        source_offset=message.offset,
        original_value=message.value,
        original_key=message.key,
        original_headers=tuple(message.headers or ()),
        stage="reflect",
    )


def register_reflector(
    app: faust.App,
    settings: Settings,
    topics: Topics,
    *,
    writer: ReflectionWriter | None = None,
    provider: OutcomeProvider | None = _UNSET,
    policy: ReflectorPolicy | None = None,
    concurrency: int = 4,
    clock: Callable[[], datetime] | None = None,
) -> ReflectorHandle:
    """Add the reflector's tables, agents and timer to ``app``.

    ``writer`` defaults to the LLM writer when ``settings.extraction.llm_*`` configure an LLM,
    else the templated one; ``provider`` defaults to the price-file provider when
    ``settings.worker.outcome_prices_path`` is set (pass ``None`` to disable polling).
    """
    reflector = _Reflector(
        app,
        settings,
        topics,
        writer=writer or build_reflection_writer(settings),
        provider=build_outcome_provider(settings) if provider is _UNSET else provider,
        policy=policy,
        concurrency=concurrency,
        clock=clock,
    )

    @app.agent(reflector.pending_in, name="memstream.reflector.forward-decisions")
    async def forward_decisions(stream: Any) -> None:
        await reflector.forward(stream)

    @app.agent(reflector.outcomes, name="memstream.reflector.forward-outcomes")
    async def forward_outcomes(stream: Any) -> None:
        await reflector.forward(stream)

    @app.agent(reflector.work, name="memstream.reflector")
    async def reflect(stream: Any) -> None:
        await reflector.run(stream)

    @app.timer(settings.worker.reflection_poll_seconds, on_leader=True)
    async def tick() -> None:
        await reflector.tick()

    app.reflector = reflector.handle  # type: ignore[attr-defined]
    return reflector.handle


def _module_clock() -> Callable[[], datetime]:
    return clock


def _kind_of(value: Any) -> str:
    return str(value.get("kind")) if isinstance(value, dict) else type(value).__name__
