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
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, IllegalStateError, RebalanceInProgressError

from memstream.domain.access import client_content_problem, system_claim
from memstream.domain.events import MessageObserved
from memstream.domain.log import LogPosition, PositionedEvent
from memstream.sealing import TamperedRecord
from memstream.settings import Settings, get_settings
from memstream.streams.deadletter import DeadLetter, DeadLetterPublisher
from memstream.streams.inflation_bound import bound_inflation, refusal
from memstream.streams.keys import SubjectKeys
from memstream.streams.legacy_trust import LegacyTrust, trusted_before
from memstream.streams.sealed_records import RecordOpener
from memstream.codec.wire import MAX_RECORD_BYTES, DecodeError, decode_record, encode_event
from memstream.streams.topics import Topics
from memstream.streams.connect import kafka_options

__all__ = ["ConsumedBatch", "decode_or_dead_letter", "EventConsumer", "MAX_SHARED_TURNS", "sharing_turns"]

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


class _SharedTurns:
    """Turns decoded by one reader of a worker, kept for the other.

    The extractor and the projector each read every record of ``messages`` (each
    with its own consumer, close behind each other) and each decoded every turn: a
    sixth of the worker's interpreter time in a bulk ingest. A turn decoded by one is
    kept here, by position, until the other asks for the same position; it is reused
    only when the record is the same bytes with the same headers, so the answer is
    the one decoding would give (decoding is a pure function of those). The first to
    ask again takes it out; at most :data:`MAX_SHARED_TURNS` turns and 32 MiB of
    records wait (the oldest go). Turns are kept only while an extractor runs in this
    process (:func:`sharing_turns`): a worker without one, or a replay, keeps nothing.
    With the projector decoding in its own process (``projector_decode_process``) the
    extractor's turns are never taken here; they only fill the bound.
    """

    def __init__(self, bound: int) -> None:
        self._bound = bound
        self._lock = threading.Lock()
        self._waiting: dict[tuple[str, int, int], tuple[bytes, Any, MessageObserved]] = {}
        self._bytes = 0
        self.sharers = 0

    def share(self, delta: int) -> None:
        with self._lock:
            self.sharers = max(0, self.sharers + delta)
            if not self.sharers:
                self._waiting.clear()
                self._bytes = 0

    def take(self, topic: str, partition: int, offset: int, value: bytes, headers: Any) -> MessageObserved | None:
        with self._lock:
            kept = self._waiting.pop((topic, partition, offset), None)
            if kept is not None:
                self._bytes -= len(kept[0])
        if kept is None or kept[0] != value or kept[1] != headers:
            return None
        return kept[2]

    def keep(self, topic: str, partition: int, offset: int, value: bytes, headers: Any, event: MessageObserved) -> None:
        if not self.sharers or len(value) > _MAX_SHARED_TURN_BYTES:
            return
        with self._lock:
            old = self._waiting.pop((topic, partition, offset), None)
            self._bytes += len(value) - (len(old[0]) if old is not None else 0)
            self._waiting[(topic, partition, offset)] = (value, headers, event)
            while self._waiting and (len(self._waiting) > self._bound or self._bytes > _MAX_SHARED_BYTES):
                self._bytes -= len(self._waiting.pop(next(iter(self._waiting)))[0])


MAX_SHARED_TURNS = 4_096
_MAX_SHARED_BYTES = 32 * 1024 * 1024
_MAX_SHARED_TURN_BYTES = 64 * 1024
_shared_turns = _SharedTurns(MAX_SHARED_TURNS)


@contextmanager
def sharing_turns() -> Iterator[None]:
    """While inside, readers of ``messages`` that pass ``share_turns`` keep the turns
    they decode for each other (the extractor holds this while it runs)."""
    _shared_turns.share(+1)
    try:
        yield
    finally:
        _shared_turns.share(-1)


