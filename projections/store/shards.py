"""A table set sharded by partition: one LanceDB database per partition of the
memory log, under the set's directory.

Why: a memory space (team and user) is the Kafka key, so every event of a space
lives on one partition and every query stays in one space. A projection cut along
partitions therefore never needs a cross-shard query, and each shard can have its
own writer. Layout of a sharded set::

    <set>/shards/PARTITIONS     the partition count the shards were cut for
    <set>/shards/<p>/           shard ``p``: the usual tables (positions included)

A set without ``shards/`` is the legacy, unsharded layout (one database holding
every partition); ``memstream replay`` with ``MEMSTREAM_STORAGE_SHARDED=true`` migrates it.
Event ``(topic, p, offset)`` of the events or messages topic goes to shard ``p``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from memstream.projections.store.object_paths import as_path, write_atomically
from memstream.projections.schema import DIGEST_COLUMNS, POSITIONS, TABLE_NAMES

__all__ = [
    "ShardLayoutError",
    "ShardedStore",
    "is_sharded",
    "shard_count",
    "shard_dir",
    "init_layout",
    "union_digest",
]

_SHARDS = "shards"
_PARTITIONS = "PARTITIONS"


class ShardLayoutError(RuntimeError):
    """A sharded set that does not match the log (partition count), or is incomplete."""


def shard_dir(set_dir: Any, partition: int) -> Any:
    """Shard ``partition``'s directory (a local Path, or an object-store prefix)."""
    return as_path(set_dir) / _SHARDS / str(int(partition))


def is_sharded(set_dir: Any) -> bool:
    return (as_path(set_dir) / _SHARDS / _PARTITIONS).is_file()


def shard_count(set_dir: Any) -> int:
    """The partition count a sharded set was cut for."""
    try:
        return int((as_path(set_dir) / _SHARDS / _PARTITIONS).read_text(encoding="utf-8").strip())
    except (OSError, ValueError) as exc:
        raise ShardLayoutError(f"{set_dir} is not a sharded table set: {exc}") from None


def init_layout(set_dir: Any, partitions: int) -> None:
    """Mark ``set_dir`` as sharded for ``partitions`` partitions (idempotent; refuses
    another count: every space would be looked up in the wrong shard)."""
    root = as_path(set_dir) / _SHARDS
    if is_sharded(set_dir):
        have = shard_count(set_dir)
        if have != partitions:
            raise ShardLayoutError(
                f"{set_dir} is sharded for {have} partitions but the log has {partitions}: "
                "replay into a fresh set (memstream replay)"
            )
        return
    root.mkdir(parents=True, exist_ok=True)
    write_atomically(root / _PARTITIONS, f"{int(partitions)}\n")


def union_digest(tables: Callable[[str], pa.Table], positions: Mapping[tuple[str, int], int]) -> dict[str, tuple[int, str]]:
    """The replay digest (see ``LanceStore.table_digest``) of the union of shards: equal
    to an unsharded set's digest when both hold the same rows, so a migration can be
    verified against the set it replaces."""
    out: dict[str, tuple[int, str]] = {}
    for name in TABLE_NAMES:
        cols = DIGEST_COLUMNS[name]
        if name == POSITIONS:
            tbl = pa.table({"pk": [f"{t}|{p}" for (t, p) in positions], "next_offset": list(positions.values())})
        else:
            tbl = tables(name)
        tbl = tbl.sort_by([("pk", "ascending")])
        h = hashlib.sha256()
        if tbl.num_rows:
            texts = [pc.fill_null(pc.cast(tbl.column(c), pa.string()), "\u2205") for c in cols]
            for chunk in pc.binary_join_element_wise(*texts, "\x1f").chunks:
                for value in chunk.to_pylist():
                    h.update(value.encode("utf-8"))
                    h.update(b"\n")
        out[name] = (tbl.num_rows, h.hexdigest())
    return out


