"""The projector inside the worker: Kafka records -> LanceDB views, in batches,
resumable, never stuck.

Records are read by :class:`~memstream.streams.projector_feed.ProjectorFeed` (fetch,
decode and write overlap; see there why not through a Faust stream) and handed over
per batch:

1. decoded (in the decoder process); records that are not valid events are
   published to the dead-letter topic (stage ``decode``) and acknowledged by the
   broker *before* anything of their batch is written
   (:meth:`ProjectorRuntime.publish_decode_dead`), so a crash can duplicate a dead
   letter but never lose one;
2. :meth:`Projector.apply` writes the rows and the positions in one call, in a
   single dedicated writer thread (LanceDB writes never block the loop);
3. events the projector could not apply become dead letters (stage ``project``).

Positions always cover the whole batch, dead letters included (:func:`apply_decoded`),
so a restart neither re-reads them nor stalls before them, and a replay can prove it
reached the end of the log.

Failures (LanceDB I/O, broker unavailable) are retried with back-off, the same
batch again, until they succeed or the worker stops: giving up on a batch would let
the next batch's positions pass it. The worker resumes from the *stored* positions,
never from Kafka's commits (the projector commits its progress to the group
``<app_id>.projector`` only as a hint for lag monitors).

Maintenance (:meth:`ProjectorRuntime.maintain`) keeps the indexes current beside the
writer and compacts on the writer thread now and then. A worker holds
:class:`LanceDirLock` on its directory for as long as it runs (one writer per table
set; a replay never swaps under it). If the feed itself fails, the worker stops
(fail-stop) rather than restart in place past the failed batch.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from mode import Service

from memstream.codec.batch import PositionedMemories
from memstream.codec.fast_decode import FastMemoryDecoder
from memstream.domain.log import PositionedEvent
from memstream.projections.table_sets import SwapRequest, TableSets
from memstream.services.shard_routing import open_projector, open_store
from memstream.settings import Settings
from memstream.streams.admin import topic_partitions
from memstream.streams.connect import until_started
from memstream.streams.deadletter import DeadLetter, DeadLetterPublisher
from memstream.streams.projector_feed import FeedBatch, ProjectorFeed
from memstream.streams.record_batches import DecodedBatch, RawRecord, project_dead_letters
from memstream.streams.keys import SubjectKeys
from memstream.streams.rerouting import Rerouter
from memstream.streams.topics import Topics
from memstream.streams.worker_identity import worker_key

if TYPE_CHECKING:
    from memstream.services.app import MemstreamApp

__all__ = [
    "BatchOutcome", "ProjectorStats", "ProjectorRuntime", "apply_decoded", "register_projector",
    "ProjectorService", "feed_consumer", "projector_group",
]

log = logging.getLogger(__name__)

_MAX_BACKOFF_S = 30.0
_PROGRESS_EVERY_S = 10.0
_HINT_EVERY_S = 1.0
_SWAP_POLL_S = 0.1
_HANDOVER_MAX_S = 600.0
"""Longest pause for a replay's hand-over; then the worker resumes on its own set."""


@dataclass
class BatchOutcome:
    """What one batch did: ``skipped`` were already applied (below the stored position)."""

    records: int = 0
    applied: int = 0
    skipped: int = 0
    dead_decode: list[DeadLetter] = field(default_factory=list)
    dead_project: list[DeadLetter] = field(default_factory=list)


@dataclass
class ProjectorStats:
    """Running totals of one worker process (for logs and metrics)."""

    batches: int = 0
    records: int = 0
    applied: int = 0
    skipped: int = 0
    dead_decode: int = 0
    dead_project: int = 0
    retries: int = 0
    rerouted: int = 0


class _ApplyResult(Protocol):
    applied: int
    skipped: int
    failed: list[tuple[PositionedEvent, str]]


class _Projector(Protocol):
    def apply(self, batch: Sequence[PositionedEvent], memories: PositionedMemories | None = None) -> Any: ...

    def positions(self) -> dict[tuple[str, int], int]: ...

    def save_positions(self, next_offsets: dict[tuple[str, int], int]) -> None: ...


def apply_decoded(projector: _Projector, decoded: DecodedBatch) -> _ApplyResult:
    """Apply a decoded batch and make the stored positions cover *all* its records.

    ``Projector.apply`` stores positions for the events it was given; records that
    became dead letters are not events, so when a partition's batch ends with dead
    letters (or holds nothing else) its position is moved past them here. Without
    this a restart would dead-letter them again, and a replay could never verify that
    its positions reached the end offsets. Blocking: call it in the writer thread.
    """
    result = projector.apply(decoded.events, decoded.memories)
    covered = decoded.covered()
    tail = {k: v for k, v in decoded.next_offsets.items() if v > covered.get(k, 0)}
    if tail:
        projector.save_positions(tail)
    return cast(_ApplyResult, result)


