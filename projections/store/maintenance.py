"""Index and file maintenance of the table set, and its replay digest.

Indexes (created by :meth:`StoreMaintenance.ensure_indexes`, kept current by
:meth:`StoreMaintenance.optimize` or :meth:`StoreMaintenance.optimize_indexes`):

* **Full text**: a BM25 index on ``memories.content``, created with the table. Rows
  written since the last optimize are scanned flat and merged in, so they are found.
* **Vector**: exact search below ``vector_index_threshold`` rows; from there
  ``IVF_PQ`` with cosine distance and ``dim / 8`` sub-vectors, queries re-ranking
  :data:`VECTOR_REFINE_FACTOR` times the candidates on the full vectors. IVF_PQ
  because it builds several times faster than IVF_HNSW_SQ (the worker rebuilds it,
  and a long build delays everything behind it; figures in docs/benchmarks-history.md).
* **Scalar**: BTrees on ``team_id`` and ``user_id`` of every scoped table (the
  isolation prefilter goes through them) and on the lookup columns. Never on ``pk``,
  the merge key (see ``memstream.projections.schema`` for the LanceDB bugs this avoids).

Many small writes make many fragments and versions; :meth:`StoreMaintenance.compact`
merges the recent ones and :meth:`StoreMaintenance.cleanup_versions` removes the
versions a newer one replaced more than ``reader_grace`` ago (:func:`replaced_versions`).
Counted from the replacement, not from the version's own commit as Lance's
``older_than`` counts: a reader reads at the newest version, so what it may still be on
is whatever was newest a moment ago, however old that version is.
"""

from __future__ import annotations

import hashlib
import logging
import time
import warnings
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from lancedb.index import FTS, BTree, IvfPq

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
)
from memstream.projections.store.positions import StorePositions

__all__ = ["StoreMaintenance", "compact_and_reindex", "VECTOR_REFINE_FACTOR", "COMPACT_TARGET_ROWS", "SCALAR_INDEXES", "compaction_target",
           "replaced_versions"]

log = logging.getLogger("memstream.projections")

VECTOR_REFINE_FACTOR = 5
"""With an IVF_PQ index, fetch this many times ``k`` by PQ distance and re-rank them on
the full vectors."""
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


def compaction_target(sizes: Iterable[int], most: int = COMPACT_TARGET_ROWS) -> int:
    """The fragment size a compaction of fragments of ``sizes`` rows aims at (Lance
    merges the fragments smaller than it). Sizes grow in tiers of 4x up to ``most``:
    a tier is merged into the next once it holds four fragments. So a compaction
    mostly rewrites the recent small fragments, not a whole small table: each such
    copy stays on disk until the readers' grace has passed (``cleanup_versions``)."""
    tiers = (max(1, most // 16), max(1, most // 4), most)
    counts = list(sizes)
    target = tiers[0]
    for lower, upper in zip(tiers, tiers[1:]):
        if sum(1 for n in counts if lower <= n < upper) >= 4:
            target = upper
    return target


def replaced_versions(versions: Iterable[tuple[int, float]], before: float, below: int) -> list[int]:
    """Of a table's ``(version, commit time)`` pairs (epoch seconds), the versions a
    newer one replaced before ``before`` and numbered below ``below`` (a version still
    in use). The newest is never among them."""
    ordered = sorted(versions)
    return [v for (v, _), (_, replaced_at) in zip(ordered, ordered[1:]) if replaced_at < before and v < below]


def compact_and_reindex(tbl: Any, **compact_options: Any) -> None:
    """Compact a table at its newest version (Lance's ``compact_files`` options), fold
    every row into its indexes, and move the handle to the result."""
    ds = tbl.to_lance()
    ds = ds.checkout_version(ds.latest_version)
    ds.optimize.compact_files(**compact_options)
    ds = ds.checkout_version(ds.latest_version)
    if ds.describe_indices():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            ds.optimize.optimize_indices()
    tbl.checkout_latest()


class StoreMaintenance(StorePositions):
    """Indexes, compaction, version cleanup and the digest a replay is checked by."""

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
        """Compact every table towards LanceDB's large fragments, fold new rows into
        every index (FTS included) and drop the versions replaced more than
        ``reader_grace`` ago (:meth:`cleanup_versions`; not LanceDB's ``optimize``,
        whose cleanup counts from each version's own commit)."""
        self.prune_positions()
        for name in TABLE_NAMES:
            compact_and_reindex(self.table(name))
        self.cleanup_versions()

    def compact(self, target_rows: int = COMPACT_TARGET_ROWS, *, refresh: bool = True) -> int:
        """Merge the small fragments that batched writes leave behind into fragments
        of up to ``target_rows`` rows, in tiers (:func:`compaction_target`); returns
        how many tables were compacted.

        Why not :meth:`optimize`: LanceDB's optimize compacts towards million-row
        fragments, so every run rewrites the whole still-growing fragment (longer as
        the table grows), and the writer must wait for it. Small tiered targets rewrite
        mostly the recent rows. Compaction rewrites data:
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
            sizes = [f.count_rows() for f in ds.get_fragments()]
            target = compaction_target(sizes, target_rows)
            if sum(1 for n in sizes if n < target) < 2:
                continue
            ds.optimize.compact_files(target_rows_per_fragment=target)
            if refresh:  # beside the writer, leave its handle to it (its commits rebase)
                tbl.checkout_latest()
            done += 1
        return done

    def cleanup_versions(self, grace: timedelta | None = None) -> int:
        """On every table, drop the versions a newer one replaced more than ``grace``
        (default ``reader_grace``) ago, with the files only they use; returns how many
        were dropped. Never the version this store's own handle is on: the writer's
        handle stays where its last commit left it while maintenance commits beside
        it, and its next merge reads through it."""
        grace = self.reader_grace if grace is None else grace
        dropped = 0
        for name in TABLE_NAMES:
            tbl = self.table(name)
            in_use = int(tbl.version)
            ds = tbl.to_lance()
            ds = ds.checkout_version(ds.latest_version)
            before = time.time() - grace.total_seconds()
            old = replaced_versions(((v["version"], v["timestamp"].timestamp()) for v in ds.versions()), before, in_use)
            if old:
                ds.cleanup_old_versions(versions=old)
                dropped += len(old)
        return dropped

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
