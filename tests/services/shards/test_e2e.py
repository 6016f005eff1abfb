"""One shard per partition, end to end: the worker writes each partition's events
into its own shard, readers route a space to its shard with the producer's murmur2
partitioner, and ``memstream replay`` migrates an unsharded set into the sharded
layout. Real broker, real LanceDB under ``tmp_path``, the worker as its own process."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from tests.services.test_worker import WorkerProcess, end_offsets

from memstream.domain.events import MemoryAdded, MessageObserved, Scope
from memstream.interfaces.service import MemoryService
from memstream.projections.search.hybrid import SearchFilters
from memstream.projections.store.shards import ShardedStore, is_sharded, shard_count
from memstream.projections.store.lance_store import StoreError
from memstream.projections.store.table_sets import TableSets
from memstream.services.replay.rebuild import replay
from memstream.services.shards.routing import open_store, space_partition
from memstream.settings.model import Settings
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SPACES = [Scope(team_id="acme", user_id=f"user{i}") for i in range(8)]


async def produce(settings: Settings, per_space: int) -> None:
    events = []
    for scope in SPACES:
        for i in range(per_space):
            events.append(MessageObserved(scope=scope, message_id=f"m{i}", content=f"turn {i} of {scope.user_id}"))
            events.append(
                MemoryAdded(scope=scope, memory_id=f"mem{i}", content=f"{scope.user_id} likes item {i}")
            )
    async with MemstreamProducer(settings.streams) as producer:
        await producer.send_many(events)


def assert_each_shard_holds_its_partitions_spaces(store: ShardedStore, per_space: int) -> None:
    partitions = store.partitions
    for p, shard in store.shards.items():
        users = set(shard.rows("memories", None, ["user_id"]).column("user_id").to_pylist())
        expected = {s.user_id for s in SPACES if space_partition(s, partitions) == p}
        assert users == expected, f"shard {p}"
        assert shard.count("memories") == per_space * len(expected)
        assert {part for _, part in shard.positions()} <= {p}, "a shard stores its own partition's positions only"


class ShardedWorker(WorkerProcess):
    def env(self) -> dict[str, str]:
        env = super().env()
        env["MEMSTREAM_STORAGE_SHARDED"] = "true" if self.settings.storage.sharded else "false"
        return env


async def caught_up(worker: WorkerProcess, topics: Topics) -> None:
    settings = worker.settings
    ends = await end_offsets(settings, [topics.events, topics.messages])
    deadline = time.monotonic() + 120
    while True:
        worker.assert_alive()
        current = TableSets(settings.storage.root).current()
        try:
            stored = open_store(settings, current, create=False).positions()
        except StoreError:  # not created yet
            stored = {}
        if all(stored.get(k, 0) >= v for k, v in ends.items() if v):
            return
        assert time.monotonic() < deadline, worker.log_text()[-3000:]
        await asyncio.sleep(0.5)


async def test_the_worker_writes_one_shard_per_partition_and_searches_find_their_space(
    fresh_topics: Topics, settings_for, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    settings = settings_for(fresh_topics, sharded=True, projector_batch_seconds=0.05)
    await produce(settings, 5)
    worker = ShardedWorker(settings, tmp_path)
    worker.start()
    service = MemoryService(settings)
    try:
        await caught_up(worker, fresh_topics)
        current = TableSets(settings.storage.root).current()
        assert is_sharded(current) and shard_count(current) == fresh_topics.partitions
        store = open_store(settings, current, create=False)
        assert_each_shard_holds_its_partitions_spaces(store, 5)

        await service.start()
        for scope in SPACES:
            hits = await service.search(scope, f"{scope.user_id} likes item", 10, SearchFilters(), interface="api")
            assert {h.memory_id for h in hits} == {f"mem{i}" for i in range(5)}
            assert all(scope.user_id in h.content for h in hits)
        # Read-your-writes through the shard's positions.
        async with MemstreamProducer(settings.streams) as producer:
            sent = await producer.add_memory(SPACES[3], "user3 just moved to Lisbon")
        await service.wait_for([sent.position])
        hits = await service.search(SPACES[3], "moved to Lisbon", 1, SearchFilters(), interface="api")
        assert hits[0].content == "user3 just moved to Lisbon"
    finally:
        await service.stop()
        assert worker.stop() == 0, worker.log_text()[-3000:]


async def test_replay_migrates_an_unsharded_set_into_shards_with_the_same_rows(
    fresh_topics: Topics, settings_for  # type: ignore[no-untyped-def]
) -> None:
    legacy = settings_for(fresh_topics)
    await produce(legacy, 4)
    first = await replay(legacy)
    assert first.swapped and not is_sharded(TableSets(legacy.lance_dir).current())

    sharded = legacy.model_copy(update={"sharded": True})
    second = await replay(sharded)
    assert second.swapped, second.summary()
    # The union of the shards equals the unsharded set it replaces, row for row.
    assert second.live_matches is True, second.differences
    current = TableSets(legacy.lance_dir).current()
    assert current == second.replay_dir and is_sharded(current)
    store = open_store(sharded, current, create=False)
    assert_each_shard_holds_its_partitions_spaces(store, 4)
    # Readers follow the layout of the current set, whatever their own setting says.
    service = MemoryService(legacy)
    await service.start()
    try:
        hits = await service.search(SPACES[5], "user5 likes item", 10, SearchFilters(), interface="api")
        assert {h.memory_id for h in hits} == {f"mem{i}" for i in range(4)}
    finally:
        await service.stop()