def decode_or_dead_letter(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]] | None,
    *,
    max_bytes: int = MAX_RECORD_BYTES,
    share_turns: bool = False,
    trusted: Callable[[bytes | None, Sequence[tuple[str, bytes]] | None], bool] | None = None,
    legacy_trust: LegacyTrust | None = None,
) -> PositionedEvent | DeadLetter:
    """Decode one record; anything unusable becomes a :class:`DeadLetter` (never raises).

    ``share_turns``: a reader of ``messages`` in a worker where another reader decodes
    the same records (see :class:`_SharedTurns`). ``trusted``: the worker's producer
    identity check (``memstream.streams.worker_identity.verifier``); with it, a system
    event (``memstream.domain.access.system_claim``) from a record it does not
    accept is a dead letter, unless ``legacy_trust`` (:mod:`memstream.streams.legacy_trust`)
    puts its position in the unsigned past the operator trusts. The marker of a batch refused for inflating past the bound
    (:mod:`memstream.streams.inflation_bound`) is a dead letter with that reason."""
    refused = refusal(value, headers)
    if refused is not None:
        return DeadLetter(refused, topic, partition, offset, None, key, tuple((k, v or b"") for k, v in headers or ()), "decode")
    item = _decode_one(topic, partition, offset, key, value, headers, max_bytes, share_turns)
    if trusted is None or isinstance(item, DeadLetter):
        return item
    claim = system_claim(item.event)
    problem = (
        f"{claim}; the record does not carry the worker's producer identity"
        if claim is not None
        else _refused(client_content_problem(item.event))
    )
    if problem is None or trusted(value, headers):
        return item
    if claim is not None and trusted_before(legacy_trust, topic, partition, offset):
        return item
    return DeadLetter(
        reason=problem,
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        original_value=value,
        original_key=key,
        original_headers=tuple((k, v if v is not None else b"") for k, v in headers or ()),
        stage="decode",
    )


def _refused(problem: str | None) -> str | None:
    return None if problem is None else f"a client memory refused by the quality gate: {problem}"


def _decode_one(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]] | None,
    max_bytes: int,
    share_turns: bool,
) -> PositionedEvent | DeadLetter:
    # The headers as one comparable value, only for a reader that shares turns.
    frozen_headers = (tuple(headers) if headers else ()) if share_turns else ()
    if share_turns and value is not None:
        shared = _shared_turns.take(topic, partition, offset, value, frozen_headers)
        if shared is not None:
            return PositionedEvent(
                position=LogPosition(topic=topic, partition=partition, offset=offset), event=shared
            )
    try:
        event = decode_record(value, headers, max_bytes=max_bytes)
    except DecodeError as exc:
        return DeadLetter(
            reason=exc.reason,
            source_topic=topic,
            source_partition=partition,
            source_offset=offset,
            original_value=value,
            original_key=key,
            original_headers=tuple((k, v if v is not None else b"") for k, v in headers or ()),
            stage="decode",
        )
    if share_turns and value is not None and isinstance(event, MessageObserved):
        _shared_turns.keep(topic, partition, offset, value, frozen_headers, event)
    return PositionedEvent(position=LogPosition(topic=topic, partition=partition, offset=offset), event=event)


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


class EventConsumer:
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
        settings: Settings | None = None,
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
        self.settings = settings or get_settings()
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        if not self.topics:
            raise ValueError("EventConsumer needs at least one topic")
        self.group_id = group_id
        self.bootstrap_servers = bootstrap_servers or self.settings.bootstrap_servers
        self.dead_letter_topic = dead_letter_topic or Topics.from_settings(self.settings).dead_letter
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
            **kafka_options(self.settings, bootstrap_servers=self.bootstrap_servers),
            "client_id": self._client_id,
            "group_id": self.group_id,
            "enable_auto_commit": False,
            "auto_offset_reset": self._auto_offset_reset,
            "isolation_level": self._isolation_level,
        }
        options.update(self._consumer_options)
        bound_inflation(self.settings.max_inflated_batch_bytes)
        if self.settings.sealing and self._keys is None:  # the log is sealed: open what is read
            self._keys = await SubjectKeys(self.settings, client_id=f"{self._client_id}-keys").start()
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

    async def __aenter__(self) -> "EventConsumer":
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

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
                settings=self.settings,
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
                value, headers = rec.value, rec.headers
                if self.opener is not None:
                    try:
                        opened = self.opener.open(value, headers)
                    except TamperedRecord as exc:
                        dead.append(DeadLetter(str(exc), rec.topic, rec.partition, rec.offset, value, rec.key, tuple(headers or ())))
                        continue
                    if opened is None:  # a forgotten subject's record: skipped (opener.counts)
                        continue
                    value, headers = opened
                item = decode_or_dead_letter(
                    rec.topic,
                    rec.partition,
                    rec.offset,
                    rec.key,
                    value,
                    headers,
                    max_bytes=self._max_record_bytes,
                )
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
