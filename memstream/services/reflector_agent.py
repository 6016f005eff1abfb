"""The reflector as Faust agents: pending decisions in changelog-backed tables, outcomes
applied over the full horizon, reflections written in the background, expiry on time.

Topology (``register_reflector``)::

    <prefix>pending-reflections --forward--+
                                           +--> <app_id>-reflector-work --> reflector agent
    <prefix>outcomes -----------forward----+      (keyed by space|subject)     |  tables:
                                                  ^        ^                    |  decisions,
                   timer (leader): one tick ------+        |                    |  subjects,
                   per partition                           |                    |  early outcomes
                   reflection runner: candidate -----------+                    v
                                                             <prefix>events: MemoryReflected,
                                                             DecisionExpired; <prefix>outcomes:
                                                             outcomes from the provider

Why a work topic: a decision (keyed by its memory space on the input topic) and the
outcome that settles it (keyed by whoever produced it) must meet on one partition,
because a Faust table's changelog is partitioned like the stream that writes it. The
forwarders re-key both by ``team|user|subject`` into the work topic, so a subject's
decisions and outcomes of one space are processed in order by one agent instance, and
the tables are co-partitioned with it.

Why ticks and candidates travel through the work topic too: Faust tables can only be
changed while an event of their source stream is being processed ("Cannot modify
table key from outside of stream iteration"). The leader's timer therefore sends one
tick per partition; handling it (expiry, provider polling, resubmitting settled
decisions, retention sweep) happens inside stream iteration. The background
:class:`~memstream.services.reflector.ReflectionRunner` (LLM calls never block the
stream) sends each finished reflection back as a candidate; the agent stores the first
candidate of a settled decision in its entry (``emitting``), sends it, and marks the
decision reflected once the broker's ack is in (checked when the next record of that
partition is handled, so the stream never stalls on an ack; batches of expiries and
provider outcomes are sent together and their acks awaited once). See
:mod:`memstream.services.reflector` for the guarantees this gives.

Tests inject a clock: set :data:`clock` (module level) or pass ``clock=`` to
:func:`register_reflector`; ticks carry the time the leader read, so every partition
judges deadlines against the same "now".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import faust

from memstream.domain.events import (
    DecisionRecorded,
    EventBase,
    MemoryReflected,
    OutcomeObserved,
    parse_event,
    utcnow,
)
from memstream.domain.reflection import decision_key, subject_key
from memstream.services.outcomes import OutcomeProvider, build_outcome_provider
from memstream.services.reflector import (
    ReflectionRunner,
    ReflectionWriter,
    ReflectorCore,
    ReflectorPolicy,
    SettledDecision,
    build_reflection_writer,
)
from memstream.settings import Settings
from memstream.sealing import TamperedRecord
from memstream.streams.consumer import decode_or_dead_letter
from memstream.streams.deadletter import DeadLetter, dead_letter_record
from memstream.streams.keys import LazyKeys
from memstream.streams.sealed_records import RecordOpener, header_of, seal_value, subject_of
from memstream.streams.serializer import encode_event
from memstream.streams.topics import Topics
from memstream.streams.worker_identity import signed_headers, worker_key

__all__ = [
    "clock",
    "WORK_TOPIC_SUFFIX",
    "WORK_RETENTION",
    "ReflectorHandle",
    "work_topic_name",
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
    return f"{settings.app_id}-{WORK_TOPIC_SUFFIX}"


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

    ``writer`` defaults to the LLM writer when ``settings.llm_*`` configure an LLM,
    else the templated one; ``provider`` defaults to the price-file provider when
    ``settings.outcome_prices_path`` is set (pass ``None`` to disable polling).
    """
    the_writer = writer or build_reflection_writer(settings)
    the_provider = build_outcome_provider(settings) if provider is _UNSET else provider
    own_clock = clock

    def now() -> datetime:
        return (own_clock or _module_clock())()

    partitions = topics.partitions
    work = app.topic(
        work_topic_name(settings),
        partitions=partitions,
        replicas=settings.replication_factor,
        internal=True,
        retention=WORK_RETENTION,
        key_serializer="raw",
        value_serializer="json",
    )
    pending_in = app.topic(topics.pending_reflections, key_serializer="raw", value_serializer="raw")
    outcomes_topic = app.topic(topics.outcomes, key_serializer="raw", value_serializer="raw")
    events_out = app.topic(topics.events, key_serializer="raw", value_serializer="raw")
    dead_out = app.topic(topics.dead_letter, key_serializer="raw", value_serializer="raw")

    decisions = app.Table(
        "reflector-decisions",
        partitions=partitions,
        help="decision key -> reflector state (pending, settled, emitting, reflected, expired)",
    )
    subjects = app.Table(
        "reflector-subjects",
        partitions=partitions,
        help="space|subject -> keys of its open decisions",
    )
    early = app.Table(
        "reflector-early-outcomes",
        partitions=partitions,
        help="space|subject -> outcomes waiting for a decision",
    )
    core = ReflectorCore(decisions, subjects, early, policy=policy)
    signing_key = worker_key(settings)  # its events are system events: signed
    keyring = LazyKeys(settings, topics, client_id=f"{settings.app_id}-reflector-keys")

    async def send_event(topic: Any, event: EventBase) -> Any:
        """Hand ``event`` to the producer (sealed, then signed); returns the future of
        the broker's ack."""
        record = encode_event(event)
        value = record.value
        keys = await keyring.get()
        if keys is not None:
            key = await keys.key_for(subject_of(event.scope))
            value = seal_value(key, header_of(event), value)
        headers = signed_headers(signing_key, value, record.headers)
        return await topic.send(key=record.key, value=value, headers=headers, force=True)

    async def send_all(topic: Any, events: list[Any]) -> None:
        """Send a batch and wait for every acknowledgement (one round trip, not N)."""
        futures = [await send_event(topic, e) for e in events]
        if futures:
            await asyncio.gather(*futures)

    # Reflections whose send is not confirmed yet: key -> (partition, event). The entry
    # is durably "emitting" meanwhile. The ack's callback queues the key on its
    # partition's list; the next record handled on that partition (stream iteration,
    # where tables may change) marks it reflected, so the stream never waits on acks.
    emits: dict[str, tuple[int, MemoryReflected]] = {}
    acked: dict[int, list[tuple[str, BaseException | None]]] = {}

    async def emit_reflection(event: MemoryReflected, partition: int) -> None:
        key = decision_key(event.scope, event.decision_id)
        emits[key] = (partition, event)
        future = await send_event(events_out, event)

        def on_done(fut: Any) -> None:
            error = asyncio.CancelledError() if fut.cancelled() else fut.exception()
            acked.setdefault(partition, []).append((key, error))

        future.add_done_callback(on_done)
        handle.bump("emitted")

    def confirm_emits(partition: int, moment: datetime) -> None:
        done = acked.pop(partition, None)
        for key, error in done or ():
            item = emits.pop(key, None)
            if item is None:
                continue
            event = item[1]
            if error is not None:
                # Still "emitting" in the table: the next tick sends the stored event again.
                log.warning("sending the reflection of %s failed: %s", event.decision_id, error)
                handle.bump("emit_failures")
                continue
            core.mark_reflected(event, moment)
            runner.finished(key)
            handle.bump("reflected")
            log.info("decision %s on %s reflected", event.decision_id, event.subject)

    async def deliver(reflection: MemoryReflected, settled: SettledDecision) -> None:
        pending = await work.send(
            key=settled.subject_key.encode("utf-8"),
            value={"kind": "reflection", "event": reflection.model_dump(mode="json")},
            force=True,
        )
        await pending

    runner = ReflectionRunner(the_writer, deliver, concurrency=concurrency, clock=now)
    handle = ReflectorHandle(
        core=core,
        runner=runner,
        writer=the_writer,
        provider=the_provider,
        work_topic=work.get_topic_name(),
    )

    async def dead_letter(item: DeadLetter) -> None:
        record = dead_letter_record(item)
        pending = await dead_out.send(
            key=record.key, value=record.value, headers=record.headers, force=True
        )
        await pending
        handle.bump("dead_letters")

    async def forward(stream: Any) -> None:
        """Decode input records and re-key them by space|subject into the work topic."""
        async for event in stream.events():
            message = event.message
            value, headers = message.value, message.headers
            keys = await keyring.get()
            if keys is not None:
                await keys.prepare([(value, headers)])
                try:
                    opened = RecordOpener(keys.keyring).open(value, headers)
                except TamperedRecord:
                    opened = None  # not the reflector's to judge: skipped
                if opened is None:  # a forgotten subject's decision or outcome
                    handle.bump("unreadable")
                    continue
                value, headers = opened
            item = decode_or_dead_letter(
                message.topic,
                message.partition,
                message.offset,
                message.key,
                value,
                headers,
            )
            if isinstance(item, DeadLetter):
                await dead_letter(item)
                continue
            decoded = item.event
            if isinstance(decoded, DecisionRecorded):
                kind = "decision"
            elif isinstance(decoded, OutcomeObserved):
                kind = "outcome"
            else:
                await dead_letter(
                    DeadLetter(
                        reason=(
                            f"unexpected {decoded.type} on {message.topic}: the reflector reads "
                            "DecisionRecorded and OutcomeObserved only"
                        ),
                        source_topic=message.topic,
                        source_partition=message.partition,
                        source_offset=message.offset,
                        original_value=message.value,
                        original_key=message.key,
                        original_headers=tuple(message.headers or ()),
                        stage="reflect",
                    )
                )
                continue
            await work.send(
                key=subject_key(decoded.scope, decoded.subject).encode("utf-8"),
                value={"kind": kind, "event": decoded.model_dump(mode="json")},
                force=True,
            )
            handle.bump(f"forwarded_{kind}s")

    async def on_tick(partition: int, moment: datetime) -> None:
        snapshot = core.entries(partition)  # one pass over the table per tick
        if the_provider is not None:
            pending = core.pending(partition, snapshot=snapshot)
            if pending:
                try:
                    found = await the_provider.resolve(pending, moment)
                except Exception as exc:  # noqa: BLE001 - a broken provider must not stop expiry
                    log.warning("outcome provider %s failed: %s", the_provider.name, exc)
                    found = []
                await send_all(outcomes_topic, found)  # each outcome is a fact in the log first
                for outcome in found:
                    for settled in core.on_outcome(outcome, partition, moment):
                        runner.submit(settled)
                handle.bump("provider_outcomes", len(found))
                if found:
                    snapshot = core.entries(partition)
        expired = core.due_expiries(partition, moment, snapshot=snapshot)
        await send_all(events_out, expired)
        for event in expired:
            core.mark_expired(event, moment)
            handle.bump("expired")
            log.info("decision %s on %s expired at %s", event.decision_id, event.subject, event.deadline)
        for event in core.emitting(partition, skip=emits, snapshot=snapshot):
            await emit_reflection(event, partition)  # chosen before a restart: send it again
        for settled in core.settled(partition, skip=runner.in_flight, snapshot=snapshot):
            runner.submit(settled)
        core.sweep(partition, moment, snapshot=snapshot)
        handle.bump("ticks")

    async def handle_work(value: Any, partition: int) -> None:
        kind = value.get("kind") if isinstance(value, dict) else None
        moment = now()
        confirm_emits(partition, moment)
        if kind == "tick":
            await on_tick(partition, datetime.fromisoformat(value["now"]))
            return
        event = parse_event(value["event"])
        if kind == "decision" and isinstance(event, DecisionRecorded):
            for settled in core.on_decision(event, partition, moment):
                runner.submit(settled)
        elif kind == "outcome" and isinstance(event, OutcomeObserved):
            for settled in core.on_outcome(event, partition, moment):
                runner.submit(settled)
        elif kind == "reflection" and isinstance(event, MemoryReflected):
            if core.begin_reflection(event, moment):
                await emit_reflection(event, partition)
            else:
                runner.finished(decision_key(event.scope, event.decision_id))
                handle.bump("candidates_dropped")
        else:
            raise ValueError(f"unknown work record kind {kind!r}")

    @app.agent(pending_in, name="memstream.reflector.forward-decisions")
    async def forward_decisions(stream: Any) -> None:
        await forward(stream)

    @app.agent(outcomes_topic, name="memstream.reflector.forward-outcomes")
    async def forward_outcomes(stream: Any) -> None:
        await forward(stream)

    @app.agent(work, name="memstream.reflector")
    async def reflector(stream: Any) -> None:
        try:
            async for event in stream.events():
                try:
                    await handle_work(event.value, event.message.partition)
                except Exception:  # noqa: BLE001 - one bad record must not stop the reflector
                    # The state is unchanged by a failed step; ticks retry expiries and
                    # resubmit settled decisions, so nothing is lost by moving on.
                    handle.bump("errors")
                    log.exception("reflector failed on a %s record", _kind_of(event.value))
        finally:
            await runner.stop()
            await keyring.stop()

    @app.timer(settings.reflection_poll_seconds, on_leader=True)
    async def tick() -> None:
        moment = now().isoformat()
        for partition in range(partitions):
            await work.send(
                key=_TICK_KEY, value={"kind": "tick", "now": moment}, partition=partition, force=True
            )

    app.reflector = handle  # type: ignore[attr-defined]
    return handle


def _module_clock() -> Callable[[], datetime]:
    return clock


def _kind_of(value: Any) -> str:
    return str(value.get("kind")) if isinstance(value, dict) else type(value).__name__
