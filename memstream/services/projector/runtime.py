"""What the projector service runs on, owned in one place: the LanceDB store and the
projector, the writer thread, the dead-letter publisher, retries and progress counters.
Blocking LanceDB work happens on the one writer thread, never on the event loop."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from memstream.codec.batch import PositionedMemories
from memstream.domain.log import PositionedEvent
from memstream.projections.store import TableSets
from memstream.services.shards import open_projector, open_store
from memstream.settings import Settings
from memstream.streams.dead_letters.publisher import DeadLetter, DeadLetterPublisher
from memstream.streams.projector_feed import FeedBatch
from memstream.streams.records.batches import DecodedBatch, RawRecord, project_dead_letters
from memstream.streams.rerouting import Rerouter
from memstream.streams.topics import Topics

__all__ = ["BatchOutcome", "ProjectorRuntime", "ProjectorStats", "apply_decoded"]

log = logging.getLogger(__name__)


_MAX_BACKOFF_S = 30.0

_PROGRESS_EVERY_S = 10.0


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
"""A batch of fewer records counts towards :data:`COMPACT_AFTER_COMMITS`: what a steady
stream of agents' writes commits (a bulk load's batches hold thousands)."""
COMPACT_AFTER_COMMITS = 8
"""Between maintenance runs, the projector also compacts after this many small commits:
a steady stream's recent fragments stay few (every query opens each one)."""


class ProjectorRuntime:
    """Everything the projector service needs, owned in one place: the LanceDB store,
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
            streams=settings.streams,
            client_id=f"{settings.worker.app_id}-projector-dlq",
        )
        self.sets = TableSets(settings.storage.root)
        self._open_lock = threading.Lock()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstream-lance")
        self._indexer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstream-index")
        self._embedding = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstream-embed")
        self._index_build: asyncio.Future[None] | None = None
        # -inf: a worker restarted more often than its cleanup cadence still drops old
        # versions at its first maintenance (else they pile up under kill storms).
        self._cleaned_at = float("-inf")
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
        if self._commits_since_compaction >= COMPACT_AFTER_COMMITS:
            await self.maintain(indexes=False)
        return outcome

    async def _until_done(self, attempt_fn: Any, records: Sequence[RawRecord], what: str) -> Any:
        """Retry ``attempt_fn`` with back-off until it succeeds (or the task is cancelled
        because the worker stops: the stored positions then say where the next run
        starts). Giving up would let the next batch's positions pass this one."""
        first, last = records[0], records[-1]
        span = f"{len(records)} records ({first.topic}:{first.partition}:{first.offset} .. {last.topic}:{last.partition}:{last.offset})"

        def failed(state: RetryCallState) -> None:
            self.stats.retries += 1
            exc = state.outcome.exception() if state.outcome else None
            log.error(
                "%s %s failed (attempt %d), retrying in %.1fs: %s: %s",
                what, span, state.attempt_number, state.upcoming_sleep, type(exc).__name__, exc,
                exc_info=exc if state.attempt_number == 1 else None,
            )

        async def call() -> Any:  # tenacity awaits only coroutine functions
            return await attempt_fn()

        # Exception, not BaseException: cancellation (the worker stopping) ends the retries
        return await AsyncRetrying(
            retry=retry_if_exception_type(Exception),
            wait=wait_exponential(multiplier=0.5, max=_MAX_BACKOFF_S),
            before_sleep=failed,
        )(call)

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
        fragment size, so only recent rows are rewritten), every half
        ``reader_grace_s`` drops the versions replaced longer than that ago, folds
        the new rows into the indexes (a reader meanwhile scans the few unindexed
        rows exactly) and starts the IVF_PQ build once it is due
        (minutes at a million rows). Beside the writer because the writer now mostly
        *appends* (new keys, positions), and LanceDB rebases an append over a
        compaction: on the writer thread, compaction paused projection long enough to
        set the freshness p99 (docs/benchmarks-history.md). A compaction that loses to a
        conflicting write (an upsert of known keys) is simply retried at the next call.
        Nothing starts while the indexer is busy.

        Between two timer calls, every :data:`COMPACT_AFTER_COMMITS` small batches
        (fewer than ``_SMALL_BATCH`` records: a bulk load's are large) the writer
        committed also start a compaction (``indexes=False``: without the index
        update, whose cost grows with the table): under a steady stream of writes
        the recent small fragments stay few, and every query of every reader
        opens each fragment."""
        if self._index_build is not None and not self._index_build.done():
            return
        cleanup = time.monotonic() - self._cleaned_at >= self.settings.storage.reader_grace_s / 2
        self._commits_since_compaction = 0
        self._index_build = asyncio.ensure_future(self._maintenance_round(cleanup, indexes))

    async def _maintenance_round(self, cleanup: bool, indexes: bool) -> None:
        # A forget's last step also deletes files no table version names yet, which a
        # write in flight would have committed: it runs on the writer thread, while
        # the indexer is idle (this round's own work starts after it).
        await self._in_writer(self._finish_shredding)
        await asyncio.get_running_loop().run_in_executor(self._indexer, self._maintain_beside_writer, cleanup, indexes)

    def _finish_shredding(self) -> None:
        projector = self.projector
        if hasattr(projector, "finish_shredding"):
            projector.finish_shredding()
        try:
            retired = self.sets.retire_previous(self.settings.storage.reader_grace_s)
        except OSError as exc:  # a maintenance task: the next round tries again
            log.warning("removing the replaced table set failed (will retry): %s", exc)
            return
        if retired:
            log.info("the table set a replay replaced is removed (%s)", retired)

    def _maintain_beside_writer(self, cleanup: bool, indexes: bool = True) -> None:
        started = time.monotonic()
        try:
            compacted = int(self.store.compact(refresh=False))
        except Exception as exc:  # noqa: BLE001 - a conflicting write wins; retried next time
            log.info("LanceDB compaction did not commit (will retry): %s: %s", type(exc).__name__, exc)
        else:
            if compacted:
                log.debug("compacted %d tables in %.2fs beside the writer", compacted, time.monotonic() - started)
        if cleanup:  # even when the compaction lost: under a busy writer it often does
            self._drop_replaced_versions()
        if indexes:
            self._update_indexes()

    def _drop_replaced_versions(self) -> None:
        try:
            dropped = self.store.cleanup_versions()
        except Exception as exc:  # noqa: BLE001 - retried at the next maintenance
            log.info("dropping replaced table versions failed (will retry): %s: %s", type(exc).__name__, exc)
        else:
            self._cleaned_at = time.monotonic()
            log.debug("dropped %s replaced table versions", dropped)

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
