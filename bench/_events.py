"""Shared machinery of the throughput and latency benchmarks (projector, replay,
search, freshness): synthetic memories, fast producing, the raw ceilings, the worker
as a subprocess, cleanup and output.

Why one module: the benchmarks compare memstream against raw aiokafka and raw LanceDB
*on the same data in the same run*, so the data, the ceilings and the way the real
worker is started must be identical for all of them, and a ratio is only meaningful
if both sides saw the same records.

The data (:func:`make_corpus`): ``N`` ``MemoryAdded`` memories spread over several
memory spaces (team ``bench``, users ``u00``.. ), sentences of 8 to 24 words drawn
from a fixed vocabulary with a Zipf-like frequency (so BM25 sees realistic document
frequencies), varied types, priorities and times. Vectors are either random unit
vectors (throughput: the projector only decodes and stores them) or the product's
own embedding of the content (search: the query is embedded by the same model).
Everything is seeded: two runs with the same arguments produce the same memories.

Events are built with the real model (:class:`MemoryAdded`), encoded (and sealed, with
sealing on) by :meth:`MemstreamProducer.encode` and sent with
:meth:`MemstreamProducer.send_encoded` (durable, ``acks=all``, back-pressured): the
benchmark writes what an SDK user writes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiokafka
import lancedb
import pyarrow as pa
from aiokafka import AIOKafkaConsumer, TopicPartition
from rich.table import Table

from memstream.bench._common import WorkerProcess as _CommonWorker
from memstream.bench._common import console, err_console, percentile, progress_bar
from memstream.bench._common import delete_topics as _delete_topics
from memstream.bench._corpus import (
    DIM,
    ENTITY_NAMES,
    SESSION_TURNS,
    SPEAKERS,
    TEAM,
    VOCABULARY,
    Corpus,
    corpus_events,
    embed_contents,
    entity_rows,
    make_corpus,
    make_queries,
    memory_event,
    memory_rows,
    message_event,
    message_rows,
    random_unit_vectors,
)
from memstream.domain.events import MemoryAdded
from memstream.projections.embedders import LocalEmbedder
from memstream.settings import Settings
from memstream.streams.admin import ensure_topics
from memstream.streams.producers.kafka_producer import Batching
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.topics import Topics

__all__ = [
    "DIM",
    "TEAM",
    "VOCABULARY",
    "ENTITY_NAMES",
    "Corpus",
    "ProduceStats",
    "ConsumeStats",
    "WorkerProcess",
    "process_cpu_seconds",
    "BenchWorkdir",
    "console",
    "progress_bar",
    "print_table",
    "make_corpus",
    "random_unit_vectors",
    "embed_contents",
    "make_queries",
    "SESSION_TURNS",
    "SPEAKERS",
    "memory_event",
    "message_event",
    "corpus_events",
    "memory_rows",
    "message_rows",
    "entity_rows",
    "bench_settings",
    "create_topics",
    "delete_topics",
    "produce_events",
    "produce_corpus",
    "ProducedLog",
    "produce_log",
    "raw_consume",
    "raw_lance_add",
    "wait_for_count",
    "median",
    "percentile",
    "machine_info",
    "load_average",
    "status",
]


# ----------------------------------------------------------------------------- output
def print_table(title: str, rows: Sequence[tuple[str, str, str]]) -> None:
    """A readable three-column table: metric, value, note."""
    table = Table(title=title, title_justify="left", show_lines=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    table.add_column("note", style="dim")
    for metric, value, note in rows:
        table.add_row(metric, value, note)
    console.print(table)


def status(message: str) -> None:
    """One progress line (stderr) for phases without a count."""
    err_console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}")


# ----------------------------------------------------------------------------- statistics
def median(values: Iterable[float]) -> float:
    items = [float(v) for v in values]
    return float(statistics.median(items)) if items else float("nan")


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def machine_info() -> dict[str, Any]:
    """What the figures were measured on: cores, memory, load, library versions."""
    mem_gb: float | None = None
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    return {
        "cores": os.cpu_count(),
        "memory_gb": mem_gb,
        "load_1m": load_average(),
        "python": sys.version.split()[0],
        "lancedb": lancedb.__version__,
        "aiokafka": aiokafka.__version__,
    }


# ----------------------------------------------------------------------------- Kafka
def bench_settings(workdir: Path, **overrides: Any) -> Settings:
    """Settings for one benchmark: the configured broker, a fresh topic prefix and app
    id, LanceDB and the worker's home under ``workdir``, the local embedder at 384-d.
    Anything else (batch sizes, thresholds) stays at the product's defaults."""
    tag = uuid.uuid4().hex[:8]
    base: dict[str, Any] = {
        "topic_prefix": f"bench{tag}.",
        "app_id": f"bench-{tag}",
        "lance_dir": workdir / "lance",
        "home": workdir / "home",
        "embedder": "local",
        "embedding_dim": DIM,
        # one master key for the run: its steps use several homes over the same topics
        "master_key": base64.b64encode(os.urandom(32)).decode("ascii"),
    }
    base.update(overrides)
    return Settings(**base)


