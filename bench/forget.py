"""``memstream bench forget``: crypto-shredding end to end, on the real broker and LanceDB.

Several data subjects (memory spaces) write mixed traffic: memories through the SDK
(sealed by the producer; half carry their own vector), turns through the SDK, and
memories as plain JSON through ``memstream.ingress`` (what kcat writes; the worker seals
them). Every text holds a canary of its subject. Once the worker projected it all, one
user and one whole team are forgotten (``memstream forget``) while the other subjects
keep writing. Measured:

* ``forget_visible_p99_ms``: from the start of ``forget`` to a search of the subject's
  canary (and a count of its rows) returning nothing, per forgotten subject;
* ``rows_left``: rows of forgotten subjects in every table of the live projection;
  ``lance_file_hits``: files under the LanceDB root still holding a canary's bytes
  once the readers' grace has passed (``lance_files_clean_s``: about when, from the
  forget);
* ``plaintext_hits``: records of the kept-forever topics, the reflector's work topic
  and its tables' changelogs (open decisions, each with a canary, wait there) whose raw
  bytes (key, value, headers) hold a forgotten subject's canary or vector;
* ``replay_rows_left``: rows of forgotten subjects after a full replay into a fresh
  table set (``replay_skipped``: the records it could not open and skipped);
* ``others_equal``: every row the other subjects had before the forgets is unchanged,
  live and after the replay.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import AIOKafkaProducer, TopicPartition

from memstream.bench._common import percentile
from memstream.bench._events import BenchWorkdir, WorkerProcess, bench_settings, machine_info, print_table, status
from memstream.codec.wire import encode_event
from memstream.domain.events import DecisionRecorded, EmbeddingPayload, MemoryAdded, MessageObserved, Scope, utcnow
from memstream.projections.embedders import build_embedder
from memstream.projections.projector import SCOPED_TABLES, subject_where
from memstream.projections.search import search
from memstream.projections.store import LanceStore, StoreError, TableSets
from memstream.services.reflection import state_topics
from memstream.services.replay import replay
from memstream.settings import Settings
from memstream.streams.admin import ensure_topics
from memstream.streams.clients import create_consumer
from memstream.streams.sealing.forget import forget
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.topics import Topics

__all__ = ["run"]

TEAMS = {"acme": ["alice", "bob", "carol"], "globex": ["dave", "erin"]}
FORGETS: list[tuple[str, str | None]] = [("acme", "alice"), ("globex", None)]


def _subjects() -> list[Scope]:
    return [Scope(team_id=t, user_id=u) for t, users in TEAMS.items() for u in users]


def _forgotten(scope: Scope) -> bool:
    return any(scope.team_id == t and (u is None or scope.user_id == u) for t, u in FORGETS)


class Canaries:
    """Per subject: the canary word in every text, and the vectors its memories carry."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.vectors: dict[tuple[str, str], list[bytes]] = {}

    def word(self, scope: Scope) -> str:
        return f"zq{self.tag}{scope.team_id}{scope.user_id}"

    def needles(self, scope: Scope) -> list[bytes]:
        out = [self.word(scope).encode()]
        for raw in self.vectors.get((scope.team_id, scope.user_id), []):
            out += [raw, base64.b64encode(raw)]
        return out


def _events(scope: Scope, canaries: Canaries, n: int, dim: int, model: str, rng: np.random.Generator, start: int = 0) -> list[Any]:
    word = canaries.word(scope)
    out: list[Any] = []
    for i in range(start, start + n):
        embedding = None
        if i % 2 == 0:
            vec = rng.standard_normal(dim).astype("<f4")
            vec /= np.linalg.norm(vec)
            raw = vec.tobytes()
            canaries.vectors.setdefault((scope.team_id, scope.user_id), []).append(raw)
            embedding = EmbeddingPayload(model=model, dim=dim, data=base64.b64encode(raw).decode())
        out.append(MemoryAdded(scope=scope, memory_id=f"m{i}", content=f"{word} remembers fact {i} about Lyon", embedding=embedding))
        if i % 4 == 0:
            out.append(MessageObserved(scope=scope, message_id=f"t{i}", content=f"{word} said something {i}"))
        if i % 20 == 0:  # open decisions: the reflector keeps them in its state topics
            out.append(
                DecisionRecorded(
                    scope=scope, decision_id=f"d{i}", subject=f"{word}-subject", rating="buy",
                    decision_text=f"{word} buys for reason {i}", deadline=utcnow() + timedelta(days=30),
                )
            )
    return out


