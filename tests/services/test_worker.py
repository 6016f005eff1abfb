"""The Faust worker end to end: a real broker, a real LanceDB directory, the worker as
a separate process (``python -m memstream.services.worker``), exactly as deployed.

What must hold:

* events produced on Kafka become searchable; a record that is not an event is
  dead-lettered with its reason and the worker goes on; SIGINT stops it cleanly;
* SIGKILL at arbitrary moments under load loses and duplicates nothing: after the last
  restart the tables equal a full replay of the log (same rows, same content hashes),
  and the replay swaps in.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lancedb
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from memstream.domain.events import MemoryAdded, MemoryLinked, MessageObserved, Scope
from memstream.projections.embedders.factory import build_embedder
from memstream.services.replay.rebuild import replay
from memstream.projections.search.hybrid import search
from memstream.projections.store.lance_store import LanceStore
from memstream.projections.store.positions import VERSION_TOPIC
from memstream.settings.model import Settings
from memstream.projections.schema import scoped_key
from memstream.streams.dead_letters.publisher import parse_dead_letter
from memstream.streams.producers.producer import MemstreamProducer
from memstream.projections.store.dir_lock import LanceDirLock
from memstream.services.projector.service import projector_group
from memstream.streams.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

CATCH_UP_TIMEOUT_S = 90.0


# --- helpers ---------------------------------------------------------------------------


PROJECTOR = "memstream.services.projector.service"
RUNTIME = "memstream.services.projector.runtime"


class WorkerProcess:
    """``python -m memstream.services.worker`` for one settings object, started and
    stopped (or killed) on demand; its log goes to a file for post-mortems.
    ``constants`` (``{"module:NAME": value}``) are set in the worker process before it
    runs, as ``monkeypatch.setattr`` would in this one (a tuning constant a test needs
    smaller or larger)."""

    def __init__(self, settings: Settings, workdir: Path, constants: Mapping[str, Any] | None = None) -> None:
        self.settings = settings
        self.workdir = workdir
        self.constants = dict(constants or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def env(self) -> dict[str, str]:
        s = self.settings
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")}
        env.update(
            MEMSTREAM_BROKER_BOOTSTRAP_SERVERS=s.broker.bootstrap_servers,
            MEMSTREAM_BROKER_TOPIC_PREFIX=s.broker.topic_prefix,
            MEMSTREAM_BROKER_PARTITIONS=str(s.broker.partitions),
            MEMSTREAM_WORKER_APP_ID=s.worker.app_id,
            MEMSTREAM_STORAGE_ROOT=str(s.storage.root),
            MEMSTREAM_HOME=str(s.home),
            MEMSTREAM_WORKER_PROJECTOR_BATCH_SECONDS=str(s.worker.projector_batch_seconds),
            MEMSTREAM_STORAGE_OPTIMIZE_EVERY_S=str(s.storage.optimize_every_s),
            MEMSTREAM_STORAGE_READER_GRACE_S=str(s.storage.reader_grace_s),
            MEMSTREAM_EMBEDDINGS_PROVIDER=s.embeddings.provider,
            MEMSTREAM_EMBEDDINGS_DIM=str(s.embeddings.dim),
        )
        return env

    def command(self) -> list[str]:
        args = ["--services", "projector"]
        if not self.constants:
            return [sys.executable, "-m", "memstream.services.worker", *args]
        lines = ["import importlib, sys", "from memstream.services.worker import main"]
        for target, value in self.constants.items():
            module, name = target.split(":")
            assert hasattr(importlib.import_module(module), name), target  # a stale name fails here, not silently
            lines.append(f"setattr(importlib.import_module({module!r}), {name!r}, {value!r})")
        lines.append(f"sys.exit(main({args!r}))")
        return [sys.executable, "-c", "\n".join(lines)]

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None
        self.starts += 1
        log = open(self.workdir / f"worker-{self.starts}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.command(),
            cwd=self.workdir,  # no stray .env file is read
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def log_text(self) -> str:
        return (self.workdir / f"worker-{self.starts}.log").read_text(errors="replace")

    def kill(self) -> None:
        assert self.proc is not None
        children = child_pids(self.proc.pid)
        self.proc.kill()  # SIGKILL: no cleanup of any kind
        self.proc.wait(timeout=30)
        # Its helper processes (the decoder) must not outlive it.
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [pid for pid in children if Path(f"/proc/{pid}").exists()]
        assert not left, f"child processes {left} outlived the killed worker"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"worker did not stop on {sig!r}:\n{self.log_text()[-3000:]}") from None

    def assert_alive(self) -> None:
        assert self.proc is not None
        code = self.proc.poll()
        assert code is None, f"worker exited with {code}:\n{self.log_text()[-3000:]}"

    def ensure_dead(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def child_pids(pid: int) -> list[int]:
    """Live child processes of ``pid`` (Linux ``/proc``)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out.append(int(entry.name))
    return out


