"""The LanceDB table set under one directory: opening, upserts, positions, indexes,
maintenance, scoped lookups and the replay digest.

One :class:`LanceStore` owns one directory (``settings.lance_dir``); a replay builds a
second store in a fresh directory and swaps it in. The projector is its only writer;
searches, the extractor's lookups and the CLI read through it. It uses LanceDB's
synchronous API (which runs on LanceDB's own background event loop), so callers on an
asyncio loop run it in an executor thread.

Indexes (created by :meth:`LanceStore.ensure_indexes`, kept current by
:meth:`LanceStore.optimize`):

* **Full text**: a BM25 index on ``memories.content``, created with the table. Rows
  written after the last ``optimize()`` are not in the index yet but are still found:
  LanceDB scans unindexed fragments flat and merges them in.
* **Vector**: exact (flat) search below ``vector_index_threshold`` rows (default
  100,000; flat filtered search stays around tens of milliseconds there). At the
  threshold, ``IVF_PQ`` with cosine distance and ``dim / 8`` sub-vectors; queries
  re-rank ``VECTOR_REFINE_FACTOR`` times the candidates on the full vectors, which
  recovers most of PQ's recall loss. IVF_PQ over IVF_HNSW_SQ because it builds about
  five times faster (78 s against 385 s for 1M rows on 2 cores, see STACK-NOTES):
  the index is rebuilt from the worker, and a long build delays everything behind it.
* **Scalar**: BTree indexes on ``team_id`` and ``user_id`` of every scoped table, and on
  the lookup columns (``memories.content_hash`` / ``memory_id``, ``messages.message_id``,
  ``entities.name_key``, ``links.to_pk`` / ``from_pk``), created with the (empty)
  tables, or on opening a table set that lacks one. Lookups by id go through the id
  column's index and the scoped ``pk`` (:meth:`LanceStore.ids_where`). The isolation
  prefilter of every search goes through them: measured at 40k rows, a prefiltered
  vector search took about 5 times longer without them. Never on ``pk``, the merge
  key (see ``memstream.projections.schema`` for the LanceDB bugs this avoids; an
  index on the merge key also made upserts 3 to 6 times slower).

Many small writes make many fragments and versions; :meth:`optimize` compacts them,
folds new rows into the indexes and removes versions older than ``keep_versions``
(default 5 minutes, so readers in other processes never lose the version they read).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lancedb.index import FTS, BTree, IvfPq

from memstream.domain.access import ReadScope, agent_pin, read_scope_of
from memstream.domain.content import normalize_content
from memstream.domain.events import Scope
from memstream.projections.key_filter import KeyFilter
from memstream.projections.table_sets import TableSets
from memstream.projections.schema import (
    DECISIONS,
    DIGEST_COLUMNS,
    ENTITIES,
    LINKS,
    MEMORIES,
    MESSAGES,
    POSITIONS,
    REFLECTIONS,
    TABLE_NAMES,
    schema_for,
    scoped_key,
)
from memstream.settings import Settings

_APPEND_WHEN_NEW = frozenset({MEMORIES, MESSAGES, ENTITIES})
"""Tables written at the rate of the log: new keys are appended, not merged."""

__all__ = [
    "LanceStore",
    "StoreError",
    "EmbedderMismatchError",
    "ScopeRequiredError",
    "quote",
    "space_where",
    "require_scope",
    "chunked",
    "in_list",
    "VECTOR_REFINE_FACTOR",
    "IN_LIST_CHUNK",
]

log = logging.getLogger("memstream.projections")

VECTOR_REFINE_FACTOR = 5
"""With an IVF_PQ index, fetch this many times ``k`` by PQ distance and re-rank them on
the full vectors."""
IN_LIST_CHUNK = 1_000
"""Longest ``IN (...)`` list sent in one filter."""
_SPACES_PER_QUERY = 100
"""Memory spaces named in one query's filter (an OR of their team/user pairs)."""
_INDEX_RECHECK_S = 30.0
COMPACT_TARGET_ROWS = 16_384
"""Fragment size the worker's frequent compaction aims at (see :meth:`LanceStore.compact`)."""
_FTS_CONFIG = FTS(with_position=False, stem=True, remove_stop_words=True, ascii_folding=True)
SCALAR_INDEXES: dict[str, tuple[str, ...]] = {
    MEMORIES: ("team_id", "user_id", "content_hash", "memory_id"),
    MESSAGES: ("team_id", "user_id", "message_id"),
    LINKS: ("team_id", "user_id", "to_pk", "from_pk"),
    ENTITIES: ("team_id", "user_id", "name_key"),
    REFLECTIONS: ("team_id", "user_id"),
    DECISIONS: ("team_id", "user_id"),
}
"""BTree indexes per table (never on ``pk``)."""


class StoreError(RuntimeError):
    """The table set on disk cannot be used as configured (e.g. another dimension)."""


