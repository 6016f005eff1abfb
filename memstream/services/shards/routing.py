"""Which store a process opens for a table set (sharded or not), and which shard
answers a memory space.

A space's shard is its Kafka partition: murmur2 of the record key, as the producer,
the Java client and the SDK compute it (:func:`space_partition`). Readers (API, MCP,
CLI) need no broker for it: the partition count is the one the set was cut for.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from memstream.domain.access import ReadScope
from memstream.domain.events import Scope
from memstream.projections.embedders import build_embedder
from memstream.projections.projector import Projector, ShardedProjector
from memstream.projections.store import (
    LanceDirLock,
    LanceStore,
    ShardedStore,
    as_path,
    init_layout,
    is_sharded,
    shard_count,
    shard_dir,
)
from memstream.settings import Settings
from memstream.streams.rerouting import home_partition

__all__ = [
    "open_store",
    "open_shards",
    "create_shards",
    "open_projector",
    "projects_sharded",
    "space_partition",
    "store_for",
    "has_projection",
]


def space_partition(scope: Scope | ReadScope, partitions: int) -> int:
    """The partition (and shard) of the scope's memory space."""
    # the producer's key (codec.wire.record_key) is the space, agent left out
    return home_partition(scope.space.encode("utf-8"), partitions)


def _legacy(set_dir: Any) -> bool:
    return (as_path(set_dir) / "memories.lance").exists()


def has_projection(set_dir: Any) -> bool:
    """Whether ``set_dir`` holds a projection in either layout."""
    return is_sharded(set_dir) or _legacy(set_dir)


def open_store(
    settings: Settings,
    set_dir: Any,
    *,
    create: bool = True,
    read_consistency_interval: timedelta | None = None,
    partitions: int | None = None,
) -> Any:
    """The set's store: a :class:`ShardedStore` when the set is sharded (or is new and
    ``settings.storage.sharded``; ``partitions`` defaults to ``settings.broker.partitions``), else
    the unsharded ``LanceStore``."""

    def opener(path: Any) -> LanceStore:
        # an existing shard is its owner's to change (indexes included): readers open it as it is
        made = (path / "positions.lance").exists() and path != as_path(set_dir)
        return LanceStore.from_settings(
            settings.storage, settings.embeddings.dim, path,
            create=create and not made, read_consistency_interval=read_consistency_interval
        )

    if not is_sharded(set_dir) and create and settings.storage.sharded and not _legacy(set_dir):
        create_shards(settings, set_dir, partitions)
    if is_sharded(set_dir):
        return ShardedStore.open(set_dir, opener, space_partition)
    return opener(set_dir)


def open_projector(store: Any, settings: Settings, *, embedder: Any = None, reuse: Any = None) -> Any:
    """The projector writing ``store`` (one per shard for a sharded set; ``reuse``: a
    :class:`ShardedProjector` whose shards still open in ``store`` are kept)."""
    embedder = embedder if embedder is not None else build_embedder(settings.embeddings)
    if isinstance(store, ShardedStore):
        kept = reuse.projectors if isinstance(reuse, ShardedProjector) else None
        return ShardedProjector(store, embedder, kept)
    return Projector(store, embedder)


def open_shards(settings: Settings, set_dir: Any, partitions: Iterable[int], reuse: Any = None) -> ShardedStore:
    """The given shards of a sharded set, for writing (``reuse``: a :class:`ShardedStore`
    whose shards that stay are kept open as they are)."""
    kept = reuse.shards if isinstance(reuse, ShardedStore) else {}
    init_layout(set_dir, settings.broker.partitions)
    shards = {
        p: kept.get(p) or LanceStore.from_settings(settings.storage, settings.embeddings.dim, shard_dir(set_dir, p))
        for p in sorted(set(partitions))
    }
    count = shard_count(set_dir)
    return ShardedStore(
        set_dir, shards, lambda scope: space_partition(scope, count), embedding_dim=settings.embeddings.dim
    )


def projects_sharded(settings: Settings, set_dir: Any) -> bool:
    """Whether a worker starting now writes shards (workers then form a consumer group)."""
    return is_sharded(set_dir) or (settings.storage.sharded and not _legacy(set_dir))


def store_for(store: Any, scope: Scope | ReadScope) -> Any:
    """The store holding ``scope``'s space: its shard, or the unsharded set itself."""
    return store.for_scope(scope) if isinstance(store, ShardedStore) else store


def create_shards(settings: Settings, set_dir: Any, partitions: int | None = None) -> None:
    """Create every shard's tables once, one process at a time (workers starting
    together, and readers, must not race to create them). The layout marker comes
    last: a reader sees every shard, or an unsharded set not made yet."""
    count = partitions or settings.broker.partitions
    with LanceDirLock(as_path(set_dir) / "shards" / "create", lease_ttl_s=settings.storage.lease_ttl_s) as lock:
        lock.acquire_waiting("memstream (creating shards)")
        if is_sharded(set_dir):
            count = shard_count(set_dir)
        for p in range(count):
            if not (shard_dir(set_dir, p) / "positions.lance").exists():
                LanceStore.from_settings(settings.storage, settings.embeddings.dim, shard_dir(set_dir, p))
        init_layout(set_dir, count)
