"""Consuming events: decode every record, route the unusable ones to dead letters, go on.

Why a helper: every reader of the log (projector, extractor, reflector, tools) needs
the same three guarantees, and they are easy to get subtly wrong with a raw client:

1. **No poison pill.** A record that cannot be decoded or validated never stops the
   consumer and never raises into the caller: it becomes a :class:`DeadLetter`.
2. **Nothing lost.** Dead letters are published (and acknowledged by the broker)
   *before* the batch holding them is handed to the caller, and offsets are committed
   only when the caller says the batch is processed (:meth:`EventConsumer.commit`).
   A crash in between re-delivers the batch (at-least-once); readers are idempotent.
3. **No collateral damage.** Each record is judged alone: a valid record is delivered
   whatever its neighbours are, in partition order.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, IllegalStateError, RebalanceInProgressError

from memstream.domain.log import LogPosition, PositionedEvent
from memstream.settings import StreamsConfig, get_settings
from memstream.streams.dead_letters.publisher import DeadLetter, DeadLetterPublisher
from memstream.streams.records.inflation_bound import bound_inflation
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.records.codec import decode_or_dead_letter, read_record
from memstream.streams.sealing.sealed_records import RecordOpener
from memstream.codec.wire import MAX_RECORD_BYTES, encode_event
from memstream.streams.topics import Topics
from memstream.streams.connect import kafka_options
from memstream.streams.lifecycle import StartStop

__all__ = ["ConsumedBatch", "decode_or_dead_letter", "EventConsumer"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConsumedBatch:
    """One poll's worth of records: the valid events (partition order kept) and the
    dead letters already published for the others.

    ``next_offsets`` maps ``(topic, partition)`` to the offset after the last record of
    this batch, dead letters included: what a reader that keeps its own positions
    stores once it has applied the batch.
    """

    events: list[PositionedEvent]
    dead: list[DeadLetter]
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.events) + len(self.dead)

    @property
    def empty(self) -> bool:
        return not self.events and not self.dead


class _Rebalance(ConsumerRebalanceListener):
    """Forgets un-committed positions of revoked partitions (committing them later
    could move another member's progress backwards) and applies start offsets."""

    def __init__(self, owner: "EventConsumer") -> None:
        self._owner = owner

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        for tp in revoked:
            self._owner._yielded.pop(tp, None)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self._owner._seek_start(assigned)


class EventConsumer(StartStop):
    """An aiokafka consumer that yields decoded events in batches.

    >>> async with EventConsumer(topics.events, group_id="projector") as consumer:  # doctest: +SKIP
    ...     async for batch in consumer.batches(max_records=1000, timeout_ms=500):
    ...         apply(batch.events)          # dead letters are already published
    ...         await consumer.commit()      # only now is the batch marked as done

    With ``group_id=None`` the consumer reads every partition of ``topics`` without a
    group (no commits; keep positions yourself, e.g. with ``start_offsets``).

    ``start_offsets`` maps ``(topic, partition)`` to the offset to start at, overriding
    committed offsets (a view that stores its positions resumes from them); each applies
    on the first assignment of its partition only. Partitions without an entry start at
    the committed offset, else at ``auto_offset_reset``.
    """

    def __init__(
        self,
        topics: str | Sequence[str],
        *,
        group_id: str | None,
        streams: StreamsConfig | None = None,
        bootstrap_servers: str | None = None,
        dead_letter_topic: str | None = None,
        dead_letters: DeadLetterPublisher | None = None,
        auto_offset_reset: Literal["earliest", "latest"] = "earliest",
        start_offsets: Mapping[tuple[str, int], int] | None = None,
        client_id: str = "memstream-consumer",
        isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed",
        max_record_bytes: int = MAX_RECORD_BYTES,
        consumer_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.streams = streams or get_settings().streams
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        if not self.topics:
            raise ValueError("EventConsumer needs at least one topic")
        self.group_id = group_id
        self.bootstrap_servers = bootstrap_servers or self.streams.broker.bootstrap_servers
        self.dead_letter_topic = dead_letter_topic or Topics.from_settings(self.streams.broker).dead_letter
        if self.dead_letter_topic in self.topics:
            raise ValueError("an EventConsumer cannot read its own dead-letter topic")
        self._dead_letters = dead_letters
        self._owns_dead_letters = dead_letters is None
        self._auto_offset_reset = auto_offset_reset
        self._start_offsets = {TopicPartition(t, p): o for (t, p), o in (start_offsets or {}).items()}
        self._client_id = client_id
        self._isolation_level = isolation_level
        self._max_record_bytes = max_record_bytes
        self._consumer_options = dict(consumer_options or {})
        self._consumer: AIOKafkaConsumer | None = None
        self._keys: SubjectKeys | None = None
        self.opener: RecordOpener | None = None
        self._yielded: dict[TopicPartition, int] = {}
        self._raw: dict[LogPosition, ConsumerRecord[bytes, bytes]] = {}

    # --- lifecycle -------------------------------------------------------------------

    @property
    def consumer(self) -> AIOKafkaConsumer:
        """The underlying aiokafka consumer (for seeks, lag, pause/resume)."""
        if self._consumer is None:
            raise RuntimeError("EventConsumer is not started")
        return self._consumer

    async def start(self) -> None:
        if self._consumer is not None:
            return
        options: dict[str, Any] = {
            **kafka_options(self.streams.broker, bootstrap_servers=self.bootstrap_servers),
            "client_id": self._client_id,
            "group_id": self.group_id,
            "enable_auto_commit": False,
            "auto_offset_reset": self._auto_offset_reset,
            "isolation_level": self._isolation_level,
        }
        options.update(self._consumer_options)
        bound_inflation()
        if self.streams.security.sealing and self._keys is None:  # the log is sealed: open what is read
            self._keys = await SubjectKeys(self.streams, client_id=f"{self._client_id}-keys").start()
            self.opener = RecordOpener(self._keys.keyring)
        consumer = AIOKafkaConsumer(**options)
        if self.group_id is not None:
            consumer.subscribe(self.topics, listener=_Rebalance(self))
        else:
            consumer.subscribe(self.topics)
        self._consumer = consumer
        try:
            await consumer.start()
            if self.group_id is None:
                self._seek_start(list(consumer.assignment()))
        except BaseException:
            self._consumer = None
            await consumer.stop()
            raise

    async def stop(self) -> None:
        """Disconnect. Does not commit: un-committed batches are read again next time."""
        consumer, self._consumer = self._consumer, None
        keys, self._keys = self._keys, None
        try:
            if consumer is not None:
                await consumer.stop()
            if keys is not None:
                await keys.stop()
        finally:
            if self._owns_dead_letters and self._dead_letters is not None:
                publisher, self._dead_letters = self._dead_letters, None
                await publisher.stop()


    def _seek_start(self, partitions: list[TopicPartition]) -> None:
        # Each start offset applies once: after a rebalance the committed offset (or
        # the caller's own position) is newer than the offset we were started with.
        for tp in partitions:
            offset = self._start_offsets.pop(tp, None)
            if offset is not None:
                self.consumer.seek(tp, offset)

    def _publisher(self) -> DeadLetterPublisher:
        if self._dead_letters is None:
            self._dead_letters = DeadLetterPublisher(
                self.dead_letter_topic,
                streams=self.streams,
                bootstrap_servers=self.bootstrap_servers,
                client_id=f"{self._client_id}-dlq",
            )
        return self._dead_letters

    # --- reading ---------------------------------------------------------------------

    async def batches(
        self, max_records: int = 500, timeout_ms: int = 1000, *, yield_empty: bool = True
    ) -> AsyncIterator[ConsumedBatch]:
        """Poll forever, yielding one :class:`ConsumedBatch` per poll.

        Dead letters of a batch are published (and acknowledged) before it is yielded.
        An empty batch (when ``yield_empty``) means nothing arrived within
        ``timeout_ms``, which lets callers check their own stop conditions.
        """
        consumer = self.consumer
        while True:
            polled = await consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
            if self._keys is not None:
                await self._keys.prepare((r.value, r.headers) for records in polled.values() for r in records)
            batch = self._decode(polled)
            if batch.dead:
                await self._publisher().publish_many(batch.dead)
            if batch.empty and not yield_empty:
                continue
            for (topic, partition), nxt in batch.next_offsets.items():
                self._yielded[TopicPartition(topic, partition)] = nxt
            yield batch

    def _decode(self, polled: Mapping[TopicPartition, list[ConsumerRecord[bytes, bytes]]]) -> ConsumedBatch:
        events: list[PositionedEvent] = []
        dead: list[DeadLetter] = []
        next_offsets: dict[tuple[str, int], int] = {}
        self._raw = {}
        for tp, records in polled.items():
            for rec in records:
                item = read_record(
                    self.opener, rec.topic, rec.partition, rec.offset, rec.key, rec.value, rec.headers, max_bytes=self._max_record_bytes
                )
                if item is None:  # a forgotten subject's record: skipped (opener.counts)
                    continue
                if isinstance(item, DeadLetter):
                    dead.append(item)
                else:
                    events.append(item)
                    self._raw[item.position] = rec
            if records:
                next_offsets[(tp.topic, tp.partition)] = records[-1].offset + 1
        return ConsumedBatch(events=events, dead=dead, next_offsets=next_offsets)

    async def commit(self) -> bool:
        """Mark every batch yielded so far as processed (commit the next offsets).

        Returns False (and commits nothing) without a group, or when a rebalance took
        the partitions away meanwhile: their records will be read again by their new
        owner, which idempotent readers tolerate.
        """
        if self.group_id is None or not self._yielded:
            return False
        consumer = self.consumer
        assigned = consumer.assignment()
        offsets = {tp: off for tp, off in self._yielded.items() if tp in assigned}
        if not offsets:
            return False
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, RebalanceInProgressError, IllegalStateError) as exc:
            log.warning("commit skipped, the group is rebalancing: %s", exc)
            return False
        for tp, off in offsets.items():
            if self._yielded.get(tp) == off:
                del self._yielded[tp]
        return True

    async def dead_letter(self, item: PositionedEvent, reason: str, *, stage: str) -> LogPosition:
        """Publish an event of the latest batch that a later stage (``project``,
        ``extract``...) could not handle; the original record bytes are kept when the
        event came from that batch, else its canonical encoding is used."""
        rec = self._raw.get(item.position)
        if rec is not None:
            key, value, headers = rec.key, rec.value, tuple(rec.headers)
        else:
            encoded = encode_event(item.event)
            key, value, headers = encoded.key, encoded.value, tuple(encoded.headers)
        dl = DeadLetter(
            reason=reason,
            source_topic=item.position.topic,
            source_partition=item.position.partition,
            source_offset=item.position.offset,
            original_value=value,
            original_key=key,
            original_headers=headers,
            stage=stage,
        )
        return await self._publisher().publish(dl)