class EmbedderMismatchError(StoreError):
    """The memories table holds vectors of another embedding model than the one
    configured: vectors of two models are never compared or mixed in one table."""


class ScopeRequiredError(ValueError):
    """A read without a memory space: isolation is a precondition, never widened."""


def quote(value: str) -> str:
    """A SQL string literal for a LanceDB filter: single quotes doubled (LanceDB's
    parser takes backslashes literally). Identifiers cannot hold quotes at all, but
    entity names and free text can, so every value goes through here."""
    if "\x00" in value:
        raise ValueError("a filter value cannot contain NUL")
    return "'" + value.replace("'", "''") + "'"


def require_scope(scope: Scope | ReadScope | None) -> Scope | ReadScope:
    """The scope itself, or :class:`ScopeRequiredError` if there is none to isolate by."""
    if scope is None:
        raise ScopeRequiredError("a scope (team_id and user_id) is required")
    if not getattr(scope, "team_id", None) or not getattr(scope, "user_id", None):
        raise ScopeRequiredError("a scope needs a non-empty team_id and user_id")
    return scope


def space_where(scope: Scope | ReadScope | None) -> str:
    """The isolation predicate every scoped read starts with: the space, and the agent
    when the read is pinned to one (``memstream.domain.access``)."""
    s = require_scope(scope)
    where = f"team_id = {quote(s.team_id)} AND user_id = {quote(s.user_id)}"
    agent = agent_pin(s)
    return where if agent is None else f"{where} AND agent_id = {quote(agent)}"