class ShardedStore:
    """The shards of one sharded set, each a ``LanceStore``, seen as one set by whoever
    needs all of them (the single worker's positions and maintenance, a replay's
    verification, ``memstream sql``/``export``). Scoped reads go to one shard
    (:meth:`shard`): a space lives in exactly one."""

    def __init__(
        self,
        set_dir: Any,
        shards: Mapping[int, Any],
        route: Callable[[Any], int] | None = None,
        *,
        embedding_dim: int | None = None,
    ) -> None:
        """``shards`` may be empty (a worker in a group that owns none yet) when
        ``embedding_dim`` is given."""
        self.root = as_path(set_dir)
        self._route = route
        self.shards: dict[int, Any] = dict(sorted(shards.items()))
        if not self.shards and embedding_dim is None:
            raise ShardLayoutError(f"{set_dir} has no shards")
        self.embedding_dim = embedding_dim or next(iter(self.shards.values())).embedding_dim
        self.partitions = shard_count(self.root)

    @classmethod
    def open(
        cls,
        set_dir: Any,
        opener: Callable[[Any], Any],
        route: Callable[[Any, int], int] | None = None,
        partitions: Iterable[int] | None = None,
    ) -> "ShardedStore":
        """Open shards ``partitions`` (default: all the layout has) with ``opener(path)``;
        ``route(scope, partition_count)`` names a space's partition (the producer's)."""
        count = shard_count(set_dir)
        wanted = range(count) if partitions is None else partitions
        by_scope = (lambda scope: route(scope, count)) if route is not None else None
        return cls(set_dir, {p: opener(shard_dir(set_dir, p)) for p in wanted}, by_scope)

    @property
    def table_names(self) -> tuple[str, ...]:
        return TABLE_NAMES

    def shard(self, partition: int) -> Any:
        try:
            return self.shards[partition]
        except KeyError:
            raise ShardLayoutError(f"shard {partition} of {self.root} is not open here") from None

    def for_scope(self, scope: Any) -> Any:
        """The shard holding ``scope``'s memory space."""
        if self._route is None:
            raise ShardLayoutError("this sharded store was opened without a space router")
        return self.shard(self._route(scope))

    # --- scoped lookups the extractor makes (each space answered by its shard) -----------
    def find_hashes(self, scope: Any, hashes: Iterable[str]) -> dict[str, str]:
        return dict(self.for_scope(scope).find_hashes(scope, hashes))

    def find_hashes_in_spaces(self, wanted: Mapping[Any, Iterable[str]]) -> dict[Any, dict[str, str]]:
        by_shard: dict[int, dict[Any, Iterable[str]]] = {}
        for scope, hashes in wanted.items():
            assert self._route is not None
            by_shard.setdefault(self._route(scope), {})[scope] = hashes
        out: dict[Any, dict[str, str]] = {}
        for partition, part in by_shard.items():
            out.update(self.shard(partition).find_hashes_in_spaces(part))
        return out

    def has_vector_index(self) -> bool:
        return all(s.has_vector_index() for s in self.shards.values())

    # --- positions ---------------------------------------------------------------
    def positions(self) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        for store in self.shards.values():
            out.update(store.positions())
        return out

    def positions_version(self) -> tuple[int, ...]:
        """Changes whenever a shard's positions table gets a commit."""
        return tuple(int(s.table(POSITIONS).version) for s in self.shards.values())

    def save_positions(self, next_offsets: Mapping[tuple[str, int], int]) -> None:
        by_shard: dict[int, dict[tuple[str, int], int]] = {}
        for (topic, partition), offset in next_offsets.items():
            by_shard.setdefault(partition, {})[(topic, partition)] = offset
        for partition, offsets in by_shard.items():
            self.shard(partition).save_positions(offsets)

    def positions_table(self) -> pa.Table:
        return pa.concat_tables([s.positions_table() for s in self.shards.values()])

    # --- whole-set reads (admin tools) -------------------------------------------------
    def table_source(self, name: str) -> pa.Table:
        """A table's rows over every shard (``memstream sql`` and ``export``)."""
        if name == POSITIONS:
            return self.positions_table()
        return pa.concat_tables([s.table(name).to_lance().to_table() for s in self.shards.values()])

    def count(self, name: str, where: str | None = None) -> int:
        return sum(int(s.count(name, where)) for s in self.shards.values())

    def table_digest(self) -> dict[str, tuple[int, str]]:
        def rows(name: str) -> pa.Table:
            cols = list(DIGEST_COLUMNS[name])
            return pa.concat_tables([s.table(name).to_lance().to_table(columns=cols) for s in self.shards.values()])

        return union_digest(rows, self.positions())

    # --- maintenance, shard by shard -----------------------------------------------------
    def compact(self, *args: Any, **kwargs: Any) -> int:
        return sum(int(s.compact(*args, **kwargs)) for s in self.shards.values())

    def cleanup_versions(self, *args: Any, **kwargs: Any) -> int:
        return sum(int(s.cleanup_versions(*args, **kwargs)) for s in self.shards.values())

    def optimize_indexes(self) -> None:
        for s in self.shards.values():
            s.optimize_indexes()

    def ensure_base_indexes(self) -> dict[str, list[str]]:
        return _merged(s.ensure_base_indexes() for s in self.shards.values())

    def ensure_indexes(self) -> dict[str, list[str]]:
        return _merged(s.ensure_indexes() for s in self.shards.values())

    def vector_index_due(self) -> bool:
        return any(s.vector_index_due() for s in self.shards.values())

    def build_vector_index(self) -> str:
        built = [s.build_vector_index() for s in self.shards.values() if s.vector_index_due()]
        return built[0] if built else "vector:IVF_PQ"

    def optimize(self) -> None:
        for s in self.shards.values():
            s.optimize()

    def close(self) -> None:
        for s in self.shards.values():
            close = getattr(s, "close", None)
            if callable(close):
                close()


def _merged(parts: Iterable[Mapping[str, list[str]]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for part in parts:
        for name, created in part.items():
            out.setdefault(name, []).extend(created)
    return out