_SMALL_BATCH = 500
"""A batch of fewer records counts towards ``compact_after_commits``: what a steady
stream of agents' writes commits (a bulk load's batches hold thousands)."""


class ProjectorRuntime:
    """Everything the projector agent needs, owned in one place: the LanceDB store,
    the projector, the writer thread, the dead-letter publisher, progress counters."""

    def __init__(
        self,
        settings: Settings,
        topics: Topics,
        *,
        store: Any | None = None,
        projector: _Projector | None = None,
        dead_letters: DeadLetterPublisher | None = None,
    ) -> None:
        self.settings = settings
        self.topics = topics
        self.source_topics: tuple[str, ...] = (topics.events, topics.messages)
        self._store = store
        self._projector = projector
        self._dead_letters = dead_letters or DeadLetterPublisher(
            topics.dead_letter,
            settings=settings,
            client_id=f"{settings.app_id}-projector-dlq",
        )
        self.sets = TableSets(settings.lance_dir)
        self._open_lock = threading.Lock()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstream-lance")
        self._indexer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstream-index")
        self._embedding = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstream-embed")
        self._index_build: asyncio.Future[None] | None = None
        self._cleaned_at = time.monotonic()
        self._commits_since_compaction = 0
        self.stats = ProjectorStats()
        self._window_records = 0
        self._window_started = time.monotonic()

    # --- lazily opened resources (opening LanceDB is I/O: keep it off import time) ---

    # (Both are first touched from worker threads: the lock keeps it to one instance.)

    @property
    def store(self) -> Any:
        with self._open_lock:
            if self._store is None:
                self._store = open_store(self.settings, self.sets.current())
            return self._store

    @property
    def projector(self) -> _Projector:
        store = self.store
        with self._open_lock:
            if self._projector is None:
                self._projector = open_projector(store, self.settings)
            return self._projector

    async def reopen(self, make: Callable[[], tuple[Any, Any]]) -> None:
        """Write into the (store, projector) ``make`` opens (in the writer thread: after the write in flight)."""
        def install() -> None:
            store, projector = make()
            with self._open_lock:
                self._store, self._projector = store, projector
        await self._in_writer(install)

    async def switch_to_current(self) -> None:
        """Write into the set ``CURRENT`` names from the next batch on (a replay swapped
        it in while this worker was paused; its positions equal or pass ours)."""
        def make() -> tuple[Any, Any]:
            store = open_store(self.settings, self.sets.current())
            return store, open_projector(store, self.settings)
        await self.reopen(make)

    async def _in_writer(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._writer, fn, *args)

    async def open(self) -> None:
        """Open the store and the projector (in the writer thread) and the publisher."""
        await self._in_writer(lambda: self.projector)
        await self._dead_letters.start()

    async def close(self) -> None:
        """Stop the publisher; wait for a write in flight to finish (never cut it off)."""
        try:
            await self._dead_letters.stop()
        finally:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, self._embedding.shutdown, True)
            await loop.run_in_executor(None, self._writer.shutdown, True)
            # An index build in progress is abandoned (nothing is committed until it
            # ends; the next worker starts it again).
            self._indexer.shutdown(wait=False, cancel_futures=True)

    # --- positions ---------------------------------------------------------------------

    async def positions(self) -> Mapping[tuple[str, int], int]:
        """The stored next offsets (read on the default pool: reads never wait for a
        write in progress; a slightly older answer only means re-reading a few records
        the projector then skips)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: dict(self.store.positions()))

    # --- the batch -----------------------------------------------------------------------

    def _apply(self, decoded: DecodedBatch) -> _ApplyResult:
        return apply_decoded(self.projector, decoded)

    async def publish_decode_dead(self, batch: "FeedBatch") -> None:
        """Re-publish a batch's misrouted records to their key's partition, then publish
        its decode-stage dead letters (each retried until the broker acks): they must
        be safe on the broker before any position can pass them, so a crash can
        duplicate a copy or a dead letter but never lose one."""
        if batch.decoded.misrouted:
            rerouter = Rerouter(self._dead_letters.producer)
            await self._until_done(lambda: rerouter.publish(batch.decoded.misrouted), batch.records, "re-routing")
            self.stats.rerouted += len(batch.decoded.misrouted)
        if batch.decoded.dead:
            await self._until_done(
                lambda: self._dead_letters.publish_many(batch.decoded.dead), batch.records, "dead-lettering"
            )

    async def prepare_batch(self, batch: "FeedBatch") -> None:
        """Between decoding and writing: publish the batch's decode-stage dead letters,
        then embed its memories that carry no vector (:meth:`Projector.embed_ahead`,
        on the embedding thread while the writer writes the batch before; the feed
        keeps fetching and decoding meanwhile). A failed embedding is left to the
        write, which embeds what is still missing and retries like any write."""
        await self.publish_decode_dead(batch)
        embed_ahead = getattr(self.projector, "embed_ahead", None)
        if embed_ahead is None:
            return
        decoded = batch.decoded
        try:
            await asyncio.get_running_loop().run_in_executor(
                self._embedding, embed_ahead, decoded.events, decoded.memories
            )
        except Exception as exc:  # noqa: BLE001 - the write embeds (and retries) instead
            log.warning("embedding ahead failed, the write will embed: %s: %s", type(exc).__name__, exc)

    async def apply_batch(self, batch: "FeedBatch") -> BatchOutcome:
        """Write one decoded batch (retried with back-off until it succeeds or the
        worker stops), then dead-letter the events the projector refused."""
        result = await self._until_done(lambda: self._in_writer(self._apply, batch.decoded), batch.records, "projecting")
        dead_project = project_dead_letters(result.failed, batch.records)
        if dead_project:
            await self._until_done(
                lambda: self._dead_letters.publish_many(dead_project), batch.records, "dead-lettering"
            )
        outcome = BatchOutcome(
            records=len(batch.records),
            applied=result.applied,
            skipped=result.skipped,
            dead_decode=batch.decoded.dead,
            dead_project=dead_project,
        )
        self._count(outcome)
        if outcome.records < _SMALL_BATCH:
            self._commits_since_compaction += 1
        if self._commits_since_compaction >= self.settings.compact_after_commits:
            await self.maintain(indexes=False)
        return outcome

    async def _until_done(self, attempt_fn: Any, records: Sequence[RawRecord], what: str) -> Any:
        """Retry ``attempt_fn`` with back-off until it succeeds (or the task is cancelled
        because the worker stops: the stored positions then say where the next run
        starts). Giving up would let the next batch's positions pass this one."""
        attempt = 0
        while True:
            try:
                return await attempt_fn()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the projector must never stop
                attempt += 1
                self.stats.retries += 1
                delay = min(_MAX_BACKOFF_S, 0.5 * 2 ** min(attempt - 1, 6))
                first, last = records[0], records[-1]
                log.error(
                    "%s %d records (%s:%d:%d .. %s:%d:%d) failed (attempt %d), retrying in %.1fs: %s: %s",
                    what,
                    len(records),
                    first.topic,
                    first.partition,
                    first.offset,
                    last.topic,
                    last.partition,
                    last.offset,
                    attempt,
                    delay,
                    type(exc).__name__,
                    exc,
                    exc_info=attempt == 1,
                )
                await asyncio.sleep(delay)

    def _count(self, outcome: BatchOutcome) -> None:
        t = self.stats
        t.batches += 1
        t.records += outcome.records
        t.applied += outcome.applied
        t.skipped += outcome.skipped
        t.dead_decode += len(outcome.dead_decode)
        t.dead_project += len(outcome.dead_project)
        self._window_records += outcome.records
        now = time.monotonic()
        elapsed = now - self._window_started
        if elapsed >= _PROGRESS_EVERY_S:
            log.info(
                "projected %d records in %.0fs (%.0f/s); total %d: %d applied, %d already applied, %d dead letters",
                self._window_records,
                elapsed,
                self._window_records / elapsed,
                t.records,
                t.applied,
                t.skipped,
                t.dead_decode + t.dead_project,
            )
            self._window_records, self._window_started = 0, now

    async def maintain(self, *, indexes: bool = True) -> None:
        """Keep the table set fast to read without stalling the writer.

        Every call (``optimize_every_s``) runs on the indexer thread, *beside* the
        writer: it merges the small fragments of recent batches (a small target
        fragment size, so only recent rows are rewritten), drops old versions every
        ``cleanup_every_s``, folds the new rows into the indexes (a reader meanwhile
        scans the few unindexed rows exactly) and starts the IVF_PQ build once it is due
        (minutes at a million rows). Beside the writer because the writer now mostly
        *appends* (new keys, positions), and LanceDB rebases an append over a
        compaction: on the writer thread, compaction paused projection for 0.6-1.0 s
        every 10 s under load, which set the freshness p99 (1.2 s; 0.6 s beside). A
        compaction that loses to a conflicting write (an upsert of known keys) is
        simply retried at the next call. Nothing starts while the indexer is busy.

        Between two timer calls, every ``compact_after_commits`` small batches
        (fewer than ``_SMALL_BATCH`` records: a bulk load's are large) the writer
        committed also start a compaction (``indexes=False``: without the index
        update, whose cost grows with the table): under a steady stream of writes
        the recent small fragments stay few, and every query of every reader
        opens each fragment (a search cost 2-3 times as much with 30 small
        fragments as with one, docs/benchmarks.md)."""
        if self._index_build is not None and not self._index_build.done():
            return
        loop = asyncio.get_running_loop()
        cleanup = time.monotonic() - self._cleaned_at >= self.settings.cleanup_every_s
        self._commits_since_compaction = 0
        self._index_build = loop.run_in_executor(self._indexer, self._maintain_beside_writer, cleanup, indexes)

    def _maintain_beside_writer(self, cleanup: bool, indexes: bool = True) -> None:
        started = time.monotonic()
        if hasattr(self.projector, "finish_shredding"):
            self.projector.finish_shredding()  # type: ignore[attr-defined]  # a forget's last step
        try:
            compacted = self._compact(cleanup)
        except Exception as exc:  # noqa: BLE001 - a conflicting write wins; retried next time
            log.info("LanceDB compaction did not commit (will retry): %s: %s", type(exc).__name__, exc)
        else:
            if cleanup:
                self._cleaned_at = time.monotonic()
            if compacted:
                log.debug("compacted %d tables in %.2fs beside the writer", compacted, time.monotonic() - started)
        if indexes:
            self._update_indexes()

    def _compact(self, cleanup: bool) -> int:
        compacted = int(self.store.compact(refresh=False))
        if cleanup:
            self.store.cleanup_versions()
        return compacted

    def _update_indexes(self) -> None:
        try:
            started = time.monotonic()
            self.store.optimize_indexes()
            self.store.ensure_base_indexes()
            log.debug("index update took %.2fs", time.monotonic() - started)
            if self.store.vector_index_due():
                self.store.build_vector_index()
        except Exception as exc:  # noqa: BLE001 - retried at the next maintenance
            log.warning("index maintenance failed (will retry): %s: %s", type(exc).__name__, exc)


