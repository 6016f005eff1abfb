"""The LanceDB table set and where it lives: :class:`LanceStore` (``lance_store``)
puts together opening the tables (``tables``), writes, reads, positions, maintenance
and snapshots; ``table_sets`` keeps which set is current and hands a replayed one over;
``shards`` cuts a set by partition; ``object_paths``, ``object_lease`` and
``dir_lock`` are the storage root (a directory or ``s3://``), its lease and its lock;
``key_filter`` and ``lance_async`` are the store's two small adapters."""

from __future__ import annotations

from memstream.projections.store.dir_lock import DEFAULT_LEASE_TTL_S, LanceDirBusyError, LanceDirLock
from memstream.projections.store.filters import (
    ScopeRequiredError,
    StoreError,
    chunked,
    in_list,
    quote,
    require_scope,
    space_where,
)
from memstream.projections.store.lance_async import async_table, gather_all, wait
from memstream.projections.store.lance_store import LanceStore
from memstream.projections.store.maintenance import VECTOR_REFINE_FACTOR, compact_and_reindex
from memstream.projections.store.object_paths import as_path
from memstream.projections.store.shards import (
    ShardLayoutError,
    ShardedStore,
    init_layout,
    is_sharded,
    shard_count,
    shard_dir,
)
from memstream.projections.store.table_sets import CurrentStore, SwapRequest, TableSets
from memstream.projections.store.tables import json_or_none

__all__ = [
    "CurrentStore",
    "DEFAULT_LEASE_TTL_S",
    "LanceDirBusyError",
    "LanceDirLock",
    "LanceStore",
    "ScopeRequiredError",
    "ShardLayoutError",
    "ShardedStore",
    "StoreError",
    "SwapRequest",
    "TableSets",
    "VECTOR_REFINE_FACTOR",
    "as_path",
    "async_table",
    "chunked",
    "compact_and_reindex",
    "gather_all",
    "in_list",
    "init_layout",
    "is_sharded",
    "json_or_none",
    "quote",
    "require_scope",
    "shard_count",
    "shard_dir",
    "space_where",
    "wait",
]
