"""Workers in a consumer group, one shard per partition: three worker processes on six
partitions under a steady load; one is killed with SIGKILL, its shards move to the
others, which resume them from the shards' stored positions. In the end nothing is
lost or duplicated, every shard equals a replay of its partitions, searches during
the rebalances never failed nor crossed spaces, and records put on the wrong
partition by kcat's default (crc32) partitioner are projected in the right shard.

Real broker, real LanceDB under ``tmp_path``, the workers as their own processes."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.services.projector.test_runtime import assert_maintenance_drops_old_versions
from tests.services.test_worker import WorkerProcess, end_offsets
from tests.streams.producers.test_contract import documented_kcat_flags, kcat

from memstream.domain.events import MemoryAdded, Scope
from memstream.interfaces.service import MemoryService
from memstream.projections.search.hybrid import SearchFilters
from memstream.projections.store.shards import ShardedStore
from memstream.projections.store.table_sets import TableSets
from memstream.services.replay.rebuild import ReplayError, replay
from memstream.services.projector.shard_owner import GroupRuntime
from memstream.services.shards.routing import open_store, space_partition
from memstream.settings.model import Settings, child_env
from memstream.streams.admin import ensure_topics
from memstream.streams.producers.producer import MemstreamProducer
from memstream.codec.wire import encode_event
from memstream.streams.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 6
SPACES = [Scope(team_id="fleet", user_id=f"agent{i}") for i in range(18)]


async def group_settings(
    settings_for, bootstrap: str, topic_prefix: str, partitions: int = PARTITIONS, **overrides  # type: ignore[no-untyped-def]
) -> tuple[Topics, Settings]:
    """Fresh topics of ``partitions`` and the settings of a sharded worker group that
    commits small batches often (``overrides`` on top)."""
    topics = Topics(prefix=topic_prefix, partitions=partitions, replication_factor=1)
    await ensure_topics(bootstrap, topics)
    settings = settings_for(
        topics, sharded=True, embedder="local", projector_batch_seconds=0.05, optimize_every_s=2.0, **overrides
    )
    return topics, settings


class GroupWorker(WorkerProcess):
    def __init__(self, settings: Settings, workdir: Path, instance: str) -> None:
        super().__init__(settings, workdir)
        self.instance = instance

    def env(self) -> dict[str, str]:
        env = super().env()
        env.update(
            MEMSTREAM_STORAGE_SHARDED="true",
            MEMSTREAM_WORKER_INSTANCE=self.instance,
            MEMSTREAM_WORKER_SESSION_TIMEOUT_S=str(self.settings.worker.session_timeout_s),
        )
        return env


def stored_positions(settings: Settings) -> dict[tuple[str, int], int]:
    current = TableSets(settings.storage.root).current()
    try:
        return open_store(settings, current, create=False).positions()
    except Exception:  # noqa: BLE001 - shards not created yet
        return {}


async def wait_caught_up(settings: Settings, topics: Topics, workers: list[GroupWorker]) -> None:
    """Until the stored positions reach the topics' ends, and the ends have not moved
    since: passing a misrouted record re-publishes its copy, which lands beyond ends
    read before."""
    ends = await end_offsets(settings, [topics.events, topics.messages])
    deadline = time.monotonic() + 240
    while True:
        stored = stored_positions(settings)
        if all(stored.get(k, 0) >= v for k, v in ends.items() if v):
            now = await end_offsets(settings, [topics.events, topics.messages])
            if now == ends:
                return
            ends = now
        logs = "\n".join(w.log_text()[-1500:] for w in workers)
        assert time.monotonic() < deadline, f"not caught up: {stored} vs {ends}\n{logs}"
        await asyncio.sleep(0.5)


def crc32_misrouted(i: int) -> MemoryAdded:
    """A memory whose space kcat's crc32 partitioner puts on another partition."""
    n = i
    while True:
        scope = Scope(team_id="kcat", user_id=f"k{n}")
        key = scope.space.encode()
        if zlib.crc32(key) % PARTITIONS != space_partition(scope, PARTITIONS):
            return MemoryAdded(scope=scope, memory_id=f"kc{i}", content=f"k{n} prefers tea from kcat")
        n += 1000