async def create_topics(settings: Settings) -> Topics:
    topics = Topics.from_settings(settings.broker)
    await ensure_topics(settings.broker.bootstrap_servers, topics)
    return topics


async def delete_topics(settings: Settings) -> list[str]:
    """Delete every topic of the benchmark's prefix and of its app ids (Faust's internal
    topics of ``<app_id>-r<N>`` included): benchmark logs are large and kept forever
    otherwise."""
    return await _delete_topics(settings.broker.bootstrap_servers, Topics.from_settings(settings.broker), settings.worker.app_id)


@dataclass
class ProduceStats:
    events: int
    seconds: float
    bytes: int
    end_offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def eps(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


BULK_BATCHING = Batching(linger_ms=20, max_batch_bytes=1_048_576, max_in_flight=20_000)
"""Bulk loading: bigger client batches and a little linger (acks stay ``all``)."""


async def produce_events(
    settings: Settings,
    events: Iterable[MemoryAdded],
    total: int,
    *,
    label: str = "producing",
) -> ProduceStats:
    """Encode and send ``events`` to ``<prefix>events`` as fast as the durable producer
    goes; returns when every record is acknowledged."""
    topics = Topics.from_settings(settings.broker)
    started = time.perf_counter()
    size = 0
    sent = 0
    ends: dict[tuple[str, int], int] = {}
    futures: list[asyncio.Future[Any]] = []

    def note(fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            p = fut.result()
            key = (p.topic, p.partition)
            ends[key] = max(ends.get(key, 0), p.offset + 1)

    async with MemstreamProducer(settings.streams, client_id="memstream-bench", batching=BULK_BATCHING) as producer:
        with progress_bar() as bar:
            task = bar.add_task(label, total=total)
            for event in events:
                record = await producer.encode(event)  # sealed when sealing is on, as the SDK sends it
                size += len(record.value)
                fut = await producer.send_encoded(topics.events, record)
                fut.add_done_callback(note)
                futures.append(fut)
                sent += 1
                if sent % 1_000 == 0:
                    bar.update(task, completed=sent)
                    done = [f for f in futures if f.done()]
                    for f in done:
                        f.result()  # surface a failed send at once
                    futures = [f for f in futures if not f.done()]
                    await asyncio.sleep(0)
            await producer.flush()
            for f in futures:
                await f
            bar.update(task, completed=sent)
    return ProduceStats(events=sent, seconds=time.perf_counter() - started, bytes=size, end_offsets=ends)


async def produce_corpus(settings: Settings, corpus: Corpus, *, model_id: str | None) -> ProduceStats:
    """Every memory of ``corpus`` as a ``MemoryAdded`` event on ``<prefix>events``."""
    return await produce_events(settings, corpus_events(corpus, model_id=model_id), len(corpus))


@dataclass
class ProducedLog:
    """A corpus on a fresh topic, with the rows a raw LanceDB add of it would write."""

    model_id: str
    corpus: Corpus
    produced: ProduceStats
    rows: pa.Table


def produce_log(settings: Settings, n: int, *, spaces: int) -> ProducedLog:
    """The common set-up of the throughput benchmarks (projector, replay): generate
    ``n`` memories, produce them durably as events carrying their vectors, and build
    the same rows for the raw-add ceiling."""
    model_id = LocalEmbedder(settings.embeddings.dim).model_id
    status(f"generating {n:,} memories over {spaces} spaces")
    corpus = make_corpus(n, spaces=spaces, dim=settings.embeddings.dim)
    asyncio.run(create_topics(settings))
    produced = asyncio.run(produce_corpus(settings, corpus, model_id=model_id))
    status(f"produced {produced.events:,} events in {produced.seconds:.1f}s ({produced.eps:,.0f}/s)")
    rows = memory_rows(corpus, model_id=model_id, log_topic=f"{settings.broker.topic_prefix}events")
    return ProducedLog(model_id, corpus, produced, rows)


@dataclass
class ConsumeStats:
    records: int
    seconds: float
    bytes: int
    cpu_s: float
    """CPU time of this process (all threads) while consuming."""

    @property
    def eps(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


async def raw_consume(settings: Settings, topic: str, expected: int) -> ConsumeStats:
    """The consume ceiling: aiokafka reading ``topic`` from its beginning to its end
    offsets, decoding nothing (the same fetch sizes as ``memstream replay``). The clock
    starts at the first fetch, after connecting and assigning."""
    consumer = AIOKafkaConsumer(  # raw on purpose: the bare aiokafka ceiling replay is measured against
        bootstrap_servers=settings.broker.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        client_id="memstream-bench-raw",
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not partitions:
            await consumer._client.force_metadata_update()  # noqa: SLF001 - first contact with a new topic
            partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(partitions)
        ends = await consumer.end_offsets(partitions)
        await consumer.seek_to_beginning(*partitions)
        remaining = {tp for tp in partitions if ends[tp] > 0}
        count = 0
        size = 0
        started = time.perf_counter()
        cpu_started = time.process_time()
        while remaining:
            batch = await consumer.getmany(timeout_ms=500, max_records=10_000)
            for tp, records in batch.items():
                for r in records:
                    if r.offset < ends[tp]:
                        count += 1
                        size += len(r.value or b"")
                if records and records[-1].offset + 1 >= ends[tp]:
                    remaining.discard(tp)
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
    finally:
        await consumer.stop()
    if count != expected:
        raise RuntimeError(f"raw consume read {count} records of {topic}, expected {expected}")
    return ConsumeStats(records=count, seconds=seconds, bytes=size, cpu_s=cpu)


# ----------------------------------------------------------------------------- LanceDB
def raw_lance_add(rows: pa.Table, directory: Path) -> tuple[float, float]:
    """The write ceiling: (seconds, CPU seconds of this process, LanceDB's threads
    included) for one LanceDB bulk ``add`` of ``rows`` into a fresh table with the
    memories schema (no merge, no dedupe, no index upkeep)."""
    directory.mkdir(parents=True, exist_ok=True)
    db = lancedb.connect(str(directory))
    table = db.create_table("memories", schema=rows.schema)
    started = time.perf_counter()
    cpu_started = time.process_time()
    table.add(rows)
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    if table.count_rows() != rows.num_rows:
        raise RuntimeError(f"raw add wrote {table.count_rows()} rows, expected {rows.num_rows}")
    return seconds, cpu


def wait_for_count(
    lance_dir: Path,
    expected: int,
    *,
    poll_s: float = 0.1,
    stall_timeout_s: float = 180.0,
    alive: Callable[[], None] | None = None,
    on_count: Callable[[int], None] | None = None,
) -> float:
    """Poll the ``memories`` row count in ``lance_dir`` (a separate reader that sees
    every commit) until it reaches ``expected``; returns ``time.perf_counter()`` at the
    poll that saw it. Raises if the count stops moving for ``stall_timeout_s``."""
    last_change = time.perf_counter()
    last = -1
    table = None
    db = None
    while True:
        now = time.perf_counter()
        if alive is not None:
            alive()
        if table is None:
            if lance_dir.exists():
                db = db or lancedb.connect(str(lance_dir), read_consistency_interval=timedelta(0))
                with contextlib.suppress(Exception):  # not created by the worker yet
                    table = db.open_table("memories")
        count = int(table.count_rows()) if table is not None else 0
        if count != last:
            last, last_change = count, now
            if on_count is not None:
                on_count(count)
        if count >= expected:
            return now
        if now - last_change > stall_timeout_s:
            raise RuntimeError(f"memories stuck at {count} of {expected} rows for {stall_timeout_s:.0f}s")
        time.sleep(poll_s)


# ----------------------------------------------------------------------------- the worker
def _stat_fields(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time so far (Linux ``/proc``) of process ``pid`` and of its
    live child processes (the worker's decoder process), or None."""
    if pid is None:
        return None
    try:
        fields = _stat_fields(pid)
    except (OSError, ValueError, IndexError):
        return None
    ticks = int(fields[11]) + int(fields[12])
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == pid:
            continue
        try:
            child = _stat_fields(int(entry.name))
            if int(child[1]) == pid:  # field 4 of stat: the parent pid
                ticks += int(child[11]) + int(child[12])
        except (OSError, ValueError, IndexError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


class WorkerProcess(_CommonWorker):
    """``_common.WorkerProcess`` running only the projector, exactly as deployed, with
    what throughput and latency figures need: when it started, when it was ready to
    read, and how much CPU it used."""

    READY_MARK = "projector reading"
    """Logged (at INFO) once the worker has its partitions and has sought them to its
    stored positions: the moment it starts reading."""

    def __init__(self, settings: Settings, workdir: Path) -> None:
        super().__init__(settings, workdir, services=["projector"], loglevel="info")
        self.started_at = 0.0

    def start(self) -> None:
        self.started_at = time.perf_counter()
        super().start()

    def check_alive(self) -> None:
        if not self.alive():
            raise RuntimeError(f"the worker exited ({self.exit_code()}):\n{self.tail()}")

    def wait_ready(self, timeout_s: float = 120.0) -> float:
        """Wait until the worker reads from its stored positions; returns
        ``time.perf_counter()`` at that moment (within the 0.1 s log poll)."""
        self.wait_log(self.READY_MARK, timeout=timeout_s)
        return time.perf_counter()

    def cpu_seconds(self) -> float | None:
        return process_cpu_seconds(self.pid)


class BenchWorkdir:
    """A temporary directory for one benchmark run, removed on exit (also on errors),
    and the benchmark's Kafka topics deleted with it."""

    def __init__(self, name: str, *, keep: bool = False) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=f"memstream-bench-{name}-"))
        self.keep = keep
        self.settings_used: list[Settings] = []

    def track(self, settings: Settings) -> Settings:
        self.settings_used.append(settings)
        return settings

    def __enter__(self) -> "BenchWorkdir":
        return self

    def __exit__(self, *exc: object) -> None:
        for s in self.settings_used:
            with contextlib.suppress(Exception):
                asyncio.run(delete_topics(s))
        if not self.keep:
            shutil.rmtree(self.path, ignore_errors=True)