async def _produce(settings: Settings, events: list[Any], ingress: list[Any]) -> None:
    async with MemstreamProducer(settings.streams, client_id="memstream-bench-forget") as producer:
        await producer.send_many(events)
    topics = Topics.from_settings(settings.broker)
    # raw on purpose: an outside writer's unsealed ingress records, not memstream's producer
    raw = AIOKafkaProducer(bootstrap_servers=settings.broker.bootstrap_servers, acks="all")
    await raw.start()
    try:
        for e in ingress:
            rec = encode_event(e)
            await raw.send(topics.ingress, rec.value, key=rec.key, headers=rec.headers)
        await raw.flush()
    finally:
        await raw.stop()


def _open(settings: Settings, root: Path | None = None) -> LanceStore:
    return LanceStore.from_settings(settings.storage, settings.embeddings.dim, root or TableSets(settings.storage.root).current(), create=False)


def _rows(store: LanceStore, scope: Scope) -> dict[str, dict[str, Any]]:
    where = subject_where(scope.team_id, scope.user_id)
    out: dict[str, dict[str, Any]] = {}
    for name in SCOPED_TABLES:
        for row in store.table(name).search().where(where).limit(None).to_list():
            row.pop("_distance", None)
            if "vector" in row:
                row["vector"] = list(row["vector"])
            out[f"{name}/{row['pk']}"] = row
    return out


def _row_count(store: LanceStore, scope: Scope) -> int:
    where = subject_where(scope.team_id, scope.user_id)
    return sum(store.table(name).count_rows(where) for name in SCOPED_TABLES)


