"""What ``memstream shards`` reports per shard: its lease holder, stored positions,
lag behind the log and row counts. Real broker, real LanceDB shards under
``tmp_path`` (built by a replay of the log, as a migration builds them)."""

from __future__ import annotations

import os
from collections import Counter

import pytest
from tests.services.shards.test_e2e import SPACES, produce

from memstream.projections.store.table_sets import TableSets
from memstream.services.replay.rebuild import replay
from memstream.services.projector.shard_owner import ShardLeases
from memstream.services.shards.routing import space_partition
from memstream.services.shards.status import NotShardedError, end_offsets, shard_statuses
from memstream.settings.model import Settings
from memstream.streams.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


async def sharded_set(settings: Settings, per_space: int) -> dict[int, int]:
    """Write ``per_space`` memories and turns per space and replay them into shards;
    the spaces per partition."""
    await produce(settings, per_space)
    report = await replay(settings)
    assert report.swapped, report.summary()
    return dict(Counter(space_partition(s, settings.broker.partitions) for s in SPACES))


async def test_each_shard_shows_its_owner_positions_lag_and_rows(
    fresh_topics: Topics, settings_for  # type: ignore[no-untyped-def]
) -> None:
    settings = settings_for(fresh_topics, sharded=True, embedder="local")
    spaces = await sharded_set(settings, 3)
    topics = [fresh_topics.events, fresh_topics.messages]
    ends = await end_offsets(settings, topics, fresh_topics.partitions)

    statuses = shard_statuses(settings, ends)
    assert [s.partition for s in statuses] == list(range(fresh_topics.partitions))
    for s in statuses:
        n = spaces.get(s.partition, 0)
        assert s.owner is None  # no worker writes the shards
        assert s.rows["memories"] == 3 * n and s.rows["messages"] == 3 * n, s
        assert s.positions == {t: ends[(t, s.partition)] for t in topics}
        assert s.lag == {t: 0 for t in topics} and s.total_lag == 0

    # Writes the shards have not seen yet show up as lag, per partition.
    await produce(settings, 1)
    statuses = shard_statuses(settings, await end_offsets(settings, topics, fresh_topics.partitions))
    for s in statuses:
        n = spaces.get(s.partition, 0)
        assert s.lag == {t: n for t in topics}, s
        assert s.rows["memories"] == 3 * n
    assert all(s.lag == {} for s in shard_statuses(settings, None))  # Kafka not asked: no lag

    # The owner is whoever holds the shard's lease, and only while it holds it.
    busy = next(p for p, n in spaces.items() if n)
    leases = ShardLeases(TableSets(settings.storage.root).current(), "memstream worker test")
    await leases.take(busy)
    try:
        owners = {s.partition: s.owner for s in shard_statuses(settings, None)}
        assert owners[busy] == f"memstream worker test (pid {os.getpid()})"
        assert all(o is None for p, o in owners.items() if p != busy)
    finally:
        leases.release({busy})
    assert all(s.owner is None for s in shard_statuses(settings, None))


async def test_an_unsharded_set_is_refused_with_the_way_to_migrate(
    fresh_topics: Topics, settings_for  # type: ignore[no-untyped-def]
) -> None:
    settings = settings_for(fresh_topics, embedder="local")
    await produce(settings, 1)
    assert (await replay(settings)).swapped
    with pytest.raises(NotShardedError, match="is not sharded .*MEMSTREAM_STORAGE_SHARDED=true and `memstream replay`"):
        shard_statuses(settings, None)