def projector_group(settings: Settings) -> str:
    """The consumer group the projector commits its progress to, as a hint for lag
    monitors only (``kafka-consumer-groups.sh --describe``); resuming never reads it."""
    return f"{settings.app_id}.projector"


def feed_consumer(settings: Settings, client_id: str, *, group_id: str | None = None) -> Any:
    """The projector's Kafka consumer: manual assignment (positions are kept with the
    rows; ``group_id`` only names where progress hints are committed), big fetches,
    metadata refreshed often enough to see new partitions."""
    from aiokafka import AIOKafkaConsumer

    return AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        client_id=client_id,
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
        metadata_max_age_ms=30_000,
    )


class ProjectorService(Service):
    """The projector inside the Faust worker: opens the runtime, reads the topics from
    the stored positions through a :class:`~memstream.streams.projector_feed.ProjectorFeed`
    and stops the worker (fail-stop) if the feed itself fails: a restart resumes from
    the stored positions, a silent restart in place could skip a batch."""

    logger = logging.getLogger("memstream.faust")

    def __init__(self, app: "MemstreamApp", runtime: ProjectorRuntime) -> None:
        super().__init__()
        self.app = app
        self.runtime = runtime
        self._consumer: Any = None
        self._task: asyncio.Task[None] | None = None
        self._hint: dict[tuple[str, int], int] = {}
        self._hinted_at = 0.0
        # Held while a batch is written; a replay's hand-over takes it to pause.
        self._apply_lock = asyncio.Lock()
        self._swap_watch: asyncio.Task[None] | None = None
        self._settled: set[str] = set()

    async def on_start(self) -> None:
        await self.runtime.open()
        settings = self.runtime.settings

        self._consumer = await until_started(
            lambda: feed_consumer(settings, f"{settings.app_id}-projector", group_id=projector_group(settings)),
            "projector consumer",
        )
        self._task = asyncio.ensure_future(self._run())
        self._swap_watch = asyncio.ensure_future(self._watch_swaps())

    async def _watch_swaps(self) -> None:
        """Answer a replay's hand-over request (see :mod:`memstream.projections.table_sets`)."""
        sets = self.runtime.sets
        while True:
            await asyncio.sleep(_SWAP_POLL_S)
            request = sets.swap_request()
            if request is None or request.id in self._settled:
                continue
            async with self._apply_lock:
                await self._hand_over(sets, request)

    async def _hand_over(self, sets: TableSets, request: SwapRequest) -> None:
        sets.pause(request)
        log.info("replay (pid %d) swaps in set %s: paused", request.pid, request.target)
        deadline = time.monotonic() + _HANDOVER_MAX_S
        try:
            while True:
                if sets.current_name() == request.target:
                    await self.runtime.switch_to_current()
                    log.info("now projecting into the replayed set %s", request.target)
                    return
                gone = sets.swap_request() != request or not request.alive
                if gone or time.monotonic() > deadline:
                    if sets.current_name() == request.target:
                        continue  # swapped just before the request went away
                    log.warning("replay hand-over to %s abandoned: resuming on the current set", request.target)
                    return
                await asyncio.sleep(0.05)
        finally:
            self._settled.add(request.id)
            sets.resume()

    async def _run(self) -> None:
        rt = self.runtime
        try:
            start = await rt.positions()
            log.info(
                "projector resuming %s from stored positions (%d partitions stored)",
                " + ".join(rt.source_topics),
                len(start),
            )
            await self._feed(start).run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.critical("projector failed; stopping the worker: %s: %s", type(exc).__name__, exc)
            await self.app.crash(exc)
            raise

    def _feed(self, start: Mapping[tuple[str, int], int], partitions: frozenset[int] | None = None) -> ProjectorFeed:
        rt = self.runtime
        return ProjectorFeed(
            self._consumer,
            rt.source_topics,
            self._apply,
            start=start,
            on_decoded=rt.prepare_batch,
            list_partitions=lambda names: topic_partitions(
                rt.settings.bootstrap_servers, names, client_id=f"{rt.settings.app_id}-projector-admin"
            ),
            max_batch=rt.settings.projector_batch_size,
            fetch_records=min(2_000, rt.settings.projector_batch_size),
            poll_ms=max(1, int(rt.settings.projector_batch_seconds * 1000)),
            decode_in_process=rt.settings.projector_decode_process,
            fast_decoder=FastMemoryDecoder.for_projector(rt.projector, rt.settings.projector_fast_path),
            reroute=True,
            worker_key=worker_key(rt.settings),
            keys=SubjectKeys(rt.settings, client_id=f"{rt.settings.app_id}-keys") if rt.settings.sealing else None,
            partitions=partitions,
        )

    async def _apply(self, batch: "FeedBatch") -> None:
        async with self._apply_lock:
            await self.runtime.apply_batch(batch)
        self._hint.update(batch.decoded.next_offsets)
        if time.monotonic() - self._hinted_at >= _HINT_EVERY_S:
            await self._commit_hint()

    async def _commit_hint(self) -> None:
        """Commit the progress hint (at most every ``_HINT_EVERY_S`` while running, and
        once on stop): a broker round trip per batch would sit on the write path."""
        from aiokafka import TopicPartition

        if not self._hint:
            return
        offsets = {TopicPartition(t, p): o for (t, p), o in self._hint.items()}
        self._hint, self._hinted_at = {}, time.monotonic()
        try:
            await self._consumer.commit(offsets)
        except Exception as exc:  # noqa: BLE001 - a hint; the stored positions are the truth
            log.debug("could not commit the projector's progress hint: %s: %s", type(exc).__name__, exc)

    async def on_stop(self) -> None:
        try:
            if self._swap_watch is not None:
                self._swap_watch.cancel()
                await asyncio.gather(self._swap_watch, return_exceptions=True)
            if self._task is not None:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
            if self._consumer is not None:
                await self._commit_hint()
                await self._consumer.stop()
        finally:
            await self.runtime.close()


def register_projector(
    app: "MemstreamApp",
    settings: Settings,
    topics: Topics,
    *,
    runtime: ProjectorRuntime | None = None,
) -> ProjectorRuntime:
    """Add the projector service and its maintenance timer to ``app``."""
    rt = runtime or ProjectorRuntime(settings, topics)
    app.service(ProjectorService(app, rt))

    async def maintenance() -> None:
        await rt.maintain()

    app.timer(settings.optimize_every_s, name="memstream.lance-maintenance")(maintenance)
    return rt