async def _wait_rows(settings: Settings, expected: dict[tuple[str, str], int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    counts: dict[tuple[str, str], int] = {}
    while True:
        try:
            store = _open(settings)
            counts = {k: store.table("memories").count_rows(subject_where(*k)) for k in expected}
        except StoreError:  # the worker has not made its tables yet
            counts = {}
        if counts and all(counts[k] >= n for k, n in expected.items()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"projection incomplete after {timeout_s:.0f} s: {counts} of {expected}")
        await asyncio.sleep(0.5)


async def _raw_hits(settings: Settings, needles: list[bytes]) -> tuple[int, int]:
    """(records holding a needle, records read) over every kept-forever topic and the
    reflector's state topics."""
    topics = Topics.from_settings(settings.broker)
    consumer = create_consumer(settings.broker, client_id="memstream-bench-forget", group_id=None, enable_auto_commit=False)
    await consumer.start()
    hits = read = 0
    try:
        tps = [TopicPartition(t, p) for t in [*topics.kept_forever(), *state_topics(settings)] for p in range(settings.broker.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            while await consumer.position(tp) < ends[tp]:
                for r in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, ()):
                    read += 1
                    blob = b"".join([r.key or b"", r.value or b"", *(v or b"" for _, v in r.headers or ())])
                    hits += any(n in blob for n in needles)
    finally:
        await consumer.stop()
    return hits, read


def _file_hits(root: Path, needles: list[bytes]) -> int:
    words = [n for n in needles if n.startswith(b"zq")]
    return sum(1 for p in root.rglob("*") if p.is_file() and any(w in p.read_bytes() for w in words))


async def _forget_one(settings: Settings, embedder: Any, team: str, user: str | None, canaries: Canaries) -> float:
    scopes = [s for s in _subjects() if s.team_id == team and (user is None or s.user_id == user)]
    started = time.perf_counter()
    await forget(settings.streams, team, user)
    while True:
        store = _open(settings)
        visible = 0
        for scope in scopes:
            visible += len(search(store, embedder, scope, canaries.word(scope), k=10)) + _row_count(store, scope)
        if not visible:
            return (time.perf_counter() - started) * 1000
        await asyncio.sleep(0.05)


async def _run(settings: Settings, workdir: Path, n: int) -> dict[str, Any]:
    topics = Topics.from_settings(settings.broker)
    await ensure_topics(settings.broker.bootstrap_servers, topics)
    embedder = build_embedder(settings.embeddings)
    rng = np.random.default_rng(7)
    canaries = Canaries(uuid.uuid4().hex[:8])
    worker = WorkerProcess(settings, workdir)
    worker.services = ["projector", "sealer", "reflector"]
    worker.start()
    try:
        sdk: list[Any] = []
        ingress: list[Any] = []
        for scope in _subjects():
            events = _events(scope, canaries, n, settings.embeddings.dim, embedder.model_id, rng)
            sdk += events[: len(events) * 4 // 5]
            ingress += events[len(events) * 4 // 5 :]
        status(f"producing {len(sdk)} events through the SDK and {len(ingress)} through the ingress")
        await _produce(settings, sdk, ingress)
        per_subject = sum(1 for e in sdk + ingress if isinstance(e, MemoryAdded)) // len(_subjects())
        await _wait_rows(settings, {(s.team_id, s.user_id): per_subject for s in _subjects()}, 600)
        before = {(s.team_id, s.user_id): _rows(_open(settings), s) for s in _subjects() if not _forgotten(s)}

        status("forgetting while the other subjects keep writing")
        others = [s for s in _subjects() if not _forgotten(s)]
        more = [e for s in others for e in _events(s, canaries, max(10, n // 10), settings.embeddings.dim, embedder.model_id, rng, start=n)]
        traffic = asyncio.create_task(_produce(settings, more, []))
        visible_ms = [await _forget_one(settings, embedder, t, u, canaries) for t, u in FORGETS]
        await traffic
        await _wait_rows(settings, {(s.team_id, s.user_id): per_subject + max(10, n // 10) for s in others}, 600)

        live = _open(settings)
        forgotten = [s for s in _subjects() if _forgotten(s)]
        needles = [x for s in forgotten for x in canaries.needles(s)]
        rows_left = sum(_row_count(live, s) for s in forgotten)
        others_live = all(
            {k: v for k, v in _rows(live, s).items() if k in before[(s.team_id, s.user_id)]} == before[(s.team_id, s.user_id)]
            for s in others
        )
        plaintext_hits, records = await _raw_hits(settings, needles)
        # the table files: clean once the readers' grace has passed and the worker's
        # maintenance dropped the versions that still held the rows
        cleaning = time.perf_counter()
        while (file_hits := _file_hits(settings.local_lance_dir, needles)) and time.perf_counter() - cleaning < 180:
            await asyncio.sleep(2)
        files_clean_s = time.perf_counter() - cleaning + max(visible_ms) / 1000
    finally:
        worker.stop()

    status("replaying the whole log into a fresh table set")
    replay_settings = settings.model_copy(update={"storage.root": workdir / "replayed"})
    report = await replay(replay_settings)
    replayed = _open(replay_settings)
    replay_rows_left = sum(_row_count(replayed, s) for s in forgotten)
    others_replay = all(
        {k: v for k, v in _rows(replayed, s).items() if k in before[(s.team_id, s.user_id)]} == before[(s.team_id, s.user_id)]
        for s in others
    )
    return {
        "subjects": len(_subjects()),
        "forgotten": len(forgotten),
        "rows_left": rows_left,
        "lance_file_hits": file_hits,
        "lance_files_clean_s": round(files_clean_s, 1),
        "plaintext_hits": plaintext_hits,
        "records_scanned": records,
        "replay_rows_left": replay_rows_left,
        "replay_skipped": getattr(report, "unreadable", None),
        "others_equal": others_live and others_replay,
        "forget_visible_ms": [round(v, 1) for v in visible_ms],
        "forget_visible_p99_ms": round(percentile(visible_ms, 99), 1),
    }


def run(*, quick: bool = False) -> dict[str, Any]:
    n = 100 if quick else 1000
    with BenchWorkdir("forget") as work:
        settings = work.track(bench_settings(work.path))
        result = asyncio.run(_run(settings, work.path, n))
    result.update({"quick": quick, "memories_per_subject": n, **machine_info()})
    print_table(
        "bench forget",
        [
            ("rows_left", str(result["rows_left"]), "0"),
            ("plaintext_hits", str(result["plaintext_hits"]), "0"),
            ("replay_rows_left", str(result["replay_rows_left"]), "0"),
            ("others_equal", str(result["others_equal"]), "true"),
            ("forget_visible_p99_ms", str(result["forget_visible_p99_ms"]), "-"),
        ],
    )
    return result
