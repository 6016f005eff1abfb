"""The projector service inside the worker: Kafka records -> LanceDB views, in batches,
resumable, never stuck. A ``mode`` service with its own group-less aiokafka consumer,
not a Faust agent: it owns every partition and resumes from the positions stored with
its rows (docs/architecture-services.md says why).

Records are read by :class:`~memstream.streams.projector_feed.ProjectorFeed` (fetch,
decode and write overlap) and handed over per batch to the
:class:`~memstream.services.projector.runtime.ProjectorRuntime`:

1. decoded; records that are not valid events are published to the dead-letter topic
   (stage ``decode``) and acknowledged by the broker *before* anything of their batch
   is written, so a crash can duplicate a dead letter but never lose one;
2. :meth:`Projector.apply` writes the rows and the positions in one call, on a single
   writer thread (LanceDB writes never block the loop);
3. events the projector could not apply become dead letters (stage ``project``).

While the projector keeps up with a trickle of writes, a small batch is followed by a
linger (:data:`LINGER_S`): what arrives meanwhile is written in the next commit,
so a steady stream makes a few commits a second, not one per fetch (each commit costs
the writer and every reader a new table version).

Positions always cover the whole batch, dead letters included, so a restart neither
re-reads them nor stalls before them, and a replay can prove it reached the end of
the log. Failures (LanceDB I/O, broker unavailable) are retried with back-off, the
same batch again: giving up on a batch would let the next batch's positions pass it.
The projector commits its progress to the group ``<app_id>.projector`` only as a hint
for lag monitors.

A worker holds :class:`~memstream.projections.store.dir_lock.LanceDirLock` on its directory
for as long as it runs (one writer per table set; a replay never swaps under it). If
the feed itself fails, the worker stops (fail-stop) rather than restart in place past
the failed batch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import faust
from aiokafka import TopicPartition
from mode import Service

from memstream.codec.fast_decode import FastMemoryDecoder
from memstream.projections.store import SwapRequest, TableSets
from memstream.services.projector.runtime import ProjectorRuntime
from memstream.settings import Settings
from memstream.streams.admin import topic_partitions
from memstream.streams.clients import KafkaConsumer, create_consumer
from memstream.streams.connect import until_started
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.projector_feed import FeedBatch, ProjectorFeed
from memstream.streams.topics import Topics
from memstream.streams.trust.legacy_trust import load_legacy_trust
from memstream.streams.trust.worker_identity import worker_key


__all__ = [
    "ready_file",
    "mark_ready",
    "register_projector",
    "add_projector",
    "ProjectorService",
    "feed_consumer",
    "projector_group",
]

log = logging.getLogger(__name__)

BATCH_SIZE = 10_000
"""Most records the projector writes in one LanceDB commit: a backlog goes in few large
commits (few table versions) while one batch's memory stays bounded."""
LINGER_S = 0.5
"""While keeping up with a trickle of writes, the projector commits at most this often:
a steady stream makes a couple of commits a second, and a write waits at most this long."""
_HINT_EVERY_S = 1.0
_SWAP_POLL_S = 0.1
_LINGER_CHECK_S = 0.05
LINGER_BELOW = 500
"""A batch this large is written without a linger; below it the linger shrinks with the batch."""
"""How often a linger looks at the records waiting on the log (it ends once they are many)."""
_HANDOVER_MAX_S = 600.0
"""Longest pause for a replay's hand-over; then the worker resumes on its own set."""


def projector_group(settings: Settings) -> str:
    """The consumer group the projector commits its progress to, as a hint for lag
    monitors only (``kafka-consumer-groups.sh --describe``); resuming never reads it."""
    return f"{settings.worker.app_id}.projector"


def ready_file(settings: Settings) -> Path:
    """Written once the projector reads its partitions: ``memstream up`` waits for it."""
    return settings.home / "worker.ready"


def mark_ready(settings: Settings, partitions: int) -> None:
    path = ready_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": os.getpid(), "partitions": partitions}) + "\n", encoding="utf-8")


