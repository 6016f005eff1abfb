"""The synthetic corpus the event benchmarks share: a Zipf vocabulary, entity names,
memories and conversation turns spread over spaces, their events, and the Arrow rows the
projector would write for them (for raw baselines that skip memstream)."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pyarrow as pa

from memstream.bench._common import progress_bar
from memstream.domain.content import content_hash, normalize_content
from memstream.domain.events import EmbeddingPayload, Entity, MemoryAdded, MemoryType, MessageObserved, Scope
from memstream.projections.schema import ENTITIES, MEMORIES, MESSAGES, schema_for, scoped_key

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
