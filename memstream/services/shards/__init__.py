"""Which store a process opens for a table set and which shard answers a memory
space (``routing``: the producer's murmur2 partition), and what each shard of the
current set is doing (``status``, behind ``memstream shards``)."""

from __future__ import annotations

from memstream.services.shards.routing import (
    create_shards,
    has_projection,
    open_projector,
    open_shards,
    open_store,
    projects_sharded,
    space_partition,
    store_for,
)
from memstream.services.shards.status import NotShardedError, end_offsets, shard_statuses

__all__ = [
    "NotShardedError",
    "create_shards",
    "end_offsets",
    "has_projection",
    "open_projector",
    "open_shards",
    "open_store",
    "projects_sharded",
    "shard_statuses",
    "space_partition",
    "store_for",
]