def read_positions(lance_dir: Path) -> dict[tuple[str, int], int]:
    """The worker's stored positions, read without opening a (writing) LanceStore."""
    try:
        table = lancedb.connect(str(lance_dir)).open_table("positions").to_arrow()
    except (ValueError, FileNotFoundError):
        return {}
    furthest: dict[tuple[str, int], int] = {}
    for t, p, o in zip(
        table.column("topic").to_pylist(), table.column("partition").to_pylist(), table.column("next_offset").to_pylist()
    ):
        if not t.startswith(VERSION_TOPIC):  # the table versions published with the positions
            furthest[(t, int(p))] = max(int(o), furthest.get((t, int(p)), 0))
    return furthest


async def end_offsets(settings: Settings, topic_names: list[str]) -> dict[tuple[str, int], int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.broker.bootstrap_servers)
    await consumer.start()
    try:
        tps = [
            TopicPartition(name, p)
            for name in topic_names
            for p in range(settings.broker.partitions)
        ]
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    return {(tp.topic, tp.partition): off for tp, off in ends.items()}


async def wait_caught_up(worker: WorkerProcess, topics: Topics) -> dict[tuple[str, int], int]:
    """Until the stored positions reach the topics' end offsets."""
    ends = await end_offsets(worker.settings, [topics.events, topics.messages])
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    while True:
        worker.assert_alive()
        positions = read_positions(worker.settings.storage.root)
        if all(positions.get(k, 0) >= v for k, v in ends.items()):
            return positions
        if time.monotonic() > deadline:
            raise AssertionError(
                f"worker did not catch up: positions {positions}, ends {ends}\n{worker.log_text()[-3000:]}"
            )
        await asyncio.sleep(0.3)


async def wait_backlog(worker: WorkerProcess, topics: Topics) -> None:
    """Until records are on the log that the worker has not projected yet (a worker
    that keeps up is only behind while a burst arrives: that is when to kill it)."""
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    while time.monotonic() < deadline:
        ends = await end_offsets(worker.settings, [topics.events, topics.messages])
        if sum(ends.values()) > sum(read_positions(worker.settings.storage.root).values()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the worker was never behind the log")


async def wait_progress(worker: WorkerProcess, beyond: int) -> int:
    """Until the worker has stored positions summing past ``beyond``; returns the sum."""
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    while True:
        worker.assert_alive()
        total = sum(read_positions(worker.settings.storage.root).values())
        if total > beyond:
            return total
        if time.monotonic() > deadline:
            raise AssertionError(f"worker made no progress past {beyond}:\n{worker.log_text()[-3000:]}")
        await asyncio.sleep(0.1)


async def group_offsets(settings: Settings) -> dict[tuple[str, int], int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.broker.bootstrap_servers)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(projector_group(settings))
    finally:
        await admin.close()
    return {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items()}


async def send_raw(settings: Settings, topic: str, records: list[tuple[bytes | None, bytes | None]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.broker.bootstrap_servers)
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, value=value, key=key)
    finally:
        await producer.stop()


async def read_dead_letters(settings: Settings, topic: str) -> list:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=settings.broker.bootstrap_servers, auto_offset_reset="earliest"
    )
    await consumer.start()
    out = []
    try:
        while True:
            polled = await consumer.getmany(timeout_ms=1500)
            if not polled:
                return out
            for records in polled.values():
                out.extend(parse_dead_letter(r.key, r.value, r.headers) for r in records)
    finally:
        await consumer.stop()


@pytest.fixture
def make_worker(tmp_path: Path):  # type: ignore[no-untyped-def]
    workers: list[WorkerProcess] = []

    def make(settings: Settings, constants: Mapping[str, Any] | None = None) -> WorkerProcess:
        w = WorkerProcess(settings, tmp_path, constants)
        workers.append(w)
        return w

    yield make
    for w in workers:
        w.ensure_dead()


# --- tests -----------------------------------------------------------------------------


