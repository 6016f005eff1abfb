"""Rebuild every view from offset 0 into a fresh table set, verify it, swap it in.

Why: the log is the source of truth and the views are derived, so they can always be
rebuilt, after a projector bug, a schema change, an embedding model change, or to prove
that the live set is what the log says (crashes and restarts included).

How (``memstream replay``):

1. snapshot the end offsets of ``<prefix>messages`` and ``<prefix>events``; the
   replay covers everything below them (events arriving meanwhile are the worker's
   job after the swap: the new set's positions say where it must resume);
2. read both topics from their beginning with a plain aiokafka consumer (manual
   assignment, no consumer group, ``getmany``) and apply every batch through the very
   same decode + :class:`~memstream.projections.projector.Projector` path as the
   worker, into ``<lance_dir>.replay-<UTC time>`` next to the live directory. Records
   that do not decode are counted, not re-published (the worker already dead-lettered
   them when it met them);
3. verify the new set is complete: its stored position of every partition equals the
   snapshot's end offset, and every record read was applied, skipped as already
   applied, or dead-lettered. The digests (row count and content hashes per table,
   :meth:`LanceStore.table_digest`) of the new and the live set are compared and every
   difference is reported: the live set may lag (worker behind) or lead (newer events)
   and that is information, but a live set that covers exactly the same positions and
   still differs is a projection bug;
4. swap: ``<lance_dir>`` -> ``<lance_dir>.old-<time>`` then ``<lance_dir>.replay-<time>``
   -> ``<lance_dir>`` (two renames on one filesystem; readers that open tables by path,
   like the HTTP API, see the old set until the first rename and the new one after the
   second). The projector worker must not run during the swap: it holds open table
   handles for the old set. So a replay that will swap takes the directory's lock
   (``<lance_dir>.lock``, the one every worker holds while it runs) before it starts:
   it refuses at once while a worker runs, and no worker can start until the swap is
   done. Stop the worker, replay (the live set keeps serving reads during the whole
   build), then start the worker again: it resumes from the new set's positions.
   ``--force`` skips the lock (restart the worker right after).

``--dry-run`` builds and compares but keeps the live set; the rebuilt set stays on
disk for inspection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from memstream.settings import Settings
from memstream.streams.admin import topic_partitions
from memstream.streams.fast_decode import FastMemoryDecoder
from memstream.streams.projector_agent import LanceDirBusyError, LanceDirLock, apply_decoded
from memstream.streams.producer import create_kafka_producer
from memstream.streams.projector_feed import FeedBatch, ProjectorFeed
from memstream.streams.rerouting import Rerouter
from memstream.streams.topics import Topics

__all__ = [
    "ReplayError",
    "ReplayProgress",
    "ReplayReport",
    "TableDiff",
    "replay",
    "replay_sync",
    "RichProgress",
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

PHASE_COMPACT = "compacting"
PHASE_VECTOR_INDEX = "training the vector index"
PHASE_VERIFY = "verifying"
PHASE_SWAP = "swapping in"
PHASES = (PHASE_COMPACT, PHASE_VECTOR_INDEX, PHASE_VERIFY, PHASE_SWAP)
"""The steps after the build, in order (the vector index only when one is due)."""


class ReplayError(RuntimeError):
    """The replay could not be built, did not verify, or could not be swapped in."""


@dataclass(frozen=True)
class ReplayProgress:
    done: int
    total: int
    elapsed_s: float

    @property
    def rate(self) -> float:
        return self.done / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True)
class TableDiff:
    table: str
    live: tuple[int, str] | None
    replay: tuple[int, str] | None


@dataclass
class ReplayReport:
    live_dir: Path
    replay_dir: Path
    old_dir: Path | None = None
    swapped: bool = False
    dry_run: bool = False
    records: int = 0
    expected_records: int = 0
    applied: int = 0
    skipped: int = 0
    dead_decode: int = 0
    dead_project: int = 0
    misrouted: int = 0
    """Records off their key's partition: not projected where they are (their copy on
    the right partition is); re-published by the replay when the live worker had not
    reached them yet (``rerouted``)."""
    rerouted: int = 0
    end_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    positions: dict[tuple[str, int], int] = field(default_factory=dict)
    replay_digest: dict[str, tuple[int, str]] = field(default_factory=dict)
    live_digest: dict[str, tuple[int, str]] | None = None
    live_positions: dict[tuple[str, int], int] | None = None
    elapsed_s: float = 0.0

    @property
    def differences(self) -> list[TableDiff]:
        """Tables whose row count or digest differ between live and replay."""
        if self.live_digest is None:
            return []
        tables = sorted(set(self.live_digest) | set(self.replay_digest))
        return [
            TableDiff(t, self.live_digest.get(t), self.replay_digest.get(t))
            for t in tables
            if self.live_digest.get(t) != self.replay_digest.get(t)
        ]

    @property
    def live_matches(self) -> bool | None:
        """True when the live set equals the replay, None when there is no live set."""
        return None if self.live_digest is None else not self.differences

    @property
    def rate(self) -> float:
        return self.records / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> str:
        """One line for people."""
        if self.live_digest is None:
            compare = "no live set to compare"
        elif not self.differences:
            compare = "live set identical"
        else:
            parts = []
            for d in self.differences:
                live = d.live[0] if d.live else "-"
                new = d.replay[0] if d.replay else "-"
                parts.append(f"{d.table} {live}->{new}")
            compare = "differs from live: " + ", ".join(parts)
        dead = self.dead_decode + self.dead_project
        action = (
            f"swapped in (old set kept at {self.old_dir})"
            if self.swapped
            else f"dry run, kept at {self.replay_dir}"
        )
        return (
            f"replayed {self.records} records in {self.elapsed_s:.1f}s ({self.rate:.0f}/s): "
            f"{self.applied} applied, {dead} dead letters; verified; {compare}; {action}"
        )


class RichProgress:
    """A rich progress bar (records/s, time left from the end offsets) as a callback."""

    def __init__(self, description: str = "replay") -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:>8.0f} events/s"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            transient=False,
        )
        self._description = description
        self._task = self._progress.add_task(description, total=None, rate=0.0)

    def __enter__(self) -> "RichProgress":
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def __call__(self, p: ReplayProgress) -> None:
        self._progress.update(self._task, completed=p.done, total=max(p.total, 1), rate=p.rate)

    def phase(self, name: str) -> None:
        """Show the step after the build (the bar is full by then; elapsed time runs on)."""
        self._progress.update(self._task, description=f"{self._description}: {name}")


def _utc_stamp(now: datetime) -> str:
    return now.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z"


def _open_store(path: Path, settings: Settings) -> Any:
    from memstream.projections.store import LanceStore

    return LanceStore.from_settings(settings, path)


def _open_projector(store: Any, settings: Settings) -> Any:
    from memstream.projections.embedder import build_embedder
    from memstream.projections.projector import Projector

    return Projector(store, build_embedder(settings))


async def _partitions(settings: Settings, topic_names: Sequence[str]) -> list[TopicPartition]:
    try:
        found = await topic_partitions(
            settings.bootstrap_servers, topic_names, client_id="memstream-replay-admin"
        )
    except KafkaError as exc:
        raise ReplayError(f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}") from exc
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
    consumer: AIOKafkaConsumer,
    partitions: list[TopicPartition],
    begins: Mapping[TopicPartition, int],
    ends: Mapping[TopicPartition, int],
    projector: Any,
    report: ReplayReport,
    batch_size: int,
    on_progress: Callable[[ReplayProgress], None] | None,
    expected: int,
    *,
    decode_in_process: bool = False,
    fast_path: bool = True,
    on_decoded: Callable[[FeedBatch], Awaitable[None]] | None = None,
) -> None:
    """Read every partition from its beginning to its snapshot end through the same
    pipelined feed as the worker (fetch, decode and write overlap)."""
    loop = asyncio.get_running_loop()
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstream-replay")
    embedding = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstream-replay-embed")
    started = time.monotonic()

    async def embed_ahead(batch: FeedBatch) -> None:
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
        list_partitions=lambda names: _listed(partitions),
        name="replay",
        on_decoded=embed_ahead if hasattr(projector, "embed_ahead") else None,
        decode_in_process=decode_in_process,
        fast_decoder=FastMemoryDecoder.for_projector(projector, fast_path),
        max_batch=batch_size,
        fetch_records=min(batch_size, 5_000),
        reroute=True,
        on_decoded=on_decoded,
    )
    try:
        if on_progress is not None:
            on_progress(ReplayProgress(0, expected, 0.0))
        await feed.run()
    finally:
        embedding.shutdown(wait=True)
        writer.shutdown(wait=True)
    report.elapsed_s = time.monotonic() - started


def _live_positions(live_dir: Path, settings: Settings) -> dict[tuple[str, int], int]:
    """The live set's stored positions (empty without one): how far the worker has
    handled each partition, re-routing included."""
    from memstream.projections.store import LanceStore, StoreError

    if not (live_dir / "positions.lance").exists():
        return {}
    try:
        store = LanceStore.from_settings(settings, live_dir, create=False)
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
            self._producer = create_kafka_producer(self._settings, client_id="memstream-replay-reroute")
            await self._producer.start()
        await Rerouter(self._producer).publish(todo)
        self._report.rerouted += len(todo)

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()


def _verify(report: ReplayReport) -> None:
    problems = []
    for key, end in sorted(report.end_offsets.items()):
        got = report.positions.get(key, 0)
        if end > 0 and got != end:
            problems.append(f"{key[0]}:{key[1]} position {got} != end offset {end}")
    accounted = report.applied + report.skipped + report.dead_decode + report.dead_project + report.misrouted
    if accounted != report.records:
        problems.append(
            f"{report.records} records read but {accounted} accounted for "
            f"(applied {report.applied}, skipped {report.skipped}, dead {report.dead_decode + report.dead_project})"
        )
    if report.records < report.expected_records:
        # Offsets may hold transaction markers (never delivered), so fewer records than
        # offsets is fine as long as every position reached its end (checked above).
        log.info(
            "%d records for %d offsets (transaction markers take offsets)",
            report.records,
            report.expected_records,
        )
    if problems:
        raise ReplayError(
            f"replay in {report.replay_dir} is incomplete, not swapped: " + "; ".join(problems[:5])
        )


def _swap(report: ReplayReport, stamp: str) -> None:
    live, new = report.live_dir, report.replay_dir
    old = live.with_name(f"{live.name}.old-{stamp}")
    if live.exists():
        live.rename(old)
        try:
            new.rename(live)
        except OSError:
            old.rename(live)  # put the live set back: never leave no set at all
            raise
        report.old_dir = old
    else:
        new.rename(live)
    report.swapped = True


async def replay(
    settings: Settings,
    *,
    dry_run: bool = False,
    force: bool = False,
    batch_size: int = DEFAULT_BATCH,
    on_progress: Callable[[ReplayProgress], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> ReplayReport:
    """Rebuild, verify and (unless ``dry_run``) swap in the views. See the module doc.

    ``on_progress`` is called before the first batch and after every batch of the
    build; ``on_phase`` names each step after it (:data:`PHASES`: compaction, index
    builds, which take minutes at a million memories, verification, swap), possibly
    from another thread, so a user is never left looking at a finished bar.

    Unless ``dry_run``, the directory's :class:`LanceDirLock` is held from start to
    swap: a running worker makes the replay refuse at once (before any work), and no
    worker can start until the swap is done. ``force`` skips the lock (the worker
    must then be restarted right after the swap). Raises :class:`ReplayError` with
    one readable line.
    """
    if batch_size < 1:
        raise ReplayError("batch size must be at least 1")
    live_dir = Path(settings.lance_dir)
    stamp = _utc_stamp(now())
    replay_dir = live_dir.with_name(f"{live_dir.name}.replay-{stamp}")
    if replay_dir.exists():
        raise ReplayError(f"{replay_dir} already exists")
    report = ReplayReport(live_dir=live_dir, replay_dir=replay_dir, dry_run=dry_run)

    lock = LanceDirLock(live_dir)
    if not dry_run and not force:
        try:
            lock.acquire("memstream replay")
        except LanceDirBusyError as exc:
            raise ReplayError(
                f"{exc}: stop the worker first (the live set keeps serving reads meanwhile), "
                "or use --dry-run"
            ) from None
    try:
        return await _replay(
            settings,
            report,
            dry_run=dry_run,
            batch_size=batch_size,
            on_progress=on_progress,
            on_phase=on_phase or (lambda _: None),
            stamp=stamp,
        )
    finally:
        lock.release()


async def _replay(
    settings: Settings,
    report: ReplayReport,
    *,
    dry_run: bool,
    batch_size: int,
    on_progress: Callable[[ReplayProgress], None] | None,
    on_phase: Callable[[str], None],
    stamp: str,
) -> ReplayReport:
    topics = Topics.from_settings(settings)
    live_dir, replay_dir = report.live_dir, report.replay_dir

    partitions = await _partitions(settings, (topics.messages, topics.events))
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        client_id="memstream-replay",
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    try:
        await consumer.start()
    except KafkaError as exc:
        raise ReplayError(f"cannot reach Kafka at {settings.bootstrap_servers}: {exc}") from exc
    loop = asyncio.get_running_loop()
    try:
        begins = await consumer.beginning_offsets(partitions)
        ends = await consumer.end_offsets(partitions)
        report.end_offsets = {(tp.topic, tp.partition): ends[tp] for tp in partitions}
        report.expected_records = sum(ends[tp] - begins[tp] for tp in partitions)

        replay_dir.parent.mkdir(parents=True, exist_ok=True)
        store = await loop.run_in_executor(None, _open_store, replay_dir, settings)
        projector = await loop.run_in_executor(None, _open_projector, store, settings)
        handled = await loop.run_in_executor(None, _live_positions, live_dir, settings)
        rerouter = _MisroutedBeyond(settings, handled, report)
        await _consume_into(
            consumer,
            partitions,
            begins,
            ends,
            projector,
            report,
            batch_size,
            on_progress,
            report.expected_records,
            decode_in_process=settings.projector_decode_process,
            fast_path=settings.projector_fast_path,
            on_decoded=rerouter.publish,
        )
    finally:
        await consumer.stop()
        await rerouter.stop()

    def finish() -> None:
        on_phase(PHASE_COMPACT)
        store.optimize()
        if store.vector_index_due():
            on_phase(PHASE_VECTOR_INDEX)
        store.ensure_indexes()
        on_phase(PHASE_VERIFY)
        report.positions = {k: int(v) for k, v in store.positions().items()}
        report.replay_digest = dict(store.table_digest())
        if live_dir.exists():
            live = _open_store(live_dir, settings)
            report.live_digest = dict(live.table_digest())
            report.live_positions = {k: int(v) for k, v in live.positions().items()}

    await loop.run_in_executor(None, finish)
    _verify(report)
    if report.differences and report.live_positions is not None:
        same_coverage = all(
            report.live_positions.get(k, 0) == end for k, end in report.end_offsets.items()
        )
        if same_coverage:
            log.warning(
                "the live set covers exactly the replayed offsets yet differs in %s: "
                "the live projection diverged from the log",
                ", ".join(d.table for d in report.differences),
            )

    if not dry_run:
        on_phase(PHASE_SWAP)
        # With the lock held (unless forced) no worker can have started meanwhile.
        try:
            _swap(report, stamp)
        except OSError as exc:
            raise ReplayError(f"swap failed, live set unchanged: {exc}") from exc
    return report


def replay_sync(settings: Settings, **kwargs: Any) -> ReplayReport:
    """:func:`replay` for synchronous callers (the CLI)."""
    return asyncio.run(replay(settings, **kwargs))
