"""The producer SDK: how agent fleets write events to memstream.

Why a wrapper around aiokafka rather than "use any Kafka client": the log is the source
of truth, so every write must be *durable* (idempotent producer, ``acks=all``, the call
returns only once the broker has the record), must use the one wire format
(:mod:`memstream.streams.serializer`) and key (the memory space, so one space stays
ordered), and a fast agent fleet must not be able to buffer without limit: at most
``settings.producer_max_in_flight`` sends are un-acknowledged at any time, and further
sends wait (back-pressure) instead of growing memory.

Two front doors share one implementation:

* :class:`MemstreamProducer` for asyncio code (``async with MemstreamProducer() as p``),
* :class:`SyncProducer` for everything else; it runs the async producer on an event
  loop in a background thread and blocks the caller until each call completes.

Retries and duplicates: a failed call may still have written some of its events (the
broker acknowledged them before the failure). Sending them again is safe: every event
carries a unique ``event_id`` and every reader applies an event at most once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Generic, TypeVar

from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.partitioner import DefaultPartitioner, murmur2
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from memstream.domain.access import client_content_problem
from memstream.domain.events import (
    CURRENT_SCHEMA_VERSIONS,
    DecisionRecorded,
    EventBase,
    MemoryAdded,
    MessageObserved,
    OutcomeObserved,
    Scope,
    parse_event,
)
from memstream.domain.log import LogPosition
from memstream.settings import Settings, get_settings
from memstream.streams.serializer import EncodedRecord, EncodeError, encode_event
from memstream.streams.worker_identity import signed_headers
from memstream.streams.topics import Topics, topic_for

__all__ = [
    "MemstreamProducer",
    "SyncProducer",
    "Sent",
    "ProduceError",
    "ProducerClosedError",
    "NotSentError",
    "create_kafka_producer",
    "KeyPartitioner",
]

log = logging.getLogger(__name__)

E = TypeVar("E", bound=EventBase)
T = TypeVar("T")


class ProduceError(RuntimeError):
    """Some events of a batch were not acknowledged.

    ``results`` has one entry per event, in input order: the :class:`LogPosition` of an
    acknowledged event or the exception that failed it. Events with a position are in
    the log; resending the others (or all) is safe, readers deduplicate by event id.
    """

    def __init__(self, results: list[LogPosition | BaseException]) -> None:
        failures = [r for r in results if isinstance(r, BaseException)]
        first = failures[0] if failures else None
        super().__init__(
            f"{len(failures)} of {len(results)} events were not acknowledged"
            + (f"; first error: {type(first).__name__}: {first}" if first else "")
        )
        self.results = results


class NotSentError(RuntimeError):
    """In :attr:`ProduceError.results`: this event was never handed to Kafka."""


class ProducerClosedError(RuntimeError):
    """The producer was used before ``start()`` or after ``stop()``."""


@dataclass(frozen=True)
class Sent(Generic[E]):
    """An event the broker acknowledged, and where it landed (for read-your-writes:
    a view that reached ``position`` holds the event)."""

    event: E
    position: LogPosition

    def __str__(self) -> str:
        """``topic:partition:offset``, what a log line about a write wants to show."""
        return str(self.position)


class KeyPartitioner:
    """aiokafka's default partitioning, the Java client's (murmur2 of the key bytes, so
    every client puts a memory space on the same partition), with each key's hash
    remembered: a producer sends many records per memory space, and the hash is pure
    Python (about 3 µs a record, measured). Records without a key go where aiokafka's
    default puts them."""

    _MAX_KEYS = 65_536

    def __init__(self) -> None:
        self._hashes: dict[bytes, int] = {}
        self._default = DefaultPartitioner()

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            return int(self._default(key, all_partitions, available))
        h = self._hashes.get(key)
        if h is None:
            if len(self._hashes) >= self._MAX_KEYS:
                self._hashes.clear()
            h = self._hashes[key] = murmur2(key) & 0x7FFFFFFF
        return all_partitions[h % len(all_partitions)]


def create_kafka_producer(
    settings: Settings,
    *,
    bootstrap_servers: str | None = None,
    client_id: str = "memstream-sdk",
    compression_type: str | None = None,
    transactional_id: str | None = None,
    partitioner: KeyPartitioner | None = None,
) -> AIOKafkaProducer:
    """The one aiokafka producer configuration memstream writes with.

    Idempotent with ``acks="all"``: a record is acknowledged only once every in-sync
    replica has it, and broker-side retries never duplicate or reorder a partition.
    ``linger_ms`` / ``max_batch_size`` trade a few milliseconds for throughput.
    Compression is off unless asked for (aiokafka refuses a codec whose library is
    missing, e.g. ``lz4`` without the ``lz4`` package).
    """
    kwargs: dict[str, Any] = {}
    if transactional_id is not None:
        kwargs["transactional_id"] = transactional_id
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap_servers or settings.bootstrap_servers,
        client_id=client_id,
        enable_idempotence=True,
        acks="all",
        linger_ms=settings.producer_linger_ms,
        max_batch_size=settings.producer_max_batch_bytes,
        max_request_size=settings.max_request_bytes,
        compression_type=compression_type,
        partitioner=partitioner or KeyPartitioner(),
        **kwargs,
    )


def _scope_input(scope: Scope | Mapping[str, Any]) -> Scope | dict[str, Any]:
    """A Scope, or a plain mapping that validation turns into one (with the same
    one-line errors as any other field)."""
    return scope if isinstance(scope, Scope) else dict(scope)


def _new_id() -> str:
    return uuid.uuid4().hex


class MemstreamProducer:
    """Asynchronous, durable, back-pressured event producer.

    >>> async with MemstreamProducer() as producer:          # doctest: +SKIP
    ...     sent = await producer.add_memory({"team_id": "acme", "user_id": "ana"},
    ...                                      "Ana prefers short answers", memory_type="persona")
    ...     print(sent.position)

    Each event goes to ``topic`` if given, else to its default topic
    (:func:`memstream.streams.topics.topic_for`); its record key is its memory space.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        bootstrap_servers: str | None = None,
        topics: Topics | None = None,
        client_id: str = "memstream-sdk",
        compression_type: str | None = None,
        signing_key: bytes | None = None,
    ) -> None:
        """``signing_key``: the worker's key (``memstream.streams.worker_identity``);
        only the worker passes it, so that its system events are believed."""
        self.settings = settings or get_settings()
        self.bootstrap_servers = bootstrap_servers or self.settings.bootstrap_servers
        self.topics = topics or Topics.from_settings(self.settings)
        self.client_id = client_id
        self._compression_type = compression_type
        self._signing_key = signing_key
        self._producer: AIOKafkaProducer | None = None
        self._in_flight: asyncio.Semaphore | None = None
        self._pending: set[asyncio.Future[LogPosition]] = set()
        self._closed = False
        self._partitioner = KeyPartitioner()  # the client's, also used to group batches

    # --- lifecycle -------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._producer is not None

    async def start(self) -> None:
        """Connect to the cluster. Raises aiokafka's ``KafkaConnectionError`` if unreachable."""
        if self._producer is not None:
            return
        if self._closed:
            raise ProducerClosedError("this producer was stopped; create a new one")
        producer = create_kafka_producer(
            self.settings,
            bootstrap_servers=self.bootstrap_servers,
            client_id=self.client_id,
            compression_type=self._compression_type,
            partitioner=self._partitioner,
        )
        try:
            await producer.start()
        except BaseException:
            await producer.stop()
            raise
        self._in_flight = asyncio.Semaphore(self.settings.producer_max_in_flight)
        self._producer = producer
        log.debug("producer %s connected to %s", self.client_id, self.bootstrap_servers)

    async def flush(self) -> None:
        """Wait until every event sent so far is acknowledged (or failed)."""
        producer = self._require()
        await producer.flush()
        if self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def stop(self) -> None:
        """Flush, then disconnect. Idempotent."""
        producer, self._producer = self._producer, None
        self._closed = True
        if producer is None:
            return
        try:
            await producer.flush()
            if self._pending:
                await asyncio.gather(*list(self._pending), return_exceptions=True)
        finally:
            await producer.stop()

    async def __aenter__(self) -> "MemstreamProducer":
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _require(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise ProducerClosedError(
                "producer is not started: use `async with MemstreamProducer()` or await start()"
            )
        return self._producer

    # --- sending ---------------------------------------------------------------------

    def _encode(self, event: EventBase) -> EncodedRecord:
        if self._signing_key is None:  # a client: its memories pass the injection gate
            problem = client_content_problem(event)
            if problem is not None:
                raise EncodeError(f"refused by the quality gate: {problem}")
        record = encode_event(event)
        if self._signing_key is not None:
            record = EncodedRecord(record.key, record.value, signed_headers(self._signing_key, record.value, record.headers))
        return record

    def topic_of(self, event: EventBase, topic: str | None = None) -> str:
        """The topic ``event`` goes to: ``topic`` if given, else its default topic."""
        return topic or topic_for(event, self.topics)

    async def send_encoded(self, topic: str, record: EncodedRecord) -> asyncio.Future[LogPosition]:
        """Enqueue an already encoded record; the returned future resolves on the ack.

        Blocks (back-pressure) while ``producer_max_in_flight`` sends are
        un-acknowledged. Use :meth:`send_nowait` unless you hold raw records.
        """
        producer = self._require()
        assert self._in_flight is not None
        await self._in_flight.acquire()
        try:
            kafka_future = await producer.send(
                topic, value=record.value, key=record.key, headers=record.headers
            )
        except BaseException:
            self._in_flight.release()
            raise
        loop = asyncio.get_running_loop()
        result: asyncio.Future[LogPosition] = loop.create_future()
        self._pending.add(result)
        semaphore = self._in_flight

        def _done(fut: asyncio.Future[Any]) -> None:
            semaphore.release()
            self._pending.discard(result)
            if result.done():  # cancelled by the caller: the record is still sent
                return
            if fut.cancelled():
                result.cancel()
            elif (exc := fut.exception()) is not None:
                result.set_exception(exc)
            else:
                md = fut.result()
                result.set_result(LogPosition(topic=md.topic, partition=md.partition, offset=md.offset))

        kafka_future.add_done_callback(_done)
        return result

    async def send_nowait(
        self, event: EventBase, *, topic: str | None = None
    ) -> asyncio.Future[LogPosition]:
        """Enqueue ``event`` and return at once with a future of its position.

        Raises :class:`~memstream.streams.serializer.EncodeError` at once for an event
        that cannot be encoded; a broker failure surfaces through the future.
        """
        record = self._encode(event)
        return await self.send_encoded(self.topic_of(event, topic), record)

    async def send(self, event: EventBase, *, topic: str | None = None) -> LogPosition:
        """Send ``event`` and wait until the broker acknowledged it (durable)."""
        future = await self.send_nowait(event, topic=topic)
        return await future

    async def send_many(
        self, events: Iterable[EventBase], *, topic: str | None = None
    ) -> list[LogPosition]:
        """Send many events concurrently; return their positions in input order.

        Every event is encoded before any is sent, so an unencodable event sends
        nothing. Sends are pipelined (batched by the client) under the in-flight bound.
        Raises :class:`ProduceError` (with per-event results) if any send failed; if the
        client refuses one record outright (e.g. over ``max_request_bytes``), the
        events after it are not sent (:class:`NotSentError`).
        """
        batch = [(self.topic_of(e, topic), self._encode(e)) for e in events]
        return await self._send_records(batch)

    async def _send_records(self, records: list[tuple[str, EncodedRecord]]) -> list[LogPosition]:
        """:meth:`send_many` of encoded records, in record batches built here.

        The records of one partition go, in input order, into aiokafka's record
        batches (``create_batch`` / ``send_batch``), one future per batch: the per
        record path (a partitioner call, an accumulator append and a future per
        record, and a callback per acknowledgement) was most of the extractor's
        produce time. The partition is the one ``send`` would choose (the same
        partitioner). A record over the request size limit is refused before anything
        is sent, as ``send`` refuses it, and so is every record after it (the records
        before it are sent)."""
        producer = self._require()
        assert self._in_flight is not None
        refused: BaseException | None = None
        cut = len(records)
        for i, (_, record) in enumerate(records):
            size = DefaultRecordBatchBuilder.estimate_size_in_bytes(record.key, record.value, record.headers)
            if size > self.settings.max_request_bytes:
                cut, refused = i, MessageSizeTooLargeError(
                    f"The message is {size} bytes when serialized which is larger than the maximum "
                    f"request size you have configured with the max_request_size configuration"
                )
                break
        groups: dict[tuple[str, int], list[int]] = {}
        partitions: dict[str, list[int]] = {}
        for i in range(cut):
            target, record = records[i]
            known = partitions.get(target)
            if known is None:
                known = partitions[target] = sorted(await producer.partitions_for(target))
            groups.setdefault((target, self._partitioner(record.key, known, known)), []).append(i)
        sent: list[tuple[asyncio.Future[Any], list[int]]] = []
        positions: dict[int, LogPosition | BaseException] = {}
        held: list[int] = []  # records in the batch being built, each holding a permit
        builder = producer.create_batch()

        async def hand_over(members: list[int], target: str, partition: int) -> None:
            """Send the batch being built (holding ``members``); start a new one."""
            nonlocal builder
            sent.append((await self._send_batch(producer, builder, target, partition, members), members))
            builder = producer.create_batch()

        def add(record: EncodedRecord) -> bool:
            return builder.append(timestamp=None, key=record.key, value=record.value, headers=record.headers) is not None

        try:
            for (target, partition), members in groups.items():
                for i in members:
                    if self._in_flight.locked() and held:  # waiting for permits: send what is held first
                        await hand_over(held, target, partition)
                        held = []
                    await self._in_flight.acquire()
                    held.append(i)
                    if not add(records[i][1]):  # the batch is full
                        await hand_over(held[:-1], target, partition)
                        held = [i]
                        if not add(records[i][1]):  # a fresh batch takes its first record whatever its size
                            raise RuntimeError("an empty record batch refused a record")
                if held:
                    await hand_over(held, target, partition)
                    held = []
        except BaseException as exc:
            # The client failed a batch outright: its records and those not yet handed
            # over fail (their permits are returned); batches already handed over are
            # awaited below.
            for _ in held:
                self._in_flight.release()
            handed = {i for _, members in sent for i in members}
            for i in range(cut):
                if i not in handed:
                    positions[i] = exc if isinstance(exc, Exception) else NotSentError(str(exc))
            if not isinstance(exc, Exception):
                raise
        for (future, members), outcome in zip(
            sent, await asyncio.gather(*(f for f, _ in sent), return_exceptions=True)
        ):
            for relative, i in enumerate(members):
                if isinstance(outcome, BaseException):
                    positions[i] = outcome
                else:
                    positions[i] = LogPosition.model_construct(
                        topic=outcome.topic, partition=outcome.partition, offset=outcome.offset + relative
                    )
        results = [positions[i] for i in range(cut)]
        if refused is not None:
            results.append(refused)
            skipped = NotSentError("not sent: an earlier event of the batch was refused")
            results.extend([skipped] * (len(records) - len(results)))
        if any(isinstance(r, BaseException) for r in results):
            raise ProduceError(results) from refused
        return [r for r in results if isinstance(r, LogPosition)]

    async def _send_batch(
        self, producer: AIOKafkaProducer, builder: Any, topic: str, partition: int, members: list[int]
    ) -> asyncio.Future[Any]:
        """Hand one record batch (of the records ``members``, each holding a permit) to
        the client; its future resolves on the acknowledgement, when the permits are
        returned. If the client refuses the batch, the caller returns them."""
        assert self._in_flight is not None
        semaphore = self._in_flight
        count = len(members)
        future: asyncio.Future[Any] = await producer.send_batch(builder, topic, partition=partition)

        def _release(_: asyncio.Future[Any]) -> None:
            for _n in range(count):
                semaphore.release()

        future.add_done_callback(_release)
        return future

    # --- conveniences ------------------------------------------------------------------

    def _build(self, cls: type[E], scope: Scope | Mapping[str, Any], fields: dict[str, Any]) -> E:
        etype = cls.model_fields["type"].default
        raw = {
            "type": etype,
            "schema_version": CURRENT_SCHEMA_VERSIONS[etype],
            "scope": _scope_input(scope),
            "producer": self.client_id,
            # None means "not given": the model's default applies.
            **{k: v for k, v in fields.items() if v is not None},
        }
        event = parse_event(raw)
        assert isinstance(event, cls)
        return event

    async def _send_built(self, event: E, topic: str | None) -> Sent[E]:
        return Sent(event=event, position=await self.send(event, topic=topic))

    async def add_memory(
        self,
        scope: Scope | Mapping[str, Any],
        content: str,
        *,
        memory_id: str | None = None,
        topic: str | None = None,
        **fields: Any,
    ) -> Sent[MemoryAdded]:
        """Write one memory (``MemoryAdded``); ``fields`` are any of its other fields
        (``memory_type``, ``priority``, ``scene``, ``entities``, ``metadata``, ...).
        Raises :class:`~memstream.domain.events.EventValidationError` for bad input."""
        event = self._build(
            MemoryAdded, scope, {"memory_id": memory_id or _new_id(), "content": content, **fields}
        )
        return await self._send_built(event, topic)

    async def observe_message(
        self,
        scope: Scope | Mapping[str, Any],
        message_id: str,
        content: str,
        *,
        role: str = "user",
        speaker: str | None = None,
        session_id: str | None = None,
        topic: str | None = None,
        **fields: Any,
    ) -> Sent[MessageObserved]:
        """Write one conversation turn (``MessageObserved``) for the extractor."""
        event = self._build(
            MessageObserved,
            scope,
            {
                "message_id": message_id,
                "content": content,
                "role": role,
                "speaker": speaker,
                "session_id": session_id,
                **fields,
            },
        )
        return await self._send_built(event, topic)

    async def record_decision(
        self,
        scope: Scope | Mapping[str, Any],
        decision_id: str,
        subject: str,
        rating: str,
        decision_text: str,
        deadline: datetime,
        *,
        horizon_days: int = 5,
        topic: str | None = None,
        **fields: Any,
    ) -> Sent[DecisionRecorded]:
        """Write a pending decision (``DecisionRecorded``) that waits for its outcome.

        ``rating`` is read leniently ("Strong Buy", "Rating: Overweight", "neutral"; see
        :func:`memstream.domain.reflection.parse_rating`); the event carries the exact
        5-level value."""
        from memstream.domain.events import EventValidationError
        from memstream.domain.reflection import RatingParseError, parse_rating

        try:
            rating = parse_rating(rating).value
        except RatingParseError as exc:
            raise EventValidationError(f"rating: {exc.reason}") from None
        event = self._build(
            DecisionRecorded,
            scope,
            {
                "decision_id": decision_id,
                "subject": subject,
                "rating": rating,
                "decision_text": decision_text,
                "deadline": deadline,
                "horizon_days": horizon_days,
                **fields,
            },
        )
        return await self._send_built(event, topic)

    async def observe_outcome(
        self,
        scope: Scope | Mapping[str, Any],
        outcome_id: str,
        subject: str,
        raw_return: float,
        horizon_days: int,
        *,
        decision_id: str | None = None,
        benchmark_return: float | None = None,
        topic: str | None = None,
        **fields: Any,
    ) -> Sent[OutcomeObserved]:
        """Write an observed outcome (``OutcomeObserved``); settles matching decisions."""
        event = self._build(
            OutcomeObserved,
            scope,
            {
                "outcome_id": outcome_id,
                "subject": subject,
                "raw_return": raw_return,
                "horizon_days": horizon_days,
                "decision_id": decision_id,
                "benchmark_return": benchmark_return,
                **fields,
            },
        )
        return await self._send_built(event, topic)


class SyncProducer:
    """The same API as :class:`MemstreamProducer`, blocking, for code without asyncio.

    An event loop runs in one background (daemon) thread and owns the aiokafka client;
    every call is handed to it and the caller waits for the result. Thread-safe: many
    threads may share one ``SyncProducer``. Use as a context manager or call
    :meth:`close` (which flushes).
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        bootstrap_servers: str | None = None,
        topics: Topics | None = None,
        client_id: str = "memstream-sdk",
        compression_type: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self._make: Callable[[], MemstreamProducer] = functools.partial(
            MemstreamProducer,
            settings,
            bootstrap_servers=bootstrap_servers,
            topics=topics,
            client_id=client_id,
            compression_type=compression_type,
        )
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._producer: MemstreamProducer | None = None
        self._closed = False

    def start(self) -> None:
        """Start the loop thread and connect (called by the first use if not before)."""
        with self._lock:
            if self._producer is not None:
                return
            if self._closed:
                raise ProducerClosedError("this producer was closed; create a new one")
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="memstream-sync-producer", daemon=True
            )
            thread.start()

            async def _create() -> MemstreamProducer:
                producer = self._make()
                await producer.start()
                return producer

            try:
                self._producer = asyncio.run_coroutine_threadsafe(_create(), loop).result()
            except BaseException:
                loop.call_soon_threadsafe(loop.stop)
                thread.join()
                loop.close()
                raise
            self._loop, self._thread = loop, thread

    def _call(self, make: Callable[[MemstreamProducer], Coroutine[Any, Any, T]]) -> T:
        if self._producer is None:
            self.start()
        assert self._producer is not None and self._loop is not None
        if threading.current_thread() is self._thread:
            raise RuntimeError("SyncProducer cannot be called from its own loop thread")
        future = asyncio.run_coroutine_threadsafe(make(self._producer), self._loop)
        return future.result(self._timeout_s)

    @property
    def producer(self) -> MemstreamProducer:
        """The underlying async producer (lives on the background loop)."""
        if self._producer is None:
            self.start()
        assert self._producer is not None
        return self._producer

    def send(self, event: EventBase, *, topic: str | None = None) -> LogPosition:
        return self._call(lambda p: p.send(event, topic=topic))

    def send_many(self, events: Iterable[EventBase], *, topic: str | None = None) -> list[LogPosition]:
        items = list(events)
        return self._call(lambda p: p.send_many(items, topic=topic))

    def send_nowait(
        self, event: EventBase, *, topic: str | None = None
    ) -> concurrent.futures.Future[LogPosition]:
        """Enqueue ``event``; blocks only while too many sends are in flight."""
        result: concurrent.futures.Future[LogPosition] = concurrent.futures.Future()

        async def _enqueue(p: MemstreamProducer) -> None:
            inner = await p.send_nowait(event, topic=topic)

            def _relay(fut: asyncio.Future[LogPosition]) -> None:
                if fut.cancelled():
                    result.cancel()
                elif (exc := fut.exception()) is not None:
                    result.set_exception(exc)
                else:
                    result.set_result(fut.result())

            inner.add_done_callback(_relay)

        self._call(_enqueue)
        return result

    def flush(self) -> None:
        self._call(lambda p: p.flush())

    def add_memory(self, scope: Scope | Mapping[str, Any], content: str, **fields: Any) -> Sent[MemoryAdded]:
        return self._call(lambda p: p.add_memory(scope, content, **fields))

    def observe_message(
        self, scope: Scope | Mapping[str, Any], message_id: str, content: str, **fields: Any
    ) -> Sent[MessageObserved]:
        return self._call(lambda p: p.observe_message(scope, message_id, content, **fields))

    def record_decision(
        self,
        scope: Scope | Mapping[str, Any],
        decision_id: str,
        subject: str,
        rating: str,
        decision_text: str,
        deadline: datetime,
        **fields: Any,
    ) -> Sent[DecisionRecorded]:
        return self._call(
            lambda p: p.record_decision(scope, decision_id, subject, rating, decision_text, deadline, **fields)
        )

    def observe_outcome(
        self,
        scope: Scope | Mapping[str, Any],
        outcome_id: str,
        subject: str,
        raw_return: float,
        horizon_days: int,
        **fields: Any,
    ) -> Sent[OutcomeObserved]:
        return self._call(
            lambda p: p.observe_outcome(scope, outcome_id, subject, raw_return, horizon_days, **fields)
        )

    def close(self) -> None:
        """Flush every pending send, disconnect and stop the loop thread. Idempotent."""
        with self._lock:
            self._closed = True
            producer, loop, thread = self._producer, self._loop, self._thread
            self._producer = self._loop = self._thread = None
        if producer is None or loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(producer.stop(), loop).result(self._timeout_s)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    def __enter__(self) -> "SyncProducer":
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