async def test_events_become_searchable_bad_records_are_dead_lettered(
    fresh_topics: Topics, settings_for, make_worker  # type: ignore[no-untyped-def]
) -> None:
    settings = settings_for(fresh_topics, projector_batch_seconds=0.1)
    worker = make_worker(settings, {f"{PROJECTOR}:BATCH_SIZE": 200})
    worker.start()

    alice = Scope(team_id="acme", user_id="alice")
    bob = Scope(team_id="acme", user_id="bob")
    async with MemstreamProducer(settings.streams) as producer:
        await producer.send_many(
            [
                MessageObserved(scope=alice, message_id="m1", content="I moved to Lisbon last spring"),
                MemoryAdded(
                    scope=alice,
                    memory_id="a-city",
                    content="Alice lives in Lisbon",
                    source_message_ids=("m1",),
                ),
                MemoryAdded(scope=alice, memory_id="a-pet", content="Alice has a cat called Miso"),
                MemoryAdded(scope=bob, memory_id="b-city", content="Bob lives in Lisbon too"),
            ]
        )
        # Poison between good records: not JSON, an invalid event, a tombstone.
        await send_raw(
            settings,
            fresh_topics.events,
            [
                (b"acme/alice", b"\xff\xfe not json"),
                (b"acme/alice", b'{"type": "MemoryAdded", "scope": {"team_id": "acme"}}'),
                (b"acme/alice", None),
            ],
        )
        await producer.send(
            MemoryAdded(scope=alice, memory_id="a-food", content="Alice is vegetarian")
        )

    await wait_caught_up(worker, fresh_topics)
    assert worker.stop(signal.SIGINT) == 0, worker.log_text()[-3000:]

    store = LanceStore.from_settings(settings.storage, settings.embeddings.dim)
    embedder = build_embedder(settings.embeddings)
    hits = search(store, embedder, alice, "where does Alice live", k=3)
    assert hits and hits[0].memory_id == "a-city"
    assert {h.memory_id for h in hits} <= {"a-city", "a-pet", "a-food"}  # never Bob's
    # The worker went on after the poison: the memory after it is there.
    assert [h.memory_id for h in search(store, embedder, alice, "vegetarian", k=1)] == ["a-food"]
    assert store.get_messages(alice, ["m1"])[0]["content"] == "I moved to Lisbon last spring"

    dead = await read_dead_letters(settings, fresh_topics.dead_letter)
    by_value = {d.original_value: d for d in dead}
    assert b"\xff\xfe not json" in by_value
    assert None in by_value
    assert all(d.stage == "decode" and d.source_topic == fresh_topics.events for d in dead)
    assert "not UTF-8" in by_value[b"\xff\xfe not json"].reason
    assert len({d.source_offset for d in dead}) == 3
    first_digest = store.table_digest()
    del store

    # Stored positions, not Kafka's commits, say where to resume: with the group's
    # commits at the end of the log but a fresh (empty) table set, the worker must
    # rebuild everything from offset 0.
    committed = await group_offsets(settings)
    ends = await end_offsets(settings, [fresh_topics.events, fresh_topics.messages])
    assert {k: v for k, v in ends.items() if v} == {k: committed.get(k) for k, v in ends.items() if v}
    Path(settings.storage.root).rename(Path(str(settings.storage.root) + ".first"))
    worker.start()
    await wait_caught_up(worker, fresh_topics)
    assert worker.stop(signal.SIGTERM) == 0, worker.log_text()[-3000:]
    assert LanceStore.from_settings(settings.storage, settings.embeddings.dim).table_digest() == first_digest


