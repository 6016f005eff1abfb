"""Rebuild every view from offset 0 into a new table set, catch up, verify, swap it in,
while the worker keeps projecting and readers keep searching.

Why: the log is the source of truth and the views are derived, so they can always be
rebuilt, after a projector bug, a schema change, an embedding model change, or to prove
that the live set is what the log says (crashes and restarts included).

How (``memstream replay``; table sets and the hand-over in
:mod:`memstream.projections.store.table_sets`):

1. snapshot the end offsets of ``<prefix>messages`` and ``<prefix>events``;
2. read both topics from their beginning with a plain aiokafka consumer and apply
   every batch through the very same decode + :class:`~memstream.projections.projector.projector.Projector`
   path as the worker, into a new set ``<lance_dir>/sets/<UTC time>``. Records that do
   not decode are counted, not re-published (the worker dead-lettered them); records
   off their key's partition are re-published only if the live worker had not reached
   them (:mod:`memstream.streams.rerouting`);
3. with a worker running: catch up to the live set's positions (they move) in rounds,
   then ask the worker to pause (it finishes its write in flight), catch up exactly,
   verify, point ``CURRENT`` at the new set in one atomic rename, and the worker goes
   on writing into it. Without one, the replay holds the root's lock (no worker can
   start), reads to the snapshot and swaps;
4. verify: every stored position reached the snapshot's end offset (and the live
   set's positions), every record read was applied, skipped, dead-lettered or found
   misrouted; digests (row count and content hashes per table) of the new and the live
   set are compared and every difference is reported. The log explains a difference
   only where the two sets stand at different positions, so the new set is also
   compared with the live one at the same positions (after the exact catch-up with a
   worker running; without one, when the build reaches the live set's positions,
   before it reads on): a difference there is reported by memory space and the set
   is *not* swapped in (exit non-zero) unless ``force``, which swaps it in anyway
   (the operator trusts the fold over the live set, e.g. after a projector fix).

Readers follow ``CURRENT`` (each search runs on one set, whole); the replaced set is
kept until the next replay, which deletes it. ``--dry-run`` builds and compares, then
deletes the new set; so does an error or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from memstream.codec.fast_decode import FastMemoryDecoder
from memstream.projections.store import LanceDirBusyError, LanceDirLock, StoreError, TableSets
from memstream.services.projector import apply_decoded
from memstream.services.replay.diff import space_differences, space_digests
from memstream.services.replay.finish import (
    PHASE_COMPACT,
    PHASE_SWAP,
    PHASE_VECTOR_INDEX,
    PHASE_VERIFY,
    PHASES,
    ReplayError,
    finish,
    open_live,
    train_vector_index,
)
from memstream.services.replay.report import ReplayProgress, ReplayReport
from memstream.services.shards import routing as shard_routing
from memstream.settings import Settings
from memstream.streams.admin import topic_partitions
from memstream.streams.clients import KafkaConsumer, create_consumer
from memstream.streams.records.inflation_bound import bound_inflation
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.trust.legacy_trust import LegacyTrust, LegacyTrustError, load_legacy_trust
from memstream.streams.producers.producer import create_kafka_producer
from memstream.streams.projector_feed import FeedBatch, ProjectorFeed
from memstream.streams.rerouting import Rerouter
from memstream.streams.topics import Topics
from memstream.streams.trust.worker_identity import worker_key as load_worker_key

__all__ = [
    "ReplayError",
    "replay",
    "PHASES",
    "PHASE_COMPACT",
    "PHASE_VECTOR_INDEX",
    "PHASE_VERIFY",
    "PHASE_SWAP",
]

log = logging.getLogger(__name__)

DEFAULT_BATCH = 10_000
"""Replay batch size: LanceDB upserts get much faster with bigger batches."""

Digest = Mapping[str, tuple[int, str]]



def _utc_stamp(now: datetime) -> str:
    return now.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z"


def _open_store(path: Path, settings: Settings) -> Any:
    return shard_routing.open_store(settings, path)  # sharded when settings.storage.sharded


def _open_projector(store: Any, settings: Settings) -> Any:
    return shard_routing.open_projector(store, settings)


async def _partitions(settings: Settings, topic_names: Sequence[str]) -> list[TopicPartition]:
    try:
        found = await topic_partitions(
            settings.broker, topic_names, client_id="memstream-replay-admin"
        )
    except KafkaError as exc:
        raise ReplayError(f"cannot reach Kafka at {settings.broker.bootstrap_servers}: {exc}") from exc
    partitions: list[TopicPartition] = []
    for name in topic_names:
        if name not in found:
            raise ReplayError(f"topic {name} does not exist (create it with `memstream topics create`)")
        partitions.extend(TopicPartition(name, p) for p in found[name])
    return partitions


async def _listed(partitions: Sequence[TopicPartition]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for tp in partitions:
        out.setdefault(tp.topic, []).append(tp.partition)
    return out


async def _consume_into(
    consumer: KafkaConsumer,
    partitions: list[TopicPartition],
    begins: Mapping[TopicPartition, int],
    ends: Mapping[TopicPartition, int],
    projector: Any,
    report: ReplayReport,
    batch_size: int,
    on_progress: Callable[[ReplayProgress], None] | None,
    expected: int,
    *,
    fast_path: bool = True,
    on_decoded: Callable[[FeedBatch], Awaitable[None]] | None = None,
    started: float | None = None,
    all_partitions: Sequence[TopicPartition] | None = None,
    worker_key: bytes | None = None,
    keys: SubjectKeys | None = None,
    legacy_trust: LegacyTrust | None = None,
) -> None:
    """Read the given partitions from ``begins`` to ``ends`` through the same pipelined
    feed as the worker (fetch, decode and write overlap). ``expected`` is the total
    the progress reports count towards."""
    loop = asyncio.get_running_loop()
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstream-replay")
    embedding = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstream-replay-embed")
    started = time.monotonic() if started is None else started

    async def decoded(batch: FeedBatch) -> None:
        if on_decoded is not None:  # misrouted records re-published before positions pass them
            await on_decoded(batch)
        if hasattr(projector, "embed_ahead"):
            # memories without a vector of the new model are embedded while the writer
            # writes the batch before (a replay to switch embedders embeds every memory)
            await loop.run_in_executor(embedding, projector.embed_ahead, batch.decoded.events, batch.decoded.memories)

    async def apply(batch: FeedBatch) -> None:
        result = await loop.run_in_executor(writer, apply_decoded, projector, batch.decoded)
        report.records += len(batch.records)
        report.applied += result.applied
        report.skipped += result.skipped
        report.dead_decode += len(batch.decoded.dead)
        report.dead_project += len(result.failed)
        report.misrouted += len(batch.decoded.misrouted)
        if on_progress is not None:
            on_progress(ReplayProgress(report.records, expected, time.monotonic() - started))

    feed = ProjectorFeed(
        consumer,
        sorted({tp.topic for tp in partitions}),
        apply,
        start={(tp.topic, tp.partition): begins[tp] for tp in partitions},
        end_offsets={(tp.topic, tp.partition): ends[tp] for tp in partitions},
        # every partition of the topics: their count says which partition a key belongs to
        list_partitions=lambda names: _listed(all_partitions or partitions),
        name="replay",
        on_decoded=decoded,
        fast_decoder=FastMemoryDecoder.for_projector(projector, fast_path),
        worker_key=worker_key,
        keys=keys,
        legacy_trust=legacy_trust,
        max_batch=batch_size,
        fetch_records=min(batch_size, 5_000),
        reroute=True,
    )
    try:
        if on_progress is not None:
            on_progress(ReplayProgress(report.records, expected, time.monotonic() - started))
        await feed.run()
    finally:
        if feed.opener is not None:
            report.unreadable += feed.opener.counts.skipped
        embedding.shutdown(wait=True)
        writer.shutdown(wait=True)


def _live_positions(live_dir: Path, settings: Settings) -> dict[tuple[str, int], int]:
    """The live set's stored positions (empty without one): how far the worker has
    handled each partition, re-routing included."""
    if not shard_routing.has_projection(live_dir):
        return {}
    try:
        store = shard_routing.open_store(settings, live_dir, create=False)
    except StoreError:
        return {}
    return {k: int(v) for k, v in store.positions().items()}


class _MisroutedBeyond:
    """The replay's share of re-routing: a misrouted record below the live set's
    position was re-published by the worker already (its copy is in the log); one at
    or past it was not, so the replay re-publishes it (once the live worker reaches it,
    it would too: projection of the copies is idempotent)."""

    def __init__(self, settings: Settings, handled: Mapping[tuple[str, int], int], report: ReplayReport) -> None:
        self._settings = settings
        self._handled = handled
        self._report = report
        self._producer: Any = None

    async def publish(self, batch: FeedBatch) -> None:
        todo = [
            (rec, target)
            for rec, target in batch.decoded.misrouted
            if rec.offset >= self._handled.get((rec.topic, rec.partition), 0)
        ]
        if not todo:
            return
        if self._producer is None:
            self._producer = create_kafka_producer(self._settings.broker, client_id="memstream-replay-reroute")
            await self._producer.start()
        await Rerouter(self._producer).publish(todo)
        self._report.rerouted += len(todo)

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()


CATCH_UP_ROUNDS = 10
"""Catch-up rounds towards a running worker before it is asked to pause."""
PAUSE_WAIT_S = 60.0
"""How long a replay waits for a running worker to pause for the swap."""


async def replay(
    settings: Settings,
    *,
    dry_run: bool = False,
    force: bool = False,
    batch_size: int = DEFAULT_BATCH,
    on_progress: Callable[[ReplayProgress], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    build_vector_index: bool = False,
) -> ReplayReport:
    """Rebuild into a new table set, catch up, verify and (unless ``dry_run``) make it
    current. See the module doc.

    ``on_progress`` is called before the first batch and after every batch;
    ``on_phase`` names each step after the build (:data:`PHASES`), possibly from
    another thread. With a worker running, it keeps projecting during the build and
    is paused only for the last catch-up and the switch (it then writes into the new
    set); without one, the replay holds the root's lock so none starts meanwhile.
    The built set is removed whenever it is not swapped in (``dry_run``, an error,
    Ctrl-C, a divergence from live without ``force``). ``force`` swaps in a set that
    diverges from live at the same positions (``report.diverged`` still lists where).
    The IVF_PQ vector index (due from ``vector_index_threshold`` memories) is never
    trained before the swap: the new set serves as soon as it is verified (searches
    are exact until the index exists, as on a live set that just crossed the
    threshold), and the worker's maintenance trains it beside its writer. With
    ``build_vector_index`` (no worker to do it), the replay trains it after the swap,
    still holding the root's lock. ``report.vector_index_due`` says whether one is due.
    Raises :class:`ReplayError` with one readable line.
    """
    if batch_size < 1:
        raise ReplayError("batch size must be at least 1")
    sets = TableSets(settings.storage.root)
    replays = LanceDirLock(sets.root / "replay")
    try:
        replays.acquire("memstream replay")
    except LanceDirBusyError as exc:
        raise ReplayError(f"another replay is running ({exc})") from None
    workers = LanceDirLock(sets.root)
    name = _utc_stamp(now())
    try:
        worker_running = False
        if not dry_run:
            try:
                workers.acquire("memstream replay")  # no worker may start until the swap
            except LanceDirBusyError:
                worker_running = True
                _refuse_group_workers(sets.root)
        sets.cleanup()  # sets of earlier replays nobody reads any more (killed ones too)
        report = ReplayReport(live_dir=sets.current(), replay_dir=sets.new_set(name), dry_run=dry_run, forced=force)
        try:
            await _replay(
                settings, sets, report, name, worker_running=worker_running,
                batch_size=batch_size, on_progress=on_progress, on_phase=on_phase or (lambda _: None),
            )
            if report.swapped and report.vector_index_due and build_vector_index and not worker_running:
                await train_vector_index(settings, report, on_phase or (lambda _: None))
        finally:
            if not report.swapped:
                sets.remove_set(name)
        if report.swapped:
            sets.cleanup()  # the set the replaced one had replaced: nobody reads it any more
        return report
    finally:
        workers.release()
        replays.release()


def _refuse_group_workers(root: Path) -> None:
    """Workers in a consumer group (sharded set) share the root's lock; the hand-over
    pauses one worker only, so a replay waits until they are stopped."""
    probe = LanceDirLock(root)
    try:
        probe.acquire("memstream replay (probe)", shared=True)
    except LanceDirBusyError:
        return  # one worker holds it alone: it takes part in the hand-over
    probe.release()
    raise ReplayError(
        "workers in a consumer group are writing the sharded set: stop them, replay, then start them again"
    )


class _Build:
    """The set being built, its consumer and how to feed it a range of offsets."""

    def __init__(self, settings: Settings, report: ReplayReport, batch_size: int,
                 on_progress: Callable[[ReplayProgress], None] | None) -> None:
        self.settings, self.report, self.batch_size, self.on_progress = settings, report, batch_size, on_progress
        self.started = time.monotonic()
        self.expected = 0
        self.store: Any = None
        self.projector: Any = None
        self.consumer: KafkaConsumer | None = None
        self.partitions: list[TopicPartition] = []
        self.rerouter: _MisroutedBeyond | None = None
        self.keys: SubjectKeys | None = None
        self.legacy_trust: dict[tuple[str, int], int] = {}
        # Opening writes (tables, indexes): its own thread, waited for on close, so a
        # Ctrl-C during it cannot leave a thread writing into a set being removed.
        self._opener = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstream-replay-open")

    async def open(self, topics: Topics, handled: Mapping[tuple[str, int], int]) -> dict[TopicPartition, int]:
        loop = asyncio.get_running_loop()
        self.partitions = await _partitions(self.settings, (topics.messages, topics.events))
        bound_inflation()
        try:
            self.legacy_trust = load_legacy_trust(self.settings.resolved_worker_key_file)
        except LegacyTrustError as exc:
            raise ReplayError(str(exc)) from None
        self.consumer = create_consumer(
            self.settings.broker, group_id=None, enable_auto_commit=False,
            auto_offset_reset="earliest", client_id="memstream-replay",
            max_partition_fetch_bytes=4 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024,
        )
        try:
            await self.consumer.start()
        except KafkaError as exc:
            raise ReplayError(f"cannot reach Kafka at {self.settings.broker.bootstrap_servers}: {exc}") from exc
        if self.settings.security.sealing:
            self.keys = await SubjectKeys(self.settings.streams, topics, client_id="memstream-replay-keys").start()
        self.store = await loop.run_in_executor(self._opener, _open_store, self.report.replay_dir, self.settings)
        self.projector = await loop.run_in_executor(self._opener, _open_projector, self.store, self.settings)
        self.rerouter = _MisroutedBeyond(self.settings, handled, self.report)
        return dict(await self.consumer.beginning_offsets(self.partitions))

    async def feed(self, begins: Mapping[TopicPartition, int], ends: Mapping[TopicPartition, int]) -> None:
        todo = [tp for tp in self.partitions if ends.get(tp, 0) > begins.get(tp, 0)]
        if not todo:
            return
        assert self.consumer is not None and self.rerouter is not None
        self.expected += sum(ends[tp] - begins[tp] for tp in todo)
        await _consume_into(
            self.consumer, todo, begins, ends, self.projector, self.report, self.batch_size,
            self.on_progress, self.expected, on_decoded=self.rerouter.publish, started=self.started,
            all_partitions=self.partitions, worker_key=load_worker_key(self.settings.resolved_worker_key_file), keys=self.keys,
            legacy_trust=self.legacy_trust,
        )

    def positions(self) -> dict[TopicPartition, int]:
        stored = self.store.positions()
        return {tp: int(stored.get((tp.topic, tp.partition), 0)) for tp in self.partitions}

    async def close(self) -> None:
        try:
            if self.consumer is not None:
                await self.consumer.stop()
            if self.rerouter is not None:
                await self.rerouter.stop()
            if self.keys is not None:
                await self.keys.stop()
        finally:
            self._opener.shutdown(wait=True)


async def _replay(
    settings: Settings,
    sets: TableSets,
    report: ReplayReport,
    name: str,
    *,
    worker_running: bool,
    batch_size: int,
    on_progress: Callable[[ReplayProgress], None] | None,
    on_phase: Callable[[str], None],
) -> None:
    loop = asyncio.get_running_loop()
    live_dir = report.live_dir
    build = _Build(settings, report, batch_size, on_progress)
    try:
        with report.timed("connect"):
            handled = await loop.run_in_executor(None, _live_positions, live_dir, settings)
            begins = await build.open(Topics.from_settings(settings.broker), handled)
            assert build.consumer is not None
            ends = await build.consumer.end_offsets(build.partitions)
        report.end_offsets = {(tp.topic, tp.partition): ends[tp] for tp in build.partitions}
        report.expected_records = sum(ends[tp] - begins[tp] for tp in build.partitions)
        cut = None if worker_running else _cut(handled, ends)
        if cut is not None:  # the live set stands inside the log: compare there first
            with report.timed("read_project"):
                await build.feed(begins, cut)
            with report.timed("compare"):
                await loop.run_in_executor(build._opener, _compare_at, build, report, live_dir, settings, handled)
            begins = cut
        with report.timed("read_project"):
            await build.feed(begins, ends)
        if worker_running:
            with report.timed("catch_up"):
                await _catch_up(build, live_dir, settings)
            request = sets.request_swap(name)
            try:
                with report.timed("wait_pause"):
                    await _await_pause(sets, request.id)
                with report.timed("catch_up"):
                    await _catch_up(build, live_dir, settings, rounds=1)  # the worker is paused: exact
                await finish(build.store, build._opener, report, live_dir, settings, on_phase)
                if report.swappable:
                    _swap(sets, name, report, on_phase)
            finally:
                sets.withdraw(request)
        else:
            await finish(build.store, build._opener, report, live_dir, settings, on_phase)
            if not report.dry_run and report.swappable:
                _swap(sets, name, report, on_phase)
        if report.swapped:
            report.old_dir = live_dir
    finally:
        with report.timed("close"):
            await build.close()
        report.elapsed_s = time.monotonic() - build.started


def _swap(sets: TableSets, name: str, report: ReplayReport, on_phase: Callable[[str], None]) -> None:
    on_phase(PHASE_SWAP)
    with report.timed("swap"):
        sets.point_to(name)
    report.swapped = True


def _cut(handled: Mapping[tuple[str, int], int], ends: Mapping[TopicPartition, int]) -> dict[TopicPartition, int] | None:
    """The live set's positions, when it has some and stands before the snapshot's end."""
    if not handled:
        return None
    cut = {tp: min(end, handled.get((tp.topic, tp.partition), 0)) for tp, end in ends.items()}
    return cut if cut != dict(ends) else None


def _compare_at(build: _Build, report: ReplayReport, live_dir: Path, settings: Settings,
                handled: Mapping[tuple[str, int], int]) -> None:
    """Compare the new set with the live one, both at the live positions ``handled``
    (if the live set moved meanwhile, a dry run beside a worker, nothing is compared)."""
    if _live_positions(live_dir, settings) != dict(handled):
        return
    report.compared = True
    report.diverged = space_differences(space_digests(open_live(live_dir, settings)), space_digests(build.store))


async def _catch_up(build: _Build, live_dir: Path, settings: Settings, rounds: int = CATCH_UP_ROUNDS) -> None:
    """Feed the new set up to the live set's positions (which move while the worker
    runs), until the gap is under one batch or ``rounds`` are done."""
    loop = asyncio.get_running_loop()
    for _ in range(rounds):
        live = await loop.run_in_executor(None, _live_positions, live_dir, settings)
        have = await loop.run_in_executor(None, build.positions)
        target = {tp: max(have[tp], live.get((tp.topic, tp.partition), 0)) for tp in build.partitions}
        gap = sum(target[tp] - have[tp] for tp in build.partitions)
        if gap == 0:
            return
        await build.feed(have, target)
        if gap < build.batch_size and rounds > 1:
            return


async def _await_pause(sets: TableSets, request_id: str) -> None:
    deadline = time.monotonic() + PAUSE_WAIT_S
    while sets.paused_for() != request_id:
        if time.monotonic() > deadline:
            raise ReplayError(
                f"the running worker did not pause for the swap within {PAUSE_WAIT_S:.0f}s "
                "(is it an older memstream?); nothing was swapped"
            )
        await asyncio.sleep(0.05)

