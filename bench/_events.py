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
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import aiokafka
import lancedb
import numpy as np
import pyarrow as pa
from aiokafka import AIOKafkaConsumer, TopicPartition
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from memstream.bench._common import WorkerProcess as _CommonWorker
from memstream.bench._common import console, err_console, percentile
from memstream.bench._common import delete_topics as _delete_topics
from memstream.domain.content import content_hash, normalize_content
from memstream.domain.events import EmbeddingPayload, Entity, MemoryAdded, MemoryType, MessageObserved, Scope
from memstream.projections.embedder import LocalEmbedder
from memstream.projections.schema import ENTITIES, MEMORIES, MESSAGES, schema_for, scoped_key
from memstream.settings import Settings
from memstream.streams.admin import ensure_topics
from memstream.streams.producer import MemstreamProducer
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

DIM = 384
"""Vector width of every benchmark (the default ``embedding_dim``)."""
TEAM = "bench"
"""Team of every benchmark memory space; users are ``u00``, ``u01``, ..."""


# A fixed, ordinary vocabulary: frequent words first (the Zipf draw favours them).
VOCABULARY: tuple[str, ...] = tuple(
    """
    project meeting team customer report deadline budget design review code release
    coffee morning evening weekend trip hiking mountain lake river city train flight
    hotel dinner lunch breakfast restaurant pizza pasta salad cheese wine tea juice
    book novel movie music concert guitar piano song album podcast article paper
    python java rust database kafka server cloud cluster network latency throughput
    memory storage vector search index query schema table column backup migration
    doctor dentist appointment medicine health running swimming cycling yoga gym
    garden flowers tomatoes balcony apartment house kitchen office desk chair laptop
    phone email message calendar reminder birthday anniversary wedding party gift
    sister brother mother father daughter son friend colleague manager neighbour
    dog cat puppy kitten bird horse fish zoo park beach island forest desert snow
    rain summer winter spring autumn holiday vacation passport visa ticket museum
    painting photography camera drawing sculpture theatre opera ballet festival
    market stock portfolio invoice salary taxes insurance mortgage savings loan bank
    french spanish german italian japanese chinese lesson course exam degree thesis
    language grammar vocabulary reading writing speaking listening translation
    allergy peanuts gluten vegetarian vegan spicy sweet sour bitter chocolate cake
    morning routine habit goal plan idea feedback decision preference opinion
    quarterly roadmap sprint ticket bug incident outage postmortem deploy rollback
    contract vendor supplier shipment warehouse inventory pricing discount launch
    prefers likes dislikes avoids enjoys wants needs plans visited booked bought
    sold learned finished started cancelled moved painted cooked wrote read watched
    early late quickly slowly usually rarely always never often sometimes weekly
    monday tuesday wednesday thursday friday saturday sunday january february march
    april may june july august september october november december tomorrow today
    green blue red yellow black white purple orange silver golden wooden glass
    small large quiet noisy bright dark cheap expensive modern vintage local remote
    """.split()
)
ENTITY_NAMES: tuple[str, ...] = tuple(
    """
    Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Mallory Niaj Olivia Peggy
    Rupert Sybil Trent Victor Walter Yasmin Zoe Lisbon Porto Berlin Tokyo Paris Oslo
    Kyoto Acme Globex Initech Umbrella Hooli Vandelay Stark Wayne Tesla Lufthansa
    """.split()
)
_TYPES: tuple[str, ...] = tuple(t.value for t in MemoryType)
_EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)