async def _produce_load(
    settings: Settings,
    topics: Topics,
    expected: dict[str, set[str]],
    bad_sent: list[tuple[int, int]],
    enough: asyncio.Event,
    *,
    min_memories: int = 1000,
    max_memories: int = 8000,
) -> None:
    """Messages, memories (some re-added: same id, new event), supersede links and
    a few poison records, in small bursts so the worker sees a live stream; at least
    ``min_memories``, then on until ``enough`` is set (or ``max_memories``)."""
    rng = random.Random(7)
    scopes = [Scope(team_id=f"t{i % 3}", user_id=f"u{i}") for i in range(6)]
    raw = AIOKafkaProducer(bootstrap_servers=settings.broker.bootstrap_servers)
    await raw.start()
    try:
        async with MemstreamProducer(settings.streams) as producer:
            made: dict[str, list[str]] = {}
            burst: list = []
            for i in range(max_memories):
                if i >= min_memories and enough.is_set():
                    break
                scope = scopes[i % len(scopes)]
                mid = f"mem-{i}"
                msg = f"msg-{i}"
                burst.append(MessageObserved(scope=scope, message_id=msg, content=f"turn {i}: note {uuid.uuid4().hex[:6]}"))
                burst.append(
                    MemoryAdded(
                        scope=scope,
                        memory_id=mid,
                        content=f"fact {i} about {scope.user_id}: {rng.choice(['tea', 'coffee', 'chess', 'jazz'])}",
                        source_message_ids=(msg,),
                    )
                )
                expected["memories"].add(scoped_key(scope.team_id, scope.user_id, mid))
                expected["messages"].add(scoped_key(scope.team_id, scope.user_id, msg))
                earlier = made.setdefault(scope.space, [])
                if earlier and rng.random() < 0.1:
                    burst.append(
                        MemoryLinked(
                            scope=scope,
                            from_memory_id=mid,
                            to_memory_id=rng.choice(earlier),
                            relation="supersedes",
                        )
                    )
                if earlier and rng.random() < 0.05:  # the same memory id added again
                    burst.append(
                        MemoryAdded(scope=scope, memory_id=rng.choice(earlier), content=f"revised fact {i}")
                    )
                earlier.append(mid)
                if len(burst) >= 150:
                    await producer.send_many(burst)
                    burst = []
                    if rng.random() < 0.3:
                        md = await raw.send_and_wait(topics.events, value=b"{broken", key=b"t0/u0")
                        bad_sent.append((md.partition, md.offset))
                    await asyncio.sleep(0.4)
            if burst:
                await producer.send_many(burst)
            md = await raw.send_and_wait(topics.events, value=b"[]", key=b"t0/u0")
            bad_sent.append((md.partition, md.offset))
    finally:
        await raw.stop()


async def test_sigkill_under_load_equals_a_full_replay(
    fresh_topics: Topics, settings_for, make_worker  # type: ignore[no-untyped-def]
) -> None:
    settings = settings_for(
        fresh_topics,
        projector_batch_seconds=0.1,
        optimize_every_s=2.0,  # maintenance runs (and may get killed) too:
        reader_grace_s=10.0,  # compactions, index updates beside the writer, cleanups
        embedder="local",  # thousands of memories to project between kills: the fast one
    )
    worker = make_worker(settings, {f"{PROJECTOR}:BATCH_SIZE": 300})
    expected: dict[str, set[str]] = {"memories": set(), "messages": set()}
    bad: list[tuple[int, int]] = []
    kills_done = asyncio.Event()
    load = asyncio.create_task(_produce_load(settings, fresh_topics, expected, bad, kills_done))

    rng = random.Random(11)
    progress = 0
    behind_at_kill = []
    kills = 0
    worker.start()
    while len([b for b in behind_at_kill if b > 0]) < 3 and kills < 12:
        # Kill only after the worker stored new positions: mid-stream, mid-write.
        await wait_progress(worker, progress)
        await asyncio.sleep(rng.uniform(0.0, 0.6))
        await wait_backlog(worker, fresh_topics)
        worker.kill()
        kills += 1
        progress = sum(read_positions(settings.storage.root).values())
        ends = await end_offsets(settings, [fresh_topics.events, fresh_topics.messages])
        behind_at_kill.append(sum(ends.values()) - progress)
        worker.start()
    kills_done.set()
    await load
    # Three kills hit a worker with records still to project (a backlog or a live
    # stream). A fast worker can catch up between seeing the backlog and the kill;
    # such a kill still tests recovery but does not count.
    assert len([b for b in behind_at_kill if b > 0]) >= 3, behind_at_kill

    await wait_caught_up(worker, fresh_topics)
    assert worker.stop(signal.SIGTERM) == 0, worker.log_text()[-3000:]

    live = LanceStore.from_settings(settings.storage, settings.embeddings.dim)
    memories = live.rows("memories", None, ["pk"]).column("pk").to_pylist()
    messages = live.rows("messages", None, ["pk"]).column("pk").to_pylist()
    assert len(memories) == len(set(memories)), "duplicate memory rows"
    assert set(memories) == expected["memories"], "missing or extra memories"
    assert len(messages) == len(set(messages)) and set(messages) == expected["messages"]
    live_digest = live.table_digest()
    del live

    report = await replay(settings)  # the worker is stopped: it swaps in
    assert report.dead_decode == len(bad)
    assert report.positions == {k: v for k, v in report.end_offsets.items() if v > 0}
    assert report.live_digest == live_digest
    assert report.replay_digest == live_digest, report.differences
    assert report.live_matches is True and report.swapped
    assert report.old_dir is not None and report.old_dir.exists()
    assert LanceStore.from_settings(settings.storage, settings.embeddings.dim).table_digest() == live_digest

    # Every poison record was dead-lettered (a kill may have duplicated some; none lost).
    dead = await read_dead_letters(settings, fresh_topics.dead_letter)
    assert {(d.source_partition, d.source_offset) for d in dead} == set(bad)
    assert all(d.stage == "decode" and d.source_topic == fresh_topics.events for d in dead)


