"""The sharded table-set layout and the per-partition cut of batches (real LanceDB
tables under ``tmp_path``; the end-to-end paths are in tests/services/shards/test_e2e.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memstream.codec.batch import PositionedMemories
from memstream.projections.projector.sharded import split_memories
from memstream.projections.store.shards import (
    ShardedStore,
    ShardLayoutError,
    init_layout,
    is_sharded,
    shard_count,
    shard_dir,
)
from memstream.projections.store.lance_store import LanceStore


def _open(path: Path) -> LanceStore:
    return LanceStore(path, embedding_dim=8)


def test_layout_records_its_partition_count_and_refuses_another(tmp_path: Path) -> None:
    assert not is_sharded(tmp_path)
    init_layout(tmp_path, 4)
    init_layout(tmp_path, 4)  # idempotent
    assert is_sharded(tmp_path) and shard_count(tmp_path) == 4
    with pytest.raises(ShardLayoutError, match="sharded for 4 partitions but the log has 6"):
        init_layout(tmp_path, 6)
    assert shard_dir(tmp_path, 3) == tmp_path / "shards" / "3"


def test_positions_go_to_their_partitions_shard_and_read_back_merged(tmp_path: Path) -> None:
    init_layout(tmp_path, 3)
    store = ShardedStore.open(tmp_path, _open)
    store.save_positions({("ev", 0): 5, ("ev", 2): 7, ("msg", 2): 3})
    assert store.positions() == {("ev", 0): 5, ("ev", 2): 7, ("msg", 2): 3}
    # Each shard holds its own partition's positions only: a shard moves alone.
    assert store.shard(0).positions() == {("ev", 0): 5}
    assert store.shard(1).positions() == {}
    assert store.shard(2).positions() == {("ev", 2): 7, ("msg", 2): 3}
    before = store.positions_version()
    store.save_positions({("ev", 1): 1})
    assert store.positions_version() != before
    assert store.positions_table().num_rows == 4
    with pytest.raises(ShardLayoutError, match="without a space router"):
        store.for_scope(object())


def test_a_store_opened_with_a_router_answers_a_space_from_its_shard(tmp_path: Path) -> None:
    init_layout(tmp_path, 3)
    store = ShardedStore.open(tmp_path, _open, lambda scope, n: len(scope) % n)
    assert store.for_scope("ab") is store.shard(2)
    assert store.for_scope("abc") is store.shard(0)


def test_split_memories_keeps_rows_vectors_and_unembedded_per_partition() -> None:
    vectors = np.arange(5 * 2, dtype=np.float32).reshape(5, 2)
    positions = [("ev", 0, 0), ("ev", 1, 0), ("ev", 0, 1), ("ev", 1, 1), ("ev", 0, 2)]
    memories = PositionedMemories(
        model="m", positions=positions, fields=["a", "b", "c", "d", "e"], vectors=vectors, unembedded=[1, 4]  # type: ignore[list-item]
    )
    parts = split_memories(memories)
    assert sorted(parts) == [0, 1]
    assert parts[0].positions == [("ev", 0, 0), ("ev", 0, 1), ("ev", 0, 2)]
    assert parts[0].fields == ["a", "c", "e"] and parts[1].fields == ["b", "d"]
    assert parts[0].vectors.tolist() == vectors[[0, 2, 4]].tolist()
    assert parts[0].unembedded == [2] and parts[1].unembedded == [0]
    assert split_memories(None) == {}
    one = PositionedMemories(model="m", positions=[("ev", 2, 9)], fields=["x"], vectors=vectors[:1])  # type: ignore[list-item]
    assert split_memories(one) == {2: one}