# ----------------------------------------------------------------------------- output
def progress_bar() -> Progress:
    """A rich progress bar on stderr (``_common``'s console, so stdout keeps only the
    tables and the JSON line), with the time left: these phases take minutes."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    )


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


# ----------------------------------------------------------------------------- the data
@dataclass
class Corpus:
    """``n`` synthetic memories as columns (row ``i`` is memory ``memory_ids[i]``)."""

    memory_ids: list[str]
    users: list[str]
    """User id of each memory (the memory space is ``TEAM/users[i]``)."""
    contents: list[str]
    hashes: list[str]
    memory_types: list[str]
    priorities: np.ndarray
    created_at: list[datetime]
    entities: list[tuple[str, ...]]
    vectors: np.ndarray
    """``(n, dim)`` float32, one unit vector per memory."""

    def __len__(self) -> int:
        return len(self.memory_ids)

    @property
    def spaces(self) -> list[str]:
        return sorted(set(self.users))


def _zipf_weights(n: int, exponent: float = 1.0) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** exponent
    return w / w.sum()


def random_unit_vectors(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    """``n`` random unit vectors (float32), generated in chunks to bound temporaries."""
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 65_536):
        stop = min(n, start + 65_536)
        block = rng.standard_normal((stop - start, dim), dtype=np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        out[start:stop] = block
    return out


def make_corpus(
    n: int,
    *,
    spaces: int = 16,
    dim: int = DIM,
    seed: int = 7,
    entity_rate: float = 0.0,
    vectors: np.ndarray | None = None,
    id_prefix: str = "m",
) -> Corpus:
    """``n`` memories over ``spaces`` memory spaces; random unit vectors unless
    ``vectors`` is given (e.g. :func:`embed_contents` of the contents, filled in
    afterwards). ``entity_rate`` is the share of memories that name one or two of
    :data:`ENTITY_NAMES` (the name is also put in the text, as an extractor would)."""
    if n < 1:
        raise ValueError("a corpus needs at least one memory")
    rng = np.random.default_rng(seed)
    vocab = np.array(VOCABULARY, dtype=object)
    weights = _zipf_weights(len(vocab))
    lengths = rng.integers(8, 25, size=n)
    words = rng.choice(len(vocab), size=int(lengths.sum()), p=weights)
    has_entity = rng.random(n) < entity_rate
    ent_a = rng.integers(0, len(ENTITY_NAMES), size=n)
    ent_b = rng.integers(0, len(ENTITY_NAMES), size=n)
    two = rng.random(n) < 0.3
    users = [f"u{int(u):02d}" for u in rng.integers(0, spaces, size=n)]
    types = [_TYPES[int(t)] for t in rng.integers(0, len(_TYPES), size=n)]
    priorities = rng.integers(0, 101, size=n).astype(np.int32)
    ages = rng.integers(0, 365 * 24 * 3600, size=n)
    contents: list[str] = []
    entities: list[tuple[str, ...]] = []
    pos = 0
    for i in range(n):
        length = int(lengths[i])
        text = " ".join(vocab[words[pos : pos + length]])
        pos += length
        names: tuple[str, ...] = ()
        if has_entity[i]:
            a, b = ENTITY_NAMES[int(ent_a[i])], ENTITY_NAMES[int(ent_b[i])]
            names = (a, b) if two[i] and a != b else (a,)
            text = f"{' and '.join(names)}: {text}"
        contents.append(text)
        entities.append(names)
    hashes = [content_hash(c) for c in contents]
    created = [_EPOCH - timedelta(seconds=int(a)) for a in ages]
    if vectors is None:
        vectors = random_unit_vectors(rng, n, dim)
    elif vectors.shape != (n, dim):
        raise ValueError(f"vectors must be ({n}, {dim}), got {vectors.shape}")
    width = max(6, len(str(n - 1)))
    return Corpus(
        memory_ids=[f"{id_prefix}{i:0{width}d}" for i in range(n)],
        users=users,
        contents=contents,
        hashes=hashes,
        memory_types=types,
        priorities=priorities,
        created_at=created,
        entities=entities,
        vectors=vectors,
    )


def embed_contents(corpus: Corpus, embedder: Any, *, chunk: int = 2_000, label: str = "embedding") -> None:
    """Replace the corpus vectors by ``embedder``'s vectors of the contents (progress bar)."""
    n = len(corpus)
    out = np.empty((n, embedder.dim), dtype=np.float32)
    with progress_bar() as bar:
        task = bar.add_task(label, total=n)
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            out[start:stop] = np.asarray(embedder.embed(corpus.contents[start:stop]), dtype=np.float32)
            bar.update(task, completed=stop)
    corpus.vectors = out


def make_queries(count: int, *, seed: int = 11, entity_share: float = 0.25) -> list[str]:
    """Search queries of 2 to 4 vocabulary words (Zipf-weighted, like the contents);
    ``entity_share`` of them also name an entity."""
    rng = np.random.default_rng(seed)
    weights = _zipf_weights(len(VOCABULARY))
    out = []
    for _ in range(count):
        words = [VOCABULARY[int(i)] for i in rng.choice(len(VOCABULARY), size=int(rng.integers(2, 5)), p=weights)]
        if rng.random() < entity_share:
            words.insert(0, ENTITY_NAMES[int(rng.integers(0, len(ENTITY_NAMES)))])
        out.append(" ".join(words))
    return out


def _vector_b64(vec: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(vec, dtype="<f4").tobytes()).decode("ascii")


def memory_event(corpus: Corpus, i: int, *, model_id: str | None) -> MemoryAdded:
    """Memory ``i`` as a ``MemoryAdded`` event, validated by the real model; with an
    embedding of ``model_id`` carried in the event unless ``model_id`` is None."""
    embedding = None
    if model_id is not None:
        vec = corpus.vectors[i]
        embedding = EmbeddingPayload(model=model_id, dim=int(vec.shape[0]), data=_vector_b64(vec))
    return MemoryAdded(
        scope=Scope(team_id=TEAM, user_id=corpus.users[i]),
        memory_id=corpus.memory_ids[i],
        content=corpus.contents[i],
        content_hash=corpus.hashes[i],
        memory_type=corpus.memory_types[i],
        priority=int(corpus.priorities[i]),
        timestamp=corpus.created_at[i],
        occurred_at=corpus.created_at[i],
        recorded_at=corpus.created_at[i],
        entities=tuple(Entity(name=name, kind="person") for name in corpus.entities[i]),
        source_message_ids=(f"msg-{corpus.memory_ids[i]}",),
        embedding=embedding,
        producer="memstream-bench",
    )