def position_rows(lance_dir: Path, topic: str) -> list[int]:
    """The next offsets stored for ``topic``, one per commit that moved them (the
    positions table is append-only until maintenance prunes it)."""
    table = lancedb.connect(str(lance_dir)).open_table("positions").to_arrow()
    return sorted(
        int(o) for t, o in zip(table.column("topic").to_pylist(), table.column("next_offset").to_pylist()) if t == topic
    )


async def test_a_trickle_of_writes_is_committed_together_within_the_linger(
    fresh_topics: Topics, settings_for, make_worker  # type: ignore[no-untyped-def]
) -> None:
    # Maintenance (which prunes position rows) never runs here: every commit keeps its row.
    settings = settings_for(fresh_topics, optimize_every_s=600.0, embedder="local")
    worker = make_worker(settings, {f"{PROJECTOR}:LINGER_S": 5.0, f"{RUNTIME}:COMPACT_AFTER_COMMITS": 1_000})
    worker.start()
    alice = Scope(team_id="acme", user_id="alice")
    async with MemstreamProducer(settings.streams) as producer:
        await producer.send(MemoryAdded(scope=alice, memory_id="m0", content="the first write after a quiet spell"))
        await wait_caught_up(worker, fresh_topics)  # written at once: no linger before it
        assert len(position_rows(settings.storage.root, fresh_topics.events)) == 1
        # Four writes 0.2 s apart, all within the linger that followed the first commit:
        # without it each would be a commit of its own.
        for i in range(1, 5):
            await producer.send(MemoryAdded(scope=alice, memory_id=f"m{i}", content=f"trickle write number {i}"))
            await asyncio.sleep(0.2)
    positions = await wait_caught_up(worker, fresh_topics)
    assert worker.stop(signal.SIGTERM) == 0, worker.log_text()[-3000:]

    rows = position_rows(settings.storage.root, fresh_topics.events)
    assert len(rows) == 2, f"the four trickle writes took {len(rows) - 1} commits, not one"
    assert rows[-1] == sum(v for (t, _), v in positions.items() if t == fresh_topics.events)
    store = LanceStore.from_settings(settings.storage, settings.embeddings.dim)
    assert sorted(store.rows("memories", None, ["memory_id"]).column("memory_id").to_pylist()) == [
        f"m{i}" for i in range(5)
    ]


def _run_worker_cli(settings: Settings, workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = WorkerProcess(settings, workdir).env()
    return subprocess.run(
        [sys.executable, "-m", "memstream.services.worker", *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_worker_refuses_a_directory_another_worker_holds(
    fresh_topics: Topics, settings_for, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    settings = settings_for(fresh_topics)
    held = LanceDirLock(settings.storage.root)
    held.acquire("memstream worker elsewhere")
    try:
        done = _run_worker_cli(settings, tmp_path, "--services", "projector")
    finally:
        held.release()
    assert done.returncode == 1
    assert "in use by memstream worker elsewhere" in done.stderr
    assert done.stderr.strip().count("\n") == 0, "one readable line, no traceback"


async def test_worker_rejects_unknown_services(
    fresh_topics: Topics, settings_for, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    done = _run_worker_cli(settings_for(fresh_topics), tmp_path, "--services", "projector,telepathy")
    assert done.returncode == 1
    assert "unknown service(s) telepathy" in done.stderr


async def test_the_old_agents_flag_still_picks_services_with_a_warning(
    fresh_topics: Topics, settings_for, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    done = _run_worker_cli(settings_for(fresh_topics), tmp_path, "--agents", "projector,telepathy")
    assert done.returncode == 1
    assert "--agents is deprecated, use --services" in done.stderr
    assert "unknown service(s) telepathy" in done.stderr