def chunked(items: Sequence[Any], size: int = IN_LIST_CHUNK) -> Iterator[Sequence[Any]]:
    """``items`` in slices of at most ``size``: keeps every ``IN (...)`` filter short."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


def in_list(column: str, values: Iterable[str]) -> str:
    """``column IN ('a', 'b', ...)`` with every value quoted (see :func:`quote`)."""
    return f"{column} IN ({', '.join(quote(v) for v in values)})"


def _json_or_none(text: str | None) -> Any:
    if text is None or text == "":
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _furthest_rows(tbl: pa.Table) -> dict[tuple[str, int], tuple[int, int]]:
    """Per (topic, partition) of a ``positions`` read: the furthest next offset and the
    index of the row holding it (positions are appended and only move forward)."""
    furthest: dict[tuple[str, int], tuple[int, int]] = {}
    for i, (t, p, o) in enumerate(
        zip(tbl.column("topic").to_pylist(), tbl.column("partition").to_pylist(), tbl.column("next_offset").to_pylist())
    ):
        key = (t, int(p))
        if key not in furthest or int(o) > furthest[key][0]:
            furthest[key] = (int(o), i)
    return furthest


class LanceStore:
    """The projection's tables under ``root``: memories, messages, links, entities,
    reflections, decisions, positions (schemas in ``memstream.projections.schema``)."""

    def __init__(
        self,
        root: Path,
        *,
        embedding_dim: int,
        read_consistency_interval: timedelta | None = None,
        vector_index_threshold: int = 100_000,
        keep_versions: timedelta = timedelta(minutes=5),
        create: bool = True,
    ) -> None:
        """``create=False`` opens an existing table set for reading only: nothing is
        created (no directory, table or index), and :class:`StoreError` is raised when
        a table is missing. A reader in the writer's process uses it to open the
        tables beside the writer without racing it to create them."""
        self.root = Path(root)
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        elif not self.root.is_dir():
            raise StoreError(f"{self.root} has no table set yet")
        self.embedding_dim = int(embedding_dim)
        self.vector_index_threshold = int(vector_index_threshold)
        self.keep_versions = keep_versions
        self._db = lancedb.connect(str(self.root), read_consistency_interval=read_consistency_interval)
        existing = set(self._table_names())
        self._tables: dict[str, Any] = {}
        for name in TABLE_NAMES:
            schema = schema_for(name, self.embedding_dim)
            if name in existing:
                tbl = self._db.open_table(name)
                self._check_schema(name, tbl.schema, schema)
            elif not create:
                raise StoreError(f"{self.root} has no table {name} yet")
            else:
                tbl = self._db.create_table(name, schema=schema, exist_ok=True)
            self._tables[name] = tbl
        self._vector_model: str | None = None
        self._vector_index_checked = float("-inf")
        self._vector_index = False
        # Built on first write per table (this store is the directory's only writer).
        self._key_filters: dict[str, KeyFilter] = {}
        if create:
            self.ensure_base_indexes()

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        root: Path | None = None,
        *,
        read_consistency_interval: timedelta | None = None,
        create: bool = True,
    ) -> "LanceStore":
        return cls(
            root if root is not None else TableSets(settings.lance_dir).current(),
            embedding_dim=settings.embedding_dim,
            read_consistency_interval=read_consistency_interval,
            vector_index_threshold=settings.vector_index_threshold,
            create=create,
        )

    # ---------------------------------------------------------------- plumbing
    def _table_names(self) -> list[str]:
        names: list[str] = []
        token: str | None = None
        while True:
            resp = self._db.list_tables(page_token=token)
            names.extend(resp.tables)
            token = resp.page_token
            if not token:
                return names

    def _check_schema(self, name: str, actual: pa.Schema, expected: pa.Schema) -> None:
        if name == MEMORIES:
            vec = actual.field("vector").type
            width = getattr(vec, "list_size", None)
            if width != self.embedding_dim:
                raise StoreError(
                    f"{self.root}/memories holds {width}-dimension vectors but the embedder "
                    f"makes {self.embedding_dim}: use another lance_dir or replay into a fresh one"
                )
        missing = [f.name for f in expected if f.name not in actual.names]
        if missing:
            raise StoreError(
                f"{self.root}/{name} lacks columns {missing}: it was written by another "
                "memstream version; replay into a fresh directory"
            )

    def table(self, name: str) -> Any:
        """The LanceDB table handle (``lancedb.table.LanceTable``)."""
        try:
            return self._tables[name]
        except KeyError:
            raise ValueError(f"unknown table {name!r} (tables: {', '.join(TABLE_NAMES)})") from None

    @property
    def table_names(self) -> tuple[str, ...]:
        return TABLE_NAMES

    def vector_model(self) -> str | None:
        """The embedding model of the memories table's vectors (None while it is
        empty). Remembered once known: only a replay into a fresh directory changes it."""
        if self._vector_model is None:
            rows = self.table(MEMORIES).search().select(["embedding_model"]).limit(1).to_arrow()
            if rows.num_rows:
                self._vector_model = str(rows.column("embedding_model")[0].as_py())
        return self._vector_model

    def check_vector_model(self, model_id: str) -> None:
        """Raise :class:`EmbedderMismatchError` when the memories table holds vectors
        of another model than ``model_id``."""
        stored = self.vector_model()
        if stored is not None and stored != model_id:
            raise EmbedderMismatchError(
                f"{self.root}/memories holds vectors of embedding model {stored!r} but the "
                f"configured embedder is {model_id!r}: switch back (MEMSTREAM_EMBEDDER), or "
                "replay the log into a fresh directory with the new embedder (memstream replay)"
            )

    def count(self, name: str, where: str | None = None) -> int:
        return int(self.table(name).count_rows(where))

    def _has_index(self, name: str, column: str, index_type: str | None = None) -> bool:
        for idx in self.table(name).list_indices():
            if column in idx.columns and (index_type is None or str(idx.index_type) == index_type):
                return True
        return False

    def upsert(self, name: str, rows: pa.Table) -> tuple[int, int]:
        """Insert or replace whole rows by ``pk``. The rows must have unique keys
        (LanceDB rejects "ambiguous merge inserts"); callers dedupe first. Returns
        (rows inserted, rows updated).

        Rows whose key the table certainly lacks (:class:`KeyFilter`) are appended;
        the others go through ``merge_insert``, whose cost grows with the table. Two
        commits then, not one: a crash between them leaves some rows of the batch
        written and its positions unsaved, and applying the batch again changes
        nothing, as after any crash before the positions are saved."""
        if rows.num_rows == 0:
            return 0, 0
        keys = rows.column("pk")
        if pc.count_distinct(keys).as_py() != rows.num_rows:
            raise ValueError(f"upsert into {name}: duplicate keys in one batch")
        if name not in _APPEND_WHEN_NEW:
            return self._merge(name, rows)
        pks = keys.to_pylist()
        known = self._key_filter(name)
        absent = known.absent(pks)
        n_new = sum(absent)
        try:
            if n_new == rows.num_rows:
                self.table(name).add(rows)
                inserted, updated = n_new, 0
            else:
                mask = pa.array(absent, type=pa.bool_())
                if n_new:
                    self.table(name).add(rows.filter(mask))
                inserted, updated = self._merge(name, rows.filter(pc.invert(mask)))
                inserted += n_new
        except BaseException:
            self._key_filters.pop(name, None)  # unsure what committed: reload next time
            raise
        known.add(pks)
        return inserted, updated

    def _merge(self, name: str, rows: pa.Table) -> tuple[int, int]:
        result = (
            self.table(name)
            .merge_insert("pk")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute(rows)
        )
        return int(result.num_inserted_rows), int(result.num_updated_rows)

    def prepare_writes(self) -> None:
        """Load what the first write would otherwise load on its way: the key filters of
        the tables written at the rate of the log (their stored keys) and the Lance
        modules behind them. A writer calls this when it starts, so the first batch
        it projects pays none of it (measured: that batch took several times as long
        as the next ones)."""
        for name in sorted(_APPEND_WHEN_NEW):
            self._key_filter(name)
        # Arrow's first conversion of a NumPy array (the vector column) imports NumPy's
        # masked arrays: about 10 ms, once, in the middle of the first batch otherwise.
        pa.array(np.zeros(1, dtype=np.float32))

    def key_absent(self, name: str, pks: Sequence[str]) -> list[bool]:
        """Per key: True when the table certainly lacks it (its key filter; tables
        without one answer False, "maybe stored")."""
        if name not in _APPEND_WHEN_NEW:
            return [False] * len(pks)
        return self._key_filter(name).absent(list(pks))

    def _key_filter(self, name: str) -> KeyFilter:
        """The table's key filter, (re)built from its stored keys when missing or full."""
        found = self._key_filters.get(name)
        if found is None or found.full:
            found = KeyFilter(self._stored_keys(name), self.count(name))
            self._key_filters[name] = found
        return found

    def _stored_keys(self, name: str) -> Iterator[str]:
        for batch in self.table(name).to_lance().to_batches(columns=["pk"], batch_size=65_536):
            yield from batch.column(0).to_pylist()

    def replace_rows(self, name: str, rows: pa.Table, owner_column: str, owners: Sequence[str]) -> None:
        """Upsert ``rows`` and delete the rows of the same ``owners`` that ``rows`` no
        longer contains, in one commit (merge insert with "not matched by source
        delete" limited to the owners). Used for the entity rows of re-added memories."""
        if not owners:
            return
        tbl = self.table(name)
        condition = " OR ".join(f"({in_list(owner_column, c)})" for c in chunked(list(owners)))
        if rows.num_rows == 0:
            tbl.delete(condition)
            return
        if pc.count_distinct(rows.column("pk")).as_py() != rows.num_rows:
            raise ValueError(f"upsert into {name}: duplicate keys in one batch")
        try:
            (
                tbl.merge_insert("pk")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .when_not_matched_by_source_delete(condition)
                .execute(rows)
            )
        except BaseException:
            self._key_filters.pop(name, None)
            raise
        if name in self._key_filters:  # deleted keys stay in it: a false positive, harmless
            self._key_filters[name].add(rows.column("pk").to_pylist())

    def rows(
        self,
        name: str,
        where: str | None,
        columns: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> pa.Table:
        """A filtered scan (all matches unless ``limit``)."""
        q = self.table(name).search()
        if where:
            q = q.where(where)
        if columns is not None:
            q = q.select(list(columns))
        q = q.limit(limit)
        return q.to_arrow()

    def rows_by_keys(self, name: str, keys: Sequence[str], columns: Sequence[str] | None = None) -> pa.Table:
        """Rows whose ``pk`` is in ``keys`` (any order; missing keys are simply absent)."""
        parts = [self.rows(name, in_list("pk", chunk), columns) for chunk in chunked(list(dict.fromkeys(keys)))]
        if not parts:
            schema = schema_for(name, self.embedding_dim)
            if columns is not None:
                schema = pa.schema([schema.field(c) for c in columns])
            return schema.empty_table()
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    # ---------------------------------------------------------------- positions
    def positions(self) -> dict[tuple[str, int], int]:
        """The next offset to read per (topic, partition): the furthest one written
        (the table is append-only, see :meth:`save_positions`)."""
        return self._positions_and_rows()[0]

    def positions_table(self) -> pa.Table:
        """The ``positions`` view as rows, every column: the furthest row of each
        (topic, partition), which is what a reader of the table means by it (the
        table itself also holds the rows appended before, until they are pruned)."""
        tbl = self.rows(POSITIONS, None)
        furthest = _furthest_rows(tbl)
        return tbl.take(pa.array([furthest[k][1] for k in sorted(furthest)], type=pa.int64()))

    def _positions_and_rows(self) -> tuple[dict[tuple[str, int], int], int]:
        """The positions and how many rows hold them, from one read."""
        tbl = self.rows(POSITIONS, None, ["topic", "partition", "next_offset"])
        return {k: offset for k, (offset, _) in _furthest_rows(tbl).items()}, tbl.num_rows

    def save_positions(self, next_offsets: Mapping[tuple[str, int], int], *, now: datetime | None = None) -> None:
        """Record positions. Positions only move forward (the projector takes the max
        of the stored and the new offset), so they are *appended* and read back as the
        maximum per partition: an append costs a few milliseconds, an upsert 15-25
        (LanceDB's merge), once per batch. :meth:`prune_positions` drops the passed
        rows now and then."""
        if not next_offsets:
            return
        stamp = now or datetime.now(timezone.utc)
        items = sorted(next_offsets.items())
        rows = pa.Table.from_pydict(
            {
                "pk": [f"{t}|{p}" for (t, p), _ in items],
                "topic": [t for (t, _), _ in items],
                "partition": [p for (_, p), _ in items],
                "next_offset": [o for _, o in items],
                "updated_at": [stamp] * len(items),
            },
            schema=schema_for(POSITIONS, self.embedding_dim),
        )
        self.table(POSITIONS).add(rows)

    def prune_positions(self) -> int:
        """Delete position rows behind the furthest one of their partition; returns
        how many there were. The view never changes (it is the maximum)."""
        tbl = self.table(POSITIONS)
        # one read for both: beside the writer, a second read could see newer rows
        current, rows = self._positions_and_rows()
        stale = rows - len(current)
        if stale > 0 and current:
            tbl.delete(
                " OR ".join(
                    f"(topic = {quote(t)} AND partition = {p} AND next_offset < {o})"
                    for (t, p), o in sorted(current.items())
                )
            )
        return max(stale, 0)

    # ---------------------------------------------------------------- maintenance
    def ensure_base_indexes(self) -> dict[str, list[str]]:
        """FTS on ``memories.content`` and the scalar BTrees; cheap on empty tables,
        which is when they are normally made."""
        created: dict[str, list[str]] = {}
        if not self._has_index(MEMORIES, "content"):
            self.table(MEMORIES).create_index("content", config=_FTS_CONFIG)
            created.setdefault(MEMORIES, []).append("content:FTS")
        for name, columns in SCALAR_INDEXES.items():
            present = {c for idx in self.table(name).list_indices() for c in idx.columns}
            for col in columns:
                if col not in present:
                    self.table(name).create_index(col, config=BTree())
                    created.setdefault(name, []).append(f"{col}:BTREE")
        return created

    def ensure_indexes(self) -> dict[str, list[str]]:
        """Create the indexes that are due (idempotent); returns what was created, per
        table. FTS and scalar indexes exist from the start (re-created here if missing);
        the IVF_PQ vector index from ``vector_index_threshold`` memories on. A vector
        index build takes minutes at a million rows: call this from a thread that can
        wait (the worker builds it beside the writer, see :meth:`build_vector_index`)."""
        created = self.ensure_base_indexes()
        if self.vector_index_due():
            created.setdefault(MEMORIES, []).append(self.build_vector_index())
        return created

    def vector_index_due(self) -> bool:
        """Whether ``memories`` is big enough for its IVF_PQ index and has none yet."""
        mem = self.table(MEMORIES)
        return mem.count_rows() >= max(self.vector_index_threshold, 256) and not self._has_index(MEMORIES, "vector")

    def build_vector_index(self) -> str:
        """Train and write the IVF_PQ index over ``memories.vector`` (minutes at a million
        rows). Safe beside the projector's writes: rows committed meanwhile are simply
        not in the index yet (searched exactly until the next optimize folds them in).
        Do not run it beside :meth:`optimize`, whose compaction rewrites the fragments
        the index is being built over."""
        mem = self.table(MEMORIES)
        dim = self.embedding_dim
        subs = dim // 8 if dim % 8 == 0 and dim >= 16 else None
        started = time.monotonic()
        mem.create_index("vector", config=IvfPq(distance_type="cosine", num_sub_vectors=subs))
        self._vector_index_checked = float("-inf")
        log.info("built the IVF_PQ vector index over %d memories in %.0fs", mem.count_rows(), time.monotonic() - started)
        return "vector:IVF_PQ"

    def has_vector_index(self) -> bool:
        """Whether ``memories.vector`` has an ANN index (checked at most every
        ``_INDEX_RECHECK_S`` seconds: a reader process learns of a new index soon,
        without a metadata round trip per query)."""
        now = time.monotonic()
        if now - self._vector_index_checked > _INDEX_RECHECK_S:
            self._vector_index = self._has_index(MEMORIES, "vector")
            self._vector_index_checked = now
        return self._vector_index

    def optimize(self) -> None:
        """Compact fragments, fold new rows into every index (FTS included) and drop
        versions older than ``keep_versions``, on every table."""
        self.prune_positions()
        for name in TABLE_NAMES:
            tbl = self.table(name)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                tbl.optimize(cleanup_older_than=self.keep_versions)

    def compact(self, target_rows: int = COMPACT_TARGET_ROWS, *, refresh: bool = True) -> int:
        """Merge the small fragments that batched writes leave behind into fragments
        of up to ``target_rows`` rows; returns how many tables were compacted.

        Why not :meth:`optimize`: LanceDB's optimize compacts towards million-row
        fragments, so every run rewrites the whole still-growing fragment (0.2-0.8 s
        at 60,000 rows here, more as the table grows), and the writer must wait for
        it. A small target rewrites only the recent rows. Compaction rewrites data:
        beside a write it commits when the write appends (LanceDB rebases the append)
        and loses to one that updates the same rows (retry it later). With
        ``refresh=False`` this store's table handles are left as they are (for a
        caller beside the writer, which owns them; its next commit rebases)."""
        self.prune_positions()
        done = 0
        for name in TABLE_NAMES:
            tbl = self.table(name)
            ds = tbl.to_lance()
            ds = ds.checkout_version(ds.latest_version)
            small = sum(1 for f in ds.get_fragments() if f.count_rows() < target_rows)
            if small < 2:
                continue
            ds.optimize.compact_files(target_rows_per_fragment=target_rows)
            if refresh:  # beside the writer, leave its handle to it (its commits rebase)
                tbl.checkout_latest()
            done += 1
        return done

    def cleanup_versions(self) -> None:
        """Delete table versions older than ``keep_versions`` (readers in other
        processes keep the version they are reading for that long)."""
        for name in TABLE_NAMES:
            ds = self.table(name).to_lance()
            ds = ds.checkout_version(ds.latest_version)
            ds.cleanup_old_versions(older_than=self.keep_versions)

    def optimize_indexes(self) -> None:
        """Fold rows written since the last call into every table's indexes (FTS,
        BTree, vector), without compacting. Safe beside the projector's writes
        (LanceDB rebases either commit over the other), not beside :meth:`optimize`,
        whose compaction it would preempt."""
        for name in TABLE_NAMES:
            tbl = self.table(name)
            if not tbl.list_indices():
                continue
            # At the newest version, not this handle's: another index update may have
            # been committed since the writer's last commit.
            ds = tbl.to_lance()
            ds = ds.checkout_version(ds.latest_version)
            ds.optimize.optimize_indices()

    # ---------------------------------------------------------------- lookups
    def find_hashes(self, scope: Scope | ReadScope, hashes: Iterable[str]) -> dict[str, str]:
        """``content_hash -> memory_id`` for the hashes already stored in the scope's
        memory space (team + user, and only the agent's rows for a pinned
        :class:`ReadScope`), exact across it. When several memories share a hash, the
        current one written first wins (status "active" before superseded or duplicate
        ones, then the lowest log offset)."""
        s = read_scope_of(require_scope(scope))
        return self.find_hashes_in_spaces({s: hashes}).get(s, {})

    def find_hashes_in_spaces(
        self, wanted: Mapping[ReadScope, Iterable[str]]
    ) -> dict[ReadScope, dict[str, str]]:
        """:meth:`find_hashes` for several read scopes at once, in one query per chunk
        instead of one per space (a query's fixed cost was most of an extraction
        batch's exact dedup: 31 against 9 ms for five spaces).

        Isolation: each row counts only for the scopes that cover it, by its own
        ``team_id``, ``user_id`` and ``agent_id`` columns, and only for the hashes that
        scope asked about; the filter names the scopes exactly, so no other space's
        (or pinned agent's) row is even read."""
        asked: dict[ReadScope, set[str]] = {}
        for scope, hashes in wanted.items():
            if not scope.team_id or not scope.user_id:
                raise ScopeRequiredError("a memory space needs a non-empty team_id and user_id")
            found = {h for h in hashes if h}
            if found:
                asked.setdefault(scope, set()).update(found)
        best: dict[ReadScope, dict[str, tuple[tuple[Any, ...], str]]] = {}
        scopes = sorted(asked, key=lambda r: (r.team_id, r.user_id, r.agent_id or ""))
        for scope_chunk in chunked(scopes, _SPACES_PER_QUERY):
            pairs = " OR ".join(f"({space_where(sc)})" for sc in scope_chunk)
            hashes_all = sorted(set().union(*(asked[sc] for sc in scope_chunk)))
            for chunk in chunked(hashes_all):
                tbl = self.rows(
                    MEMORIES,
                    f"({pairs}) AND {in_list('content_hash', chunk)}",
                    ["team_id", "user_id", "agent_id", "memory_id", "content_hash", "status", "log_offset"],
                )
                for team, user, agent, mid, h, status, off in zip(
                    tbl.column("team_id").to_pylist(),
                    tbl.column("user_id").to_pylist(),
                    tbl.column("agent_id").to_pylist(),
                    tbl.column("memory_id").to_pylist(),
                    tbl.column("content_hash").to_pylist(),
                    tbl.column("status").to_pylist(),
                    tbl.column("log_offset").to_pylist(),
                ):
                    rank = (status != "active", off if off is not None else -1, mid)
                    for sc in (ReadScope(team, user, agent), ReadScope(team, user, None)):
                        if h not in asked.get(sc, ()):
                            continue  # another scope's question (or not asked at all)
                        mine = best.setdefault(sc, {})
                        if h not in mine or rank < mine[h][0]:
                            mine[h] = (rank, mid)
        return {sc: {h: mid for h, (_, mid) in found.items()} for sc, found in best.items()}

    @staticmethod
    def ids_where(scope: Scope | ReadScope, id_column: str, ids: Sequence[str]) -> str:
        """The filter for the rows of the scope's space whose ``id_column`` (the id the
        table's ``pk`` is scoped from: ``memory_id``, ``message_id``...) is in ``ids``:
        ``<id_column> IN (...) AND pk IN (<the scoped keys>)``. The id column's BTree
        finds the rows; the scoped key (``team|user|id``, see
        ``memstream.projections.schema``) confines them to the space exactly, so no
        ``team_id`` / ``user_id`` predicate is needed, and none is used: in a large
        space their indexes each return every row of the space, which cost 3 to 5 ms
        at 100,000 rows against about 1 ms for the id lookup itself. A read pinned to
        an agent adds its ``agent_id``."""
        s = require_scope(scope)
        keys = [scoped_key(s.team_id, s.user_id, i) for i in ids]
        where = f"{in_list(id_column, ids)} AND {in_list('pk', keys)}"
        agent = agent_pin(s)
        return where if agent is None else f"{where} AND agent_id = {quote(agent)}"

    def get_memories(
        self, scope: Scope | ReadScope, memory_ids: Sequence[str], *, with_vector: bool = False
    ) -> list[dict[str, Any]]:
        """The rows of these memories within the scope's space (others are ignored),
        JSON fields parsed, in the order asked."""
        ids = list(dict.fromkeys(memory_ids))
        columns = None
        if not with_vector:
            columns = [f.name for f in schema_for(MEMORIES, self.embedding_dim) if f.name != "vector"]
        by_id: dict[str, dict[str, Any]] = {}
        for chunk in chunked(ids):
            for r in self.rows(MEMORIES, self.ids_where(scope, "memory_id", chunk), columns).to_pylist():
                by_id[r["memory_id"]] = _memory_dict(r)
        return [by_id[m] for m in ids if m in by_id]

    def get_messages(self, scope: Scope | ReadScope, message_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The L0 turns with these ids in the scope's space, in the order asked."""
        ids = list(dict.fromkeys(message_ids))
        by_id: dict[str, dict[str, Any]] = {}
        for chunk in chunked(ids):
            for r in self.rows(MESSAGES, self.ids_where(scope, "message_id", chunk)).to_pylist():
                r["metadata"] = _json_or_none(r.get("metadata"))
                by_id[r["message_id"]] = r
        return [by_id[m] for m in ids if m in by_id]

    def links_of(self, scope: Scope | ReadScope, memory_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(outgoing, incoming) links of a memory in the scope's space, oldest first."""
        base = space_where(scope)
        tbl = self.rows(
            LINKS,
            f"{base} AND (from_memory_id = {quote(memory_id)} OR to_memory_id = {quote(memory_id)})",
        )
        rows = sorted(tbl.to_pylist(), key=_log_order)
        for r in rows:
            r["provenance"] = _json_or_none(r.get("provenance"))
        out = [r for r in rows if r["from_memory_id"] == memory_id]
        inc = [r for r in rows if r["to_memory_id"] == memory_id]
        return out, inc

    def get_memory(self, scope: Scope | ReadScope, memory_id: str) -> dict[str, Any] | None:
        """One memory with everything known about it: the row (JSON parsed, no vector),
        ``links_out`` / ``links_in``, ``history`` (``predecessors``: the memories it
        superseded or contradicted, transitively, newest first; ``successors``: the
        chain of ``superseded_by`` up to the current memory), ``source_messages`` (the
        L0 turns it came from, the evidence chain) and ``provenance``. ``None`` when
        the memory is not in the scope's space."""
        found = self.get_memories(scope, [memory_id])
        if not found:
            return None
        row = found[0]
        links_out, links_in = self.links_of(scope, memory_id)
        row["links_out"] = links_out
        row["links_in"] = links_in
        row["history"] = {
            "predecessors": self._predecessors(scope, memory_id),
            "successors": self._successors(scope, row),
        }
        # The evidence of a memory is its own agent's turns: a memory citing another
        # agent's message id must not read that agent's text (whoever asks).
        owner = ReadScope(row["team_id"], row["user_id"], row["agent_id"])
        row["source_messages"] = self.get_messages(owner, row.get("source_message_ids") or [])
        return row

    def _successors(self, scope: Scope | ReadScope, row: Mapping[str, Any], limit: int = 64) -> list[str]:
        chain: list[str] = []
        seen = {row["memory_id"]}
        nxt = row.get("superseded_by")
        while nxt and nxt not in seen and len(chain) < limit:
            chain.append(nxt)
            seen.add(nxt)
            rows = self.get_memories(scope, [nxt])
            nxt = rows[0].get("superseded_by") if rows else None
        return chain

    def _predecessors(self, scope: Scope | ReadScope, memory_id: str, limit: int = 64) -> list[str]:
        base = space_where(scope)
        found: list[str] = []
        seen = {memory_id}
        frontier = [memory_id]
        while frontier and len(found) < limit:
            tbl = self.rows(
                LINKS,
                f"{base} AND relation IN ('supersedes', 'contradicts') AND {in_list('from_memory_id', frontier)}",
                ["to_memory_id", "log_topic", "log_partition", "log_offset"],
            )
            rows = sorted(tbl.to_pylist(), key=_log_order, reverse=True)
            frontier = []
            for r in rows:
                if r["to_memory_id"] not in seen:
                    seen.add(r["to_memory_id"])
                    found.append(r["to_memory_id"])
                    frontier.append(r["to_memory_id"])
        if not found:
            return found
        # a link may name an id the read cannot see (another agent's): not history here
        visible = {r["memory_id"] for r in self.get_memories(scope, found[:limit])}
        return [m for m in found[:limit] if m in visible]

    def memories_for_entity(self, scope: Scope | ReadScope, name: str) -> list[str]:
        """Ids of the memories of the scope's space that name this entity (normalised
        name, so "ALICE" finds "Alice"), oldest first."""
        key = normalize_content(name)
        if not key:
            return []
        tbl = self.rows(
            ENTITIES,
            f"{space_where(scope)} AND name_key = {quote(key)}",
            ["memory_id", "log_topic", "log_partition", "log_offset"],
        )
        return [r["memory_id"] for r in sorted(tbl.to_pylist(), key=_log_order)]

    def entity_frequencies(self, scope: Scope | ReadScope, names: Iterable[str]) -> dict[str, int]:
        """How many memories of the space name each entity (by normalised name)."""
        keys = sorted({normalize_content(n) for n in names if normalize_content(n)})
        out = {k: 0 for k in keys}
        base = space_where(scope)
        for chunk in chunked(keys):
            tbl = self.rows(ENTITIES, f"{base} AND {in_list('name_key', chunk)}", ["name_key"])
            for k in tbl.column("name_key").to_pylist():
                out[k] = out.get(k, 0) + 1
        return out

    def count_memories(self, scope: Scope | ReadScope) -> int:
        return self.count(MEMORIES, space_where(scope))

    def reflections_for(
        self, scope: Scope | ReadScope, *, subject: str | None = None, limit: int = 10
    ) -> list[dict[str, Any]]:
        """The newest reflections of the space (optionally about one subject)."""
        where = space_where(scope)
        if subject is not None:
            where += f" AND subject = {quote(subject)}"
        rows = self.rows(REFLECTIONS, where).to_pylist()
        rows.sort(key=lambda r: (r["occurred_at"], r["reflection_id"]), reverse=True)
        for r in rows:
            r["provenance"] = _json_or_none(r.get("provenance"))
        return rows[:limit]

    def decisions_for(self, scope: Scope | ReadScope, *, status: str | None = None) -> list[dict[str, Any]]:
        """The decision ledger of the space (``pending``, ``expired``, ``reflected``)."""
        where = space_where(scope)
        if status is not None:
            where += f" AND status = {quote(status)}"
        return self.rows(DECISIONS, where).to_pylist()

    # ---------------------------------------------------------------- verification
    def table_digest(self) -> dict[str, tuple[int, str]]:
        """Per table: (row count, SHA-256 over the rows' ``DIGEST_COLUMNS`` sorted by
        ``pk``). Two stores with equal digests hold the same keys, content hashes and
        derived view: what a replay must reproduce."""
        out: dict[str, tuple[int, str]] = {}
        for name in TABLE_NAMES:
            cols = DIGEST_COLUMNS[name]
            if name == POSITIONS:  # the view (one row per partition), not the raw rows
                view = self.positions()
                tbl = pa.table({"pk": [f"{t}|{p}" for (t, p) in view], "next_offset": list(view.values())})
            else:
                tbl = self.table(name).to_lance().to_table(columns=list(cols))
            tbl = tbl.sort_by([("pk", "ascending")])
            h = hashlib.sha256()
            if tbl.num_rows:
                texts = [pc.fill_null(pc.cast(tbl.column(c), pa.string()), "\u2205") for c in cols]
                joined = pc.binary_join_element_wise(*texts, "\x1f")
                for chunk in joined.chunks:
                    for value in chunk.to_pylist():
                        h.update(value.encode("utf-8"))
                        h.update(b"\n")
            out[name] = (tbl.num_rows, h.hexdigest())
        return out


def _log_order(row: Mapping[str, Any]) -> tuple[str, int, int]:
    return (row.get("log_topic") or "", row.get("log_partition") or 0, row.get("log_offset") or 0)


def _memory_dict(row: dict[str, Any]) -> dict[str, Any]:
    row["metadata"] = _json_or_none(row.get("metadata")) or {}
    row["provenance"] = _json_or_none(row.get("provenance"))
    row["source_message_ids"] = list(row.get("source_message_ids") or [])
    row["entities"] = list(row.get("entities") or [])
    return row