def feed_consumer(settings: Settings, client_id: str, *, group_id: str | None = None) -> KafkaConsumer:
    """The projector's Kafka consumer: manual assignment (positions are kept with the
    rows; ``group_id`` only names where progress hints are committed), big fetches,
    metadata refreshed often enough to see new partitions."""
    return create_consumer(
        settings.broker,
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

    def __init__(self, app: faust.App, runtime: ProjectorRuntime) -> None:
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
        # Next offset past the last batch written, per (topic, partition): the linger's lag.
        self._written: dict[tuple[str, int], int] = {}

    async def on_start(self) -> None:
        await self.runtime.open()
        settings = self.runtime.settings

        self._consumer = await until_started(
            lambda: feed_consumer(settings, f"{settings.worker.app_id}-projector", group_id=projector_group(settings)),
            "projector consumer",
        )
        self._task = asyncio.ensure_future(self._run())
        self._swap_watch = asyncio.ensure_future(self._watch_swaps())

    async def _watch_swaps(self) -> None:
        """Answer a replay's hand-over request (see :mod:`memstream.projections.store.table_sets`)."""
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
                rt.settings.broker, names, client_id=f"{rt.settings.worker.app_id}-projector-admin"
            ),
            max_batch=BATCH_SIZE,
            fetch_records=min(2_000, BATCH_SIZE),
            poll_ms=max(1, int(rt.settings.worker.projector_batch_seconds * 1000)),
            fast_decoder=FastMemoryDecoder.for_projector(rt.projector),
            reroute=True,
            worker_key=worker_key(rt.settings.resolved_worker_key_file),
            legacy_trust=load_legacy_trust(rt.settings.resolved_worker_key_file),
            keys=SubjectKeys(rt.settings.streams, client_id=f"{rt.settings.worker.app_id}-keys") if rt.settings.security.sealing else None,
            partitions=partitions,
            on_reading=lambda n: mark_ready(rt.settings, n),
        )

    async def _apply(self, batch: "FeedBatch") -> None:
        started = time.monotonic()
        async with self._apply_lock:
            await self.runtime.apply_batch(batch)
        self._hint.update(batch.decoded.next_offsets)
        self._written.update(batch.decoded.next_offsets)
        if time.monotonic() - self._hinted_at >= _HINT_EVERY_S:
            await self._commit_hint()
        await self._linger(len(batch), started)

    async def _linger(self, records: int, started: float) -> None:
        """After a small batch while the projector keeps up, hold the next write until
        :data:`LINGER_S` after this one started, less by the batch's share of
        :data:`LINGER_BELOW` (250 records of 500: half the linger): the feed
        meanwhile fetches and decodes what arrives, and the next batch takes it all in
        one commit. A record thus waits at most the linger longer than without it. No linger after a large
        batch, nor once the records waiting on the log reach :data:`LINGER_BELOW`
        or outnumber the batch just written (behind: the feed's queue could not hold
        what a linger collects, and lingering would only fall further behind)."""
        below = LINGER_BELOW
        # shorter as the batch grows: a trickle waits it all, a fast stream a fraction
        deadline = started + LINGER_S * (1 - records / below)
        if records >= below or self._waiting() > records:
            return
        while (rest := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(rest, _LINGER_CHECK_S))
            if self._waiting() >= below:
                return

    def _waiting(self) -> int:
        """Records on the log past the last batch written, as of the feed's latest fetch
        responses (a partition not fetched yet counts nothing)."""
        consumer = self._consumer
        if consumer is None:
            return 0
        waiting = 0
        for tp in consumer.assignment():
            high = consumer.highwater(tp)
            written = self._written.get((tp.topic, tp.partition))
            if high is not None and written is not None:
                waiting += max(0, high - written)
        return waiting

    def _hint_consumer(self) -> Any:
        """Where progress hints are committed (a group member overrides it)."""
        return self._consumer

    async def _commit_hint(self) -> None:
        """Commit the progress hint (at most every ``_HINT_EVERY_S`` while running, and
        once on stop): a broker round trip per batch would sit on the write path."""
        consumer = self._hint_consumer()
        if not self._hint or consumer is None:
            self._hint = {}
            return
        offsets = {TopicPartition(t, p): o for (t, p), o in self._hint.items()}
        self._hint, self._hinted_at = {}, time.monotonic()
        try:
            await consumer.commit(offsets)
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
    app: faust.App,
    settings: Settings,
    topics: Topics,
    *,
    runtime: ProjectorRuntime | None = None,
) -> ProjectorRuntime:
    """Add the projector service and its maintenance timer to ``app``."""
    rt = runtime or ProjectorRuntime(settings, topics)
    add_projector(app, settings, ProjectorService(app, rt), rt.maintain)
    return rt


def add_projector(
    app: faust.App, settings: Settings, service: Service, maintain: Callable[[], Awaitable[None]]
) -> None:
    """Add a projector ``service`` to ``app``, and the timer that runs its tables'
    ``maintain`` every ``optimize_every_s``."""
    # an instance: faust starts instances as they are (``on_init_extra_service``); only
    # the decorator's annotation says a class
    app.service(service)  # type: ignore[arg-type]

    async def maintenance() -> None:
        await maintain()

    app.timer(settings.storage.optimize_every_s, name="memstream.lance-maintenance")(maintenance)
