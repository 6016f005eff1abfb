"""Reading the projector's topics: a plain aiokafka consumer feeding a three-stage
pipeline (fetch, decode, apply), shared by the worker and by ``memstream replay``.

Why not a Faust stream: the projector owns every partition of its topics anyway (one
writer per LanceDB directory, enforced by :class:`~memstream.projections.store.dir_lock.LanceDirLock`)
and resumes from the positions stored *with the rows*, never from Kafka's commits, so
a consumer group adds nothing but rebalances. Faust's per-record machinery (an event
object, an ack and a commit bookkeeping step for every record, then ``take_events``
buffering) cost more CPU than decoding and writing the record did, and it ran the
stages one after another. Here:

* **fetch** (the event loop): ``getmany`` of up to ``fetch_records`` records;
* **decode** (a decoder thread, or process): :func:`~memstream.streams.records.batches.decode_batch` of the fetched
  records, while the next fetch runs and the previous batch is being written.
  Decoding is Python (the fast path for canonical ``MemoryAdded`` records, pydantic
  for the rest) and so is part of the write path: in one process they take turns
  on the interpreter lock (LanceDB's own work runs beside them). A separate decoder
  process avoids that at the price of pickling the records there and the results
  back; on a machine without idle cores the thread is faster;
* **apply** (the caller's ``apply``, which runs in its own writer thread): everything
  fetched meanwhile (decoded, or still being decoded: milliseconds away) is coalesced
  into one batch of up to ``max_batch`` records. Under
  a backlog batches grow (LanceDB upserts cost less per row in bigger batches); when
  the projector keeps up, every fetch is applied at once (freshness).

The bounded queue between decode and apply is the back-pressure: when writing is the
bottleneck, fetching waits. Records arrive in log order per partition and every stage
keeps that order, so stored positions only ever move forward.

Assignment is manual: every partition of the topics, each starting at the position
the caller gives (the stored one; 0 if none). Partitions added to a topic later are
picked up within ``refresh_s`` seconds. With ``end_offsets`` (a replay) the feed stops
once every partition has reached its end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from memstream.codec.batch import PositionedMemories
from memstream.codec.fast_decode import FastMemoryDecoder
from memstream.streams.connect import until_started
from memstream.sealing import TamperedRecord
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.trust.legacy_trust import LegacyTrust
from memstream.streams.records.batches import DecodedBatch, RawRecord, decode_batch
from memstream.streams.records.codec import screen
from memstream.streams.sealing.sealed_records import RecordOpener

__all__ = ["FeedBatch", "ProjectorFeed", "raw_record", "merge_batches"]

log = logging.getLogger(__name__)

Offsets = Mapping[tuple[str, int], int]


@dataclass
class FeedBatch:
    """Records read in log order and what decoding made of them."""

    records: list[RawRecord]
    decoded: DecodedBatch

    def __len__(self) -> int:
        return len(self.records)


def raw_record(r: ConsumerRecord) -> RawRecord:  # type: ignore[type-arg]
    """An aiokafka record as the decoder's input (the decoder refuses a header
    without a value; dead letters store it as empty bytes)."""
    # positional, and aiokafka delivers header values as bytes (None for a header
    # without a value)
    return RawRecord(r.topic, r.partition, r.offset, r.key, r.value, tuple(r.headers) if r.headers else ())


def screened(r: ConsumerRecord) -> RawRecord:  # type: ignore[type-arg]
    """:func:`raw_record`, through the codec's route check first (before anything,
    keys included, looks at it): a refused record carries its reason."""
    rec = raw_record(r)
    refused = screen(rec.key, rec.headers)
    return rec if refused is None else rec._replace(refused=refused)


def merge_batches(batches: Sequence[FeedBatch]) -> FeedBatch:
    """Several consecutive batches as one (order kept, next offsets the furthest)."""
    if len(batches) == 1:
        return batches[0]
    records: list[RawRecord] = []
    events = []
    dead = []
    next_offsets: dict[tuple[str, int], int] = {}
    misrouted = []
    for b in batches:
        records.extend(b.records)
        events.extend(b.decoded.events)
        dead.extend(b.decoded.dead)
        misrouted.extend(b.decoded.misrouted)
        for k, v in b.decoded.next_offsets.items():
            next_offsets[k] = max(next_offsets.get(k, 0), v)
    memories = PositionedMemories.concat([b.decoded.memories for b in batches if b.decoded.memories])
    return FeedBatch(
        records,
        DecodedBatch(events=events, dead=dead, next_offsets=next_offsets, memories=memories, misrouted=misrouted),
    )


class ProjectorFeed:
    """Feeds decoded batches of ``topics`` to ``apply`` until cancelled (or, with
    ``end_offsets``, until every partition is read to its end).

    ``consumer`` must be started and not subscribed; the feed assigns it. ``start``
    gives each partition's first offset (missing: 0, the log's beginning, which Kafka
    moves to the earliest offset still held). ``list_partitions`` names the partitions
    of existing topics (:func:`memstream.streams.admin.topic_partitions`). ``on_decoded`` runs on the loop for
    every fetched batch right after decoding, in order, before that batch can reach
    ``apply`` (the worker publishes decode-stage dead letters there).
    ``fast_decoder`` (the projector's embedding model and dimension) turns on the fast
    read path for canonical ``MemoryAdded`` records (:func:`decode_batch`).
    ``reroute`` sets apart the records that sit on another partition than their key's
    (``DecodedBatch.misrouted``; the caller re-publishes them in ``on_decoded``).
    ``worker_key`` dead-letters system events the worker did not sign, except those
    ``legacy_trust`` places in the trusted unsigned past. ``keys`` (a
    keyring; one not started yet is started and stopped by :meth:`run`) opens sealed
    records before decoding; one sealed under a forgotten key is skipped
    (``opener.counts``) and its position passed.
    ``partitions`` limits the feed to those partition numbers of every topic (the
    shards a worker in a consumer group owns); re-routing still counts them all.
    ``on_reading`` is called with the number of partitions once they are assigned.
    """

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        topics: Sequence[str],
        apply: Callable[[FeedBatch], Awaitable[None]],
        *,
        start: Offsets,
        end_offsets: Offsets | None = None,
        on_decoded: Callable[[FeedBatch], Awaitable[None]] | None = None,
        max_batch: int = 10_000,
        fetch_records: int = 2_000,
        poll_ms: int = 200,
        refresh_s: float = 30.0,
        list_partitions: Callable[[Sequence[str]], Awaitable[Mapping[str, Sequence[int]]]],
        name: str = "projector",
        fast_decoder: FastMemoryDecoder | None = None,
        reroute: bool = False,
        worker_key: bytes | None = None,
        keys: SubjectKeys | None = None,
        partitions: frozenset[int] | None = None,
        legacy_trust: LegacyTrust | None = None,
        on_reading: Callable[[int], None] | None = None,
    ) -> None:
        if max_batch < 1 or fetch_records < 1:
            raise ValueError("batch sizes must be at least 1")
        self.consumer = consumer
        self.topics = tuple(topics)
        self._apply = apply
        self._list_partitions = list_partitions
        self.name = name
        self._on_decoded = on_decoded
        self._start = dict(start)
        self._ends = dict(end_offsets) if end_offsets is not None else None
        self.max_batch = max_batch
        self.fetch_records = min(fetch_records, max_batch)
        self.poll_ms = poll_ms
        self.refresh_s = refresh_s
        # Offset after the last record fetched, per partition: where a re-assignment
        # must resume (assign() forgets positions and buffered records).
        self._next: dict[TopicPartition, int] = {}
        self._done: set[TopicPartition] = set()
        self._queue: asyncio.Queue[FeedBatch | None] = asyncio.Queue(
            maxsize=max(2, -(-max_batch // self.fetch_records))
        )
        # one thread: decoding in a process lost to pickling (docs/benchmarks.md)
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstream-decode")
        self._fast = fast_decoder
        # Partitions per topic (with ``reroute``): records off their key's partition
        # are set apart by the decoder (``DecodedBatch.misrouted``).
        self._reroute = reroute
        self._counts: dict[str, int] = {}
        self._worker_key = worker_key
        self._legacy_trust = dict(legacy_trust) if legacy_trust else None
        self._keys = keys
        self.opener: RecordOpener | None = None
        # The partitions this feed reads (a worker in a group: the shards it owns).
        self._only = partitions
        # Fetched batches being decoded, in fetch order (two in flight at most).
        self._decoding: asyncio.Queue[tuple[list[RawRecord], asyncio.Future[DecodedBatch]] | None] = asyncio.Queue(
            maxsize=2
        )
        self.fetched = 0
        self._on_reading = on_reading  # told the partition count once they are assigned
        # Fetched batches not yet in ``_queue`` (being decoded, or waiting to be).
        self._undecoded = 0

    # ------------------------------------------------------------------ assignment
    async def _known_partitions(self) -> list[TopicPartition]:
        found = await self._list_partitions(self.topics)
        self._counts = {t: len(found[t]) for t in self.topics if found.get(t)}
        return [
            TopicPartition(t, p)
            for t in self.topics
            for p in sorted(found.get(t, ()))
            if self._only is None or p in self._only
        ]

    def _assign(self, partitions: Sequence[TopicPartition]) -> None:
        self.consumer.assign(list(partitions))
        for tp in partitions:
            if tp not in self._next:
                self._next[tp] = int(self._start.get((tp.topic, tp.partition), 0))
            self.consumer.seek(tp, self._next[tp])
            if self._reached_end(tp):
                self._done.add(tp)
        for tp in self._done:
            self.consumer.pause(tp)

    def _reached_end(self, tp: TopicPartition) -> bool:
        if self._ends is None:
            return False
        return self._next.get(tp, 0) >= self._ends.get((tp.topic, tp.partition), 0)

    async def _initial_partitions(self) -> list[TopicPartition]:
        parts = await self._known_partitions()
        if self._ends is not None:
            parts = [tp for tp in parts if (tp.topic, tp.partition) in self._ends] or parts
        return parts

    # ------------------------------------------------------------------ stages
    def _finished(self) -> bool:
        return self._ends is not None and all(self._reached_end(tp) for tp in self.consumer.assignment())

    async def _fetch(self) -> None:
        """Fetch, and hand each fetched batch to the decoder at once: the next fetch
        overlaps the decoding of the last (they wait in order in ``_decoding``)."""
        loop = asyncio.get_running_loop()
        last_refresh = time.monotonic()
        while not self._finished():
            polled = await self.consumer.getmany(timeout_ms=self.poll_ms, max_records=self.fetch_records)
            records: list[RawRecord] = []
            for tp, recs in polled.items():
                end = None if self._ends is None else self._ends.get((tp.topic, tp.partition), 0)
                for r in recs:
                    if end is not None and r.offset >= end:
                        break
                    records.append(screened(r))
                    self._next[tp] = r.offset + 1
                if end is not None and self._next.get(tp, 0) >= end and tp not in self._done:
                    self._done.add(tp)
                    self.consumer.pause(tp)
            if self._ends is not None:
                # A partition whose tail holds only transaction markers never yields
                # its last offsets as records: the consumer's position says it is done.
                for tp in self.consumer.assignment():
                    if tp not in self._done and await self.consumer.position(tp) >= self._ends.get((tp.topic, tp.partition), 0):
                        self._next[tp] = max(self._next.get(tp, 0), self._ends.get((tp.topic, tp.partition), 0))
                        self._done.add(tp)
                        self.consumer.pause(tp)
            if records:
                self.fetched += len(records)
                if self._keys is not None:
                    await self._keys.prepare((r.value, r.headers) for r in records if r.refused is None)
                    records = self._opened(records)
                decoding = loop.run_in_executor(
                    self._decoder, decode_batch, records, self._fast,
                    dict(self._counts) if self._reroute else None, self._worker_key, self._legacy_trust, True,
                )
                self._undecoded += 1
                await self._decoding.put((records, decoding))
            if self._ends is None and time.monotonic() - last_refresh >= self.refresh_s:
                last_refresh = time.monotonic()
                await self._maybe_add_partitions()
        await self._decoding.put(None)

    def _opened(self, records: list[RawRecord]) -> list[RawRecord]:
        """Records with sealed values opened (here, on the loop: a decoder process could
        not hold the keys); one that cannot be opened keeps its place as a marker that
        :func:`decode_batch` passes (forgotten) or dead-letters (altered)."""
        assert self.opener is not None
        out: list[RawRecord] = []
        for r in records:
            if r.refused is not None:
                out.append(r)
                continue
            try:
                opened = self.opener.open(r.value, r.headers)
            except TamperedRecord as exc:
                out.append(r._replace(refused=str(exc)))
                continue
            if opened is None:
                out.append(r._replace(refused=""))
            elif opened[0] is not r.value:
                out.append(r._replace(value=opened[0], headers=tuple(opened[1] or ())))
            else:
                out.append(r)
        return out

    async def _decoded_in_order(self) -> None:
        """Batches leave decoding in the order they were fetched (one decoder: in order
        anyway), go through ``on_decoded``, then queue for the applier."""
        while True:
            item = await self._decoding.get()
            if item is None:
                break
            records, decoding = item
            batch = FeedBatch(records, await decoding)
            if self._on_decoded is not None:
                await self._on_decoded(batch)
            await self._queue.put(batch)
            self._undecoded -= 1
        await self._queue.put(None)  # read to the end: the applier drains and returns

    async def _maybe_add_partitions(self) -> None:
        try:
            known = await self._known_partitions()
        except Exception as exc:  # noqa: BLE001 - a missed refresh is retried next time
            log.warning("could not refresh the partitions of %s: %s", ", ".join(self.topics), exc)
            return
        assigned = self.consumer.assignment()
        new = [tp for tp in known if tp not in assigned]
        if new:
            log.info("new partitions %s: assigning them", ", ".join(f"{t.topic}:{t.partition}" for t in new))
            self._assign(sorted(set(known) | set(assigned)))

    async def _apply_loop(self) -> None:
        ended = False
        while not ended:
            first = await self._queue.get()
            if first is None:
                return
            parts = [first]
            size = len(first)
            # What was fetched meanwhile joins this batch, including the batches still
            # being decoded (milliseconds away): one write of them all costs less than
            # a write each (a LanceDB commit per table has a fixed cost), and they
            # would wait for this write anyway. Nothing fetched later is waited for.
            expected = self._queue.qsize() + self._undecoded
            while size < self.max_batch and expected > 0:
                nxt = await self._queue.get()
                expected -= 1
                if nxt is None:
                    ended = True
                    break
                parts.append(nxt)
                size += len(nxt)
            await self._apply(merge_batches(parts))

    async def run(self) -> None:
        """Assign, then fetch/decode and apply concurrently until done or cancelled.
        An exception in either stage stops both and propagates."""
        own_keys = self._keys is not None and self._keys.keyring is None
        if self._keys is not None:
            if own_keys:
                await until_started(lambda: self._keys, f"{self.name} keyring")  # type: ignore[arg-type,return-value]
            self.opener = RecordOpener(self._keys.keyring, worker_key=self._worker_key)
        try:
            await self._read()
        finally:
            if own_keys:
                await self._keys.stop()  # type: ignore[union-attr]

    async def _read(self) -> None:
        self._assign(await self._initial_partitions())
        log.info(
            "%s reading %d partitions of %s",
            self.name,
            len(self.consumer.assignment()),
            ", ".join(self.topics),
        )
        if self._on_reading is not None:
            self._on_reading(len(self.consumer.assignment()))
        tasks = [
            asyncio.ensure_future(self._fetch()),
            asyncio.ensure_future(self._decoded_in_order()),
            asyncio.ensure_future(self._apply_loop()),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # the first failure, if any
            await asyncio.gather(*tasks)  # the applier ended: the others have too
        finally:
            for task in tasks:
                if not task.done():
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._decoder.shutdown(wait=True)
