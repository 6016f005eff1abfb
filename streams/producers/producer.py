"""The producer SDK: how agent fleets write events to memstream.

Why a wrapper around aiokafka rather than "use any Kafka client": the log is the source
of truth, so every write must be *durable* (idempotent producer, ``acks=all``, the call
returns only once the broker has the record), must use the one wire format and key
(:mod:`memstream.codec.wire`; the memory space, so one space stays ordered), and a fast
agent fleet must not buffer without limit: at most ``Batching.max_in_flight`` sends
are un-acknowledged at any time, further ones wait (back-pressure).

Two front doors share one implementation:

* :class:`MemstreamProducer` for asyncio code (``async with MemstreamProducer() as p``),
* :class:`SyncProducer` for everything else (the async one on a background loop).

The typed writes (``add_memory``, ``observe_message``, ``record_decision``,
``observe_outcome``) are in :mod:`memstream.streams.producers.typed_writes`.

Retries: a failed call may have written some of its events; sending them again is safe
(every event has a unique ``event_id``; every reader applies an event at most once).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from memstream.domain.access import client_content_problem
from memstream.domain.events import EventBase
from memstream.domain.log import LogPosition
from memstream.settings import StreamsConfig, get_settings
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.sealing.sealed_records import PLAIN_TYPES, header_of, seal_value, subject_of
from memstream.codec.wire import EncodedRecord, EncodeError, encode_event
from memstream.streams.trust.worker_identity import memory_ids_key, signed_headers
from memstream.streams.producers.kafka_producer import Batching, KeyPartitioner, create_kafka_producer
from memstream.streams.producers.typed_writes import Sent, TypedWrites
from memstream.streams.topics import Topics, topic_for
from memstream.streams.lifecycle import StartStop

__all__ = [
    "MemstreamProducer",
    "Sent",
    "ProduceError",
    "ProducerClosedError",
    "NotSentError",
    "create_kafka_producer",
    "KeyPartitioner",
]

log = logging.getLogger(__name__)


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


class MemstreamProducer(StartStop, TypedWrites):
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
        streams: StreamsConfig | None = None,
        *,
        bootstrap_servers: str | None = None,
        topics: Topics | None = None,
        client_id: str = "memstream-sdk",
        compression_type: str | None = None,
        signing_key: bytes | None = None,
        keys: SubjectKeys | None = None,
        batching: Batching = Batching(),
    ) -> None:
        """``streams``: ``Settings.streams`` (default: the ``MEMSTREAM_*`` settings). ``signing_key``:
        the worker's key (``memstream.streams.trust.worker_identity``); only the worker passes it, so
        that its system events are believed. With sealing on (the default), events are sealed
        under their subject's key: ``keys`` is a started keyring to share, else its own."""
        self.streams = streams or get_settings().streams
        self.bootstrap_servers = bootstrap_servers or self.streams.broker.bootstrap_servers
        self.topics = topics or Topics.from_settings(self.streams.broker)
        self.client_id = client_id
        self._compression_type, self._batching = compression_type, batching
        self._signing_key = signing_key
        # a client that may write only the ingress: plaintext there, sealed by the worker
        self._via_ingress = self.streams.security.produce_via_ingress and signing_key is None
        self._keys = None if self._via_ingress else keys
        self._own_keys = keys is None and self.streams.security.sealing and not self._via_ingress
        self._producer: AIOKafkaProducer | None = None
        self._in_flight: asyncio.Semaphore | None = None
        self._pending: set[asyncio.Future[LogPosition]] = set()
        self._closed = False
        self._partitioner = KeyPartitioner()  # the client's, also used to group batches
        self._id_key = memory_ids_key(self.streams.worker_key_file, create=False)  # None: not on the worker's host

    # --- lifecycle -------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._producer is not None

    @property
    def keys(self) -> SubjectKeys | None:  # the keyring it seals with (None: no sealing here)
        return self._keys

    async def start(self) -> None:
        """Connect to the cluster. Raises aiokafka's ``KafkaConnectionError`` if unreachable."""
        if self._producer is not None:
            return
        if self._closed:
            raise ProducerClosedError("this producer was stopped; create a new one")
        producer = create_kafka_producer(
            self.streams.broker,
            bootstrap_servers=self.bootstrap_servers,
            client_id=self.client_id,
            compression_type=self._compression_type,
            partitioner=self._partitioner, batching=self._batching,
        )
        try:
            if self._own_keys:
                self._keys = await SubjectKeys(self.streams, self.topics, client_id=f"{self.client_id}-keys").start()
            await producer.start()
        except BaseException:
            await producer.stop()
            await self._stop_keys()
            raise
        self._in_flight = asyncio.Semaphore(self._batching.max_in_flight)
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
            await self._stop_keys()

    async def _stop_keys(self) -> None:
        if self._own_keys and self._keys is not None:
            keys, self._keys = self._keys, None
            await keys.stop()


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
        if self._keys is not None and event.type not in PLAIN_TYPES:
            assert self._keys.keyring is not None
            key = self._keys.keyring.key_for(subject_of(event.scope))
            if key is None:
                raise EncodeError(f"the memory space {event.scope.space!r} was forgotten a moment ago; send again")
            record = EncodedRecord(record.key, seal_value(key, header_of(event), record.value), record.headers)
        if self._signing_key is not None:  # over the sealed value: no keyed hash of the plaintext stays
            record = EncodedRecord(record.key, record.value, signed_headers(self._signing_key, record.value, record.headers))
        return record

    async def _keys_for(self, events: Iterable[EventBase]) -> None:
        """Make sure every subject of ``events`` has its data key (created and published
        before anything is sealed under it)."""
        if self._keys is None:
            return
        for subject in {subject_of(e.scope) for e in events if e.type not in PLAIN_TYPES}:
            await self._keys.key_for(subject)

    async def encode(self, event: EventBase) -> EncodedRecord:
        """``event`` as the record this producer would send (sealed and signed as it
        would be), for :meth:`send_encoded`."""
        await self._keys_for((event,))
        return self._encode(event)

    def topic_of(self, event: EventBase, topic: str | None = None) -> str:
        """The topic ``event`` goes to: ``topic`` if given, else the ingress
        (``produce_via_ingress``), else its default topic."""
        return topic or (self.topics.ingress if self._via_ingress else topic_for(event, self.topics))

    async def send_encoded(self, topic: str, record: EncodedRecord) -> asyncio.Future[LogPosition]:
        """Enqueue an already encoded record; the returned future resolves on the ack.

        Blocks (back-pressure) while ``batching.max_in_flight`` sends are
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

        Raises :class:`~memstream.codec.wire.EncodeError` at once for an event
        that cannot be encoded; a broker failure surfaces through the future.
        """
        await self._keys_for((event,))
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
        events = list(events)
        await self._keys_for(events)
        batch = [(self.topic_of(e, topic), self._encode(e)) for e in events]
        return await self._send_records(batch)

    async def _send_records(self, records: list[tuple[str, EncodedRecord]]) -> list[LogPosition]:
        """:meth:`send_many` of encoded records, in record batches built here.

        The records of one partition go, in input order, into aiokafka's record
        batches (``create_batch`` / ``send_batch``), one future per batch, instead of a
        partitioner call, an append and a future per record. The partition is the one
        ``send`` would choose (the same partitioner). A record over the request size
        limit is refused before anything is sent, as ``send`` refuses it, and so is
        every record after it (the records before it are sent)."""
        producer = self._require()
        cut, refused = self._cut_oversized(records)
        groups = await self._groups(producer, records, cut)
        positions: dict[int, LogPosition | BaseException] = {}
        sent = await self._hand_over_groups(producer, records, groups, cut, positions)
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

    def _cut_oversized(self, records: list[tuple[str, EncodedRecord]]) -> tuple[int, BaseException | None]:
        """How many records come before the first one over the request size limit,
        and the error refusing that one (``None``: all fit)."""
        for i, (_, record) in enumerate(records):
            size = DefaultRecordBatchBuilder.estimate_size_in_bytes(record.key, record.value, record.headers)
            if size > self.streams.broker.max_request_bytes:
                return i, MessageSizeTooLargeError(
                    f"The message is {size} bytes when serialized which is larger than the maximum "
                    f"request size you have configured with the max_request_size configuration"
                )
        return len(records), None

    async def _groups(
        self, producer: AIOKafkaProducer, records: list[tuple[str, EncodedRecord]], cut: int
    ) -> dict[tuple[str, int], list[int]]:
        """The first ``cut`` records' indexes by (topic, partition), in input order."""
        groups: dict[tuple[str, int], list[int]] = {}
        partitions: dict[str, list[int]] = {}
        for i in range(cut):
            target, record = records[i]
            known = partitions.get(target)
            if known is None:
                known = partitions[target] = sorted(await producer.partitions_for(target))
            groups.setdefault((target, self._partitioner(record.key, known, known)), []).append(i)
        return groups

    async def _hand_over_groups(
        self,
        producer: AIOKafkaProducer,
        records: list[tuple[str, EncodedRecord]],
        groups: dict[tuple[str, int], list[int]],
        cut: int,
        positions: dict[int, LogPosition | BaseException],
    ) -> list[tuple[asyncio.Future[Any], list[int]]]:
        """Hand every group to the client in record batches (each record holding a
        permit); the batches' futures with their records. If the client fails a batch
        outright, its records and those not yet handed over fail in ``positions``."""
        assert self._in_flight is not None
        sent: list[tuple[asyncio.Future[Any], list[int]]] = []
        held: list[int] = []  # records in the batch being built, each holding a permit
        builder = producer.create_batch()

        async def hand_over(members: list[int], target: str, partition: int) -> None:
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
            for _ in held:  # their permits are returned; batches handed over are awaited by the caller
                self._in_flight.release()
            handed = {i for _, members in sent for i in members}
            for i in range(cut):
                if i not in handed:
                    positions[i] = exc if isinstance(exc, Exception) else NotSentError(str(exc))
            if not isinstance(exc, Exception):
                raise
        return sent

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