SESSION_TURNS = 50
"""Consecutive turns of one memory space that make one conversation session."""
SPEAKERS: tuple[str, str] = ("Ana", "assistant")


def _session(i: int) -> str:
    return f"s{i // SESSION_TURNS:06d}"


def message_event(corpus: Corpus, i: int) -> MessageObserved:
    """The L0 turn memory ``i`` was drawn from (its ``source_message_ids``): same
    space and time, its text, in session ``s<i // 50>``, speakers alternating."""
    return MessageObserved(
        scope=Scope(team_id=TEAM, user_id=corpus.users[i]),
        message_id=f"msg-{corpus.memory_ids[i]}",
        role="user" if i % 2 == 0 else "assistant",
        speaker=SPEAKERS[i % 2],
        content=corpus.contents[i],
        session_id=_session(i),
        occurred_at=corpus.created_at[i],
        recorded_at=corpus.created_at[i],
        producer="memstream-bench",
    )


def corpus_events(corpus: Corpus, *, model_id: str | None, start: int = 0, stop: int | None = None) -> Iterator[MemoryAdded]:
    for i in range(start, len(corpus) if stop is None else stop):
        yield memory_event(corpus, i, model_id=model_id)


# ------------------------------------------------------------------- rows, as the projector writes them
def _entity_key(name: str) -> str:
    return normalize_content(name)


