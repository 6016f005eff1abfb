"""What ``memstream shards`` shows: per shard of the current set, who writes it (its
lease holder), its stored positions, its lag behind the log and its row counts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import TopicPartition

from memstream.projections.schema import POSITIONS, TABLE_NAMES
from memstream.projections.store import LanceDirLock, ShardedStore, TableSets, is_sharded, shard_dir
from memstream.services.shards.routing import open_store
from memstream.settings import Settings
from memstream.streams.clients import create_consumer
from memstream.streams.topics import Topics

__all__ = ["ShardStatus", "NotShardedError", "shard_statuses", "end_offsets"]


class NotShardedError(RuntimeError):
    """The current table set is not cut into shards."""


@dataclass
class ShardStatus:
    partition: int
    owner: str | None
    positions: dict[str, int] = field(default_factory=dict)
    """Per topic (events, messages), the shard's stored next offset."""
    lag: dict[str, int] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)

    @property
    def total_lag(self) -> int:
        return sum(self.lag.values())


async def end_offsets(settings: Settings, topics: list[str], partitions: int) -> dict[tuple[str, int], int]:
    consumer = create_consumer(settings.broker, client_id=f"{settings.worker.app_id}-shards")
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(t, p) for t in topics for p in range(partitions)])
    finally:
        await consumer.stop()
    return {(tp.topic, tp.partition): int(o) for tp, o in ends.items()}


def shard_statuses(settings: Settings, ends: dict[tuple[str, int], int] | None) -> list[ShardStatus]:
    """One status per shard (``ends``: the log end offsets, None when Kafka is not asked)."""
    current = TableSets(settings.storage.root).current()
    if not is_sharded(current):
        raise NotShardedError(
            f"the table set {current} is not sharded (MEMSTREAM_STORAGE_SHARDED=true and `memstream replay` migrate it)"
        )
    store = open_store(settings, current, create=False)
    assert isinstance(store, ShardedStore)
    topics = Topics.from_settings(settings.broker)
    out = []
    for p, shard in store.shards.items():
        stored = shard.positions()
        status = ShardStatus(partition=p, owner=_owner(current, p))
        for topic in (topics.events, topics.messages):
            status.positions[topic] = int(stored.get((topic, p), 0))
            if ends is not None:
                status.lag[topic] = max(0, ends.get((topic, p), 0) - status.positions[topic])
        status.rows = {name: int(shard.count(name)) for name in TABLE_NAMES if name != POSITIONS}
        out.append(status)
    return out


def _owner(set_dir: Path, partition: int) -> str | None:
    return LanceDirLock(shard_dir(set_dir, partition)).holder()