def kcat_produce(settings: Settings, topic: str, event: MemoryAdded, tmp_path: Path) -> None:
    record = encode_event(event)
    body = tmp_path / f"{event.memory_id}.json"
    body.write_bytes(record.value)
    flags = documented_kcat_flags()
    at = flags.index("topic.partitioner=murmur2_random")
    del flags[at - 1 : at + 1]  # kcat's own default partitioner: crc32 (consistent_random)
    run = subprocess.run(
        [kcat(), "-P", "-b", settings.broker.bootstrap_servers, "-t", topic, "-k", record.key.decode(), *flags, str(body)],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 0, run.stderr


async def test_three_workers_lose_a_member_under_load_and_the_shards_stay_exact(
    kafka_bootstrap: str, topic_prefix: str, settings_for, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    topics, settings = await group_settings(
        settings_for, kafka_bootstrap, topic_prefix, worker_session_timeout_s=6.0, read_wait_max_s=30.0
    )
    workers = [GroupWorker(settings, tmp_path, f"w{i}") for i in range(3)]
    for w in workers:
        w.workdir = tmp_path / w.instance
        w.workdir.mkdir()
        w.start()
    traffic = Traffic()

    service = MemoryService(settings)
    loops: list[asyncio.Future[None]] = []
    try:
        loops.append(asyncio.ensure_future(traffic.load(settings, 7)))
        await wait_until_progress(settings, 300, workers)
        await service.start()
        loops.append(asyncio.ensure_future(traffic.search(service, 3)))
        for i in range(4):  # kcat records on crc32's partition while the group rebalances
            kcat_produce(settings, topics.events, crc32_misrouted(i), tmp_path)
        victim = workers[1]
        victim.kill()  # SIGKILL under load: its shards must move to the other two
        await asyncio.sleep(settings.worker.session_timeout_s + 6)
        for i in range(4, 8):
            kcat_produce(settings, topics.events, crc32_misrouted(i), tmp_path)
        await asyncio.sleep(3)
        traffic.stop.set()
        await asyncio.gather(*loops)
        await wait_caught_up(settings, topics, [workers[0], workers[2]])
        for w in (workers[0], workers[2]):
            w.assert_alive()
            assert "projector owns shards" in w.log_text()
    finally:
        traffic.stop.set()
        await asyncio.gather(*loops, return_exceptions=True)
        await service.stop()

    assert traffic.failures == [], traffic.failures[:5]
    assert traffic.crossed == [], traffic.crossed[:5]
    assert traffic.searches > 0

    kcat_ids = {f"kc{i}": crc32_misrouted(i).scope for i in range(8)}
    live = assert_shards_exact(settings, traffic.acked, kcat_ids)

    # `memstream shards` names a live owner for every shard, no lag, every row.
    shown = subprocess.run(
        [sys.executable, "-m", "memstream", "shards", "--json"],
        env={**child_env(settings), "MEMSTREAM_STORAGE_SHARDED": "true"}, cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )
    assert shown.returncode == 0, shown.stderr
    statuses = [json.loads(line) for line in shown.stdout.splitlines()]
    assert sorted(s["partition"] for s in statuses) == list(range(PARTITIONS))
    assert all(s["owner"] and "memstream worker" in s["owner"] for s in statuses), statuses
    assert all(sum(s["lag"].values()) == 0 for s in statuses), statuses
    assert sum(s["rows"]["memories"] for s in statuses) == sum(len(v) for v in traffic.acked.values()) + 8

    await assert_replay_equals_live(settings, live, [workers[0], workers[2]])


async def wait_until_progress(settings: Settings, rows: int, workers: list[GroupWorker]) -> None:
    deadline = time.monotonic() + 180
    while sum(stored_positions(settings).values()) < rows:
        for w in workers:
            w.assert_alive()
        assert time.monotonic() < deadline, "\n".join(w.log_text()[-2000:] for w in workers)
        await asyncio.sleep(0.5)


def assert_shards_exact(settings: Settings, acked: dict[Scope, set[str]], extra: dict[str, Scope] | None = None) -> ShardedStore:
    """Every acknowledged memory (``acked`` per space, plus ``extra`` memory ids with
    their space) is in exactly one shard, its space's, once; no shard holds anything else."""
    live = open_store(settings, TableSets(settings.storage.root).current(), create=False)
    assert isinstance(live, ShardedStore)
    wanted: dict[tuple[str, str], set[str]] = {}
    for scope, ids in acked.items():
        wanted.setdefault((scope.team_id, scope.user_id), set()).update(ids)
    for memory_id, scope in (extra or {}).items():
        wanted.setdefault((scope.team_id, scope.user_id), set()).add(memory_id)
    for p, shard in live.shards.items():
        rows = shard.rows("memories", None, ["pk", "user_id", "team_id", "memory_id"]).to_pylist()
        pks = [r["pk"] for r in rows]
        assert len(pks) == len(set(pks)), f"duplicated rows in shard {p}"
        have: dict[tuple[str, str], set[str]] = {}
        for r in rows:
            assert space_partition(Scope(team_id=r["team_id"], user_id=r["user_id"]), live.partitions) == p
            have.setdefault((r["team_id"], r["user_id"]), set()).add(r["memory_id"])
        for (team, user), ids in wanted.items():
            if space_partition(Scope(team_id=team, user_id=user), live.partitions) == p:
                got = have.pop((team, user), set())
                assert got == ids, f"shard {p}, space {team}/{user}: lost {sorted(ids - got)[:5]}, extra {sorted(got - ids)[:5]}"
        assert have == {}, f"shard {p} holds unacknowledged spaces {sorted(have)[:5]}"
    return live


async def assert_replay_equals_live(settings: Settings, live: ShardedStore, workers: list[GroupWorker]) -> None:
    """A replay refuses to run under a group of workers; once they stop (SIGTERM, exit
    0), it swaps in a set whose every shard equals the live one."""
    with pytest.raises(ReplayError, match="consumer group"):
        await replay(settings)
    for w in workers:
        assert w.stop(signal.SIGTERM) == 0, w.log_text()[-3000:]
    live_digests = {p: s.table_digest() for p, s in live.shards.items()}
    report = await replay(settings)
    assert report.swapped and report.live_matches is True, report.differences
    rebuilt = open_store(settings, report.replay_dir, create=False)
    assert {p: s.table_digest() for p, s in rebuilt.shards.items()} == live_digests


async def test_a_shard_taken_over_drops_its_old_versions_at_the_next_maintenance(
    kafka_bootstrap: str, topic_prefix: str, settings_for  # type: ignore[no-untyped-def]
) -> None:
    topics = Topics(prefix=topic_prefix, partitions=2, replication_factor=1)
    settings = settings_for(topics, sharded=True, embedder="local", reader_grace_s=7200.0)
    rt = GroupRuntime(settings, topics)
    await rt.open()
    try:
        await rt.own(frozenset({0}))
        await assert_maintenance_drops_old_versions(rt, rt.store.shard(0), topics.events)
    finally:
        await rt.close()


@dataclass
class Traffic:
    """A steady SDK produce over ``SPACES`` and a closed loop of searches, both until
    ``stop``: what was acknowledged per space, and what the searches saw."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    acked: dict[Scope, set[str]] = field(default_factory=lambda: {s: set() for s in SPACES})
    failures: list[str] = field(default_factory=list)
    crossed: list[str] = field(default_factory=list)
    searches: int = 0

    async def load(self, settings: Settings, seed: int) -> None:
        rng = random.Random(seed)
        async with MemstreamProducer(settings.streams) as producer:
            i = 0
            while not self.stop.is_set():
                burst = []
                for _ in range(20):
                    scope = rng.choice(SPACES)
                    burst.append(MemoryAdded(scope=scope, memory_id=f"m{i}", content=f"{scope.user_id} noted fact {i}"))
                    i += 1
                await producer.send_many(burst)
                for e in burst:
                    self.acked[e.scope].add(e.memory_id)
                await asyncio.sleep(0.05)

    async def search(self, service: MemoryService, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            scope = rng.choice(SPACES)
            try:
                hits = await service.search(scope, f"{scope.user_id} noted fact", 10, SearchFilters(), interface="api")
            except Exception as exc:  # noqa: BLE001 - counted: a search must never fail
                self.failures.append(f"{type(exc).__name__}: {exc}")
            else:
                self.crossed.extend(h.memory_id for h in hits if not h.content.startswith(f"{scope.user_id} "))
                self.searches += 1
            await asyncio.sleep(0.05)