def memory_rows(
    corpus: Corpus,
    *,
    model_id: str,
    start: int = 0,
    stop: int | None = None,
    superseded_every: int = 0,
    log_topic: str = "bench.events",
) -> pa.Table:
    """Rows ``start:stop`` of the ``memories`` table exactly as the projector writes
    them for these events (schema, keys, canonical JSON, view columns), built column
    by column. ``superseded_every`` > 0 marks every such-th memory superseded by the
    next one (the view a ``supersedes`` link derives), so search exercises its
    successor handling. Log fields are synthetic (``log_topic``, partition 0, offset
    ``i``); the smoke test checks every other column against the real projector."""
    stop = len(corpus) if stop is None else stop
    idx = range(start, stop)
    n = stop - start
    dim = int(corpus.vectors.shape[1])
    schema = schema_for(MEMORIES, dim)
    ids = corpus.memory_ids[start:stop]
    users = corpus.users[start:stop]
    created = corpus.created_at[start:stop]
    superseded: list[str | None] = [None] * n
    if superseded_every > 0:
        for j, i in enumerate(idx):
            if i % superseded_every == superseded_every - 1 and i + 1 < len(corpus) and corpus.users[i + 1] == corpus.users[i]:
                superseded[j] = corpus.memory_ids[i + 1]
    ents = corpus.entities[start:stop]
    flat = pa.array(np.ascontiguousarray(corpus.vectors[start:stop]).reshape(-1), type=pa.float32())
    columns: dict[str, Any] = {
        "pk": [scoped_key(TEAM, u, m) for u, m in zip(users, ids)],
        "memory_id": ids,
        "team_id": [TEAM] * n,
        "user_id": users,
        "agent_id": ["default"] * n,
        "session_id": [None] * n,
        "content": corpus.contents[start:stop],
        "content_hash": corpus.hashes[start:stop],
        "memory_type": corpus.memory_types[start:stop],
        "priority": corpus.priorities[start:stop],
        "scene": [None] * n,
        "timestamp": created,
        "timestamp_start": [None] * n,
        "timestamp_end": [None] * n,
        "source_message_ids": [[f"msg-{m}"] for m in ids],
        "entities": [[{"name": name, "kind": "person"} for name in e] for e in ents],
        "entity_keys": [[_entity_key(name) for name in e] for e in ents],
        "metadata": ["{}"] * n,
        "provenance": [None] * n,
        "vector": pa.FixedSizeListArray.from_arrays(flat, dim),
        "embedding_model": [model_id] * n,
        "created_at": created,
        "recorded_at": created,
        "superseded_by": superseded,
        "canonical_id": [None] * n,
        "status": ["superseded" if s else "active" for s in superseded],
        "log_topic": [log_topic] * n,
        "log_partition": [0] * n,
        "log_offset": list(idx),
        "event_id": [str(uuid.UUID(int=i + 1)) for i in idx],
    }
    arrays = [
        columns[f.name] if isinstance(columns[f.name], pa.Array) else pa.array(columns[f.name], type=f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def message_rows(corpus: Corpus, *, start: int = 0, stop: int | None = None, log_topic: str = "bench.messages") -> pa.Table:
    """The ``messages`` rows the projector writes for :func:`message_event` of these
    memories (log fields synthetic: ``log_topic``, partition 0, offset ``i``)."""
    stop = len(corpus) if stop is None else stop
    idx = range(start, stop)
    n = stop - start
    ids = [f"msg-{m}" for m in corpus.memory_ids[start:stop]]
    users = corpus.users[start:stop]
    created = corpus.created_at[start:stop]
    columns: dict[str, list[Any]] = {
        "pk": [scoped_key(TEAM, u, m) for u, m in zip(users, ids)],
        "message_id": ids,
        "team_id": [TEAM] * n,
        "user_id": users,
        "agent_id": ["default"] * n,
        "session_id": [_session(i) for i in idx],
        "role": ["user" if i % 2 == 0 else "assistant" for i in idx],
        "speaker": [SPEAKERS[i % 2] for i in idx],
        "content": corpus.contents[start:stop],
        "content_hash": corpus.hashes[start:stop],
        "metadata": ["{}"] * n,
        "occurred_at": created,
        "recorded_at": created,
        "log_topic": [log_topic] * n,
        "log_partition": [0] * n,
        "log_offset": list(idx),
        "event_id": [str(uuid.UUID(int=(1 << 64) + i)) for i in idx],
    }
    return pa.Table.from_pydict(columns, schema=schema_for(MESSAGES, DIM))


def entity_rows(corpus: Corpus, *, start: int = 0, stop: int | None = None, log_topic: str = "bench.events") -> pa.Table:
    """The ``entities`` rows (entity -> memory) the projector writes for these memories."""
    stop = len(corpus) if stop is None else stop
    rows: dict[str, list[Any]] = {f.name: [] for f in schema_for(ENTITIES, DIM)}
    for i in range(start, stop):
        for name in corpus.entities[i]:
            key = _entity_key(name)
            pk = scoped_key(TEAM, corpus.users[i], corpus.memory_ids[i])
            values = {
                "pk": f"{pk}|{key}",
                "team_id": TEAM,
                "user_id": corpus.users[i],
                "name_key": key,
                "name": name,
                "kind": "person",
                "memory_id": corpus.memory_ids[i],
                "memory_pk": pk,
                "agent_id": "default",
                "occurred_at": corpus.created_at[i],
                "log_topic": log_topic,
                "log_partition": 0,
                "log_offset": i,
                "event_id": str(uuid.UUID(int=i + 1)),
            }
            for k, v in values.items():
                rows[k].append(v)
    return pa.Table.from_pydict(rows, schema=schema_for(ENTITIES, DIM))


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
    topics = Topics.from_settings(settings)
    await ensure_topics(settings.bootstrap_servers, topics)
    return topics


async def delete_topics(settings: Settings) -> list[str]:
    """Delete every topic of the benchmark's prefix and of its app ids (Faust's internal
    topics of ``<app_id>-r<N>`` included): benchmark logs are large and kept forever
    otherwise."""
    return await _delete_topics(settings.bootstrap_servers, Topics.from_settings(settings), settings.app_id)


@dataclass
class ProduceStats:
    events: int
    seconds: float
    bytes: int
    end_offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def eps(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def _producer_settings(settings: Settings) -> Settings:
    """Bulk loading: bigger client batches and a little linger (acks stay ``all``)."""
    return settings.model_copy(
        update={"producer_linger_ms": 20, "producer_max_batch_bytes": 1_048_576, "producer_max_in_flight": 20_000}
    )


async def produce_events(
    settings: Settings,
    events: Iterable[MemoryAdded],
    total: int,
    *,
    label: str = "producing",
) -> ProduceStats:
    """Encode and send ``events`` to ``<prefix>events`` as fast as the durable producer
    goes; returns when every record is acknowledged."""
    topics = Topics.from_settings(settings)
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

    async with MemstreamProducer(_producer_settings(settings), client_id="memstream-bench") as producer:
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
    model_id = LocalEmbedder(settings.embedding_dim).model_id
    status(f"generating {n:,} memories over {spaces} spaces")
    corpus = make_corpus(n, spaces=spaces, dim=settings.embedding_dim)
    asyncio.run(create_topics(settings))
    produced = asyncio.run(produce_corpus(settings, corpus, model_id=model_id))
    status(f"produced {produced.events:,} events in {produced.seconds:.1f}s ({produced.eps:,.0f}/s)")
    rows = memory_rows(corpus, model_id=model_id, log_topic=f"{settings.topic_prefix}events")
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
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers,
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
        super().__init__(settings, workdir, agents=["projector"], loglevel="info")
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

