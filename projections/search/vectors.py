"""The vector leg of hybrid search from memory (and the lexical one, ``lexical``,
kept beside it): a memory space's vectors, read once per
version of ``memories`` and kept, so that a search compares its query with them in
NumPy instead of asking LanceDB for a flat search (which, without an ANN index, reads
every vector under the prefilter at every query, and cannot start before the query is
embedded: it was the longest step after the embedding; docs/benchmarks-history.md).

Used only where the flat search would give the same list: the table has no ANN index,
the search filters by the space alone (``SearchFilters`` off), and the space holds at
most :data:`SPACE_MAX_VECTORS` memories. The space's vectors are read while the query
is embedded, under the space's predicate (the agent's too for a pinned read), at the
version the search reads at; distances are LanceDB's cosine distance, ``1 - cos``.
Memory is bounded by :data:`VECTORS_MAX_ROWS` over all spaces, least recently used
spaces first. The space's ``content`` is read with its vectors and indexed for BM25
(``lexical``), under the same conditions and at the same version.

Kept on its measured search latency (docs/benchmarks.md, "Measured design decisions").
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from cachetools import LRUCache

from memstream.projections.search import queries as q
from memstream.projections.search.growing import Buffer
from memstream.projections.schema import MEMORIES
from memstream.projections.search.lexical import SpaceText, best_rows
from memstream.projections.store import LanceStore, space_where

__all__ = ["SPACE_MAX_VECTORS", "VECTORS_MAX_ROWS", "SpaceVectors", "VectorCache", "read_space_vectors"]

SPACE_MAX_VECTORS = 20_000
"""Largest space whose vectors are kept (a bigger one is searched by LanceDB)."""
VECTORS_MAX_ROWS = 60_000
"""Memories kept over every space together by default (a vector of 384 float32, its
text and about a dozen BM25 postings each: about 100 MB in a serving process)."""

_COLUMNS = ("memory_id", "session_id", "source_message_ids", "content", "vector")


class _Units:
    """What the versions of one space's kept vectors share: every row's vector scaled
    to unit length (zero for a row without one) and whether it has one, only appended
    to (``growing``), in the rows of the space's text index."""

    def __init__(self, unit: np.ndarray, has_vector: np.ndarray) -> None:
        self.lock = threading.Lock()
        self.unit, self.has_vector = Buffer(unit), Buffer(has_vector)

    def extend(self, at: int, unit: np.ndarray, has_vector: np.ndarray) -> bool:
        """Append after the first ``at`` rows (``False``: ``at`` is not the end)."""
        with self.lock:
            if len(self.unit) != at:
                return False
            self.unit.append(unit)
            self.has_vector.append(has_vector)
            return True


def _unit_rows(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The rows' vectors scaled to unit length (zero for a null or zero vector), and
    which rows have one."""
    dim = table.schema.field("vector").type.list_size
    column = table.column("vector").combine_chunks()
    has_vector = column.is_valid().to_numpy(zero_copy_only=False)
    matrix = np.zeros((len(column), dim), dtype=np.float32)
    valid = column.filter(column.is_valid())
    matrix[has_vector] = valid.values.to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(valid), dim)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0), has_vector


@dataclass(frozen=True)
class SpaceVectors:
    """One space's memories at one version of ``memories``: its text index (ids,
    sessions, source turns and ``content`` as BM25, ``lexical``, the search's
    lexical list) and, in the same rows, the vectors scaled to unit length (a zero
    vector stays zero) of those that have one (``has_vector``). The rows are the first
    ``text.n_rows`` of storage shared with the space's other versions."""

    version: Hashable
    text: SpaceText
    units: _Units

    @classmethod
    def of(cls, version: Hashable, table: pa.Table) -> SpaceVectors:
        """From rows with :data:`_COLUMNS`."""
        return cls(version, SpaceText.of(table), _Units(*_unit_rows(table)))

    @property
    def unit(self) -> np.ndarray:
        return self.units.unit.prefix(self.text.n_rows)

    @property
    def has_vector(self) -> np.ndarray:
        return self.units.has_vector.prefix(self.text.n_rows)

    def carried(self, version: Hashable, replaced: Collection[str], written: pa.Table) -> SpaceVectors:
        """These vectors without the rows whose id is in ``replaced``, with ``written``
        (rows with :data:`_COLUMNS`) after the rest: the order a read at ``version``
        gives. Appended to the shared storage when the text index was (see
        ``SpaceText.carried``), else copied."""
        gone = self.text.replaced(replaced)
        text = self.text.carried_without(gone, written)
        unit, has_vector = _unit_rows(written)
        if text.store is self.text.store and self.units.extend(self.text.n_rows, unit, has_vector):
            return SpaceVectors(version, text, self.units)
        rows = np.flatnonzero(~gone) if gone is not None else slice(None)
        units = _Units(np.concatenate([self.unit[rows], unit]), np.concatenate([self.has_vector[rows], has_vector]))
        return SpaceVectors(version, text, units)

    def __len__(self) -> int:
        return len(self.text)

    @property
    def size(self) -> int:
        """The rows held (those without a vector too): what the cache's bound counts."""
        return self.text.n_rows

    @property
    def nbytes(self) -> int:
        """The bytes of the storage this version shares with the space's others (its
        unused capacity too)."""
        return self.units.unit.nbytes + self.units.has_vector.nbytes + self.text.store.nbytes

    def with_vectors(self) -> tuple[list[str], np.ndarray]:
        """The ids and unit vectors of the memories that have a vector, in the order a
        read of the space gives."""
        rows = np.flatnonzero(self.has_vector)
        return self.text.columns[0].take(pa.array(rows, type=pa.int64())).to_pylist(), self.unit[rows]

    def nearest(self, vector: Sequence[float], limit: int) -> pa.Table:
        """The ``limit`` nearest memories to ``vector`` by cosine distance (nearest
        first, ties by memory id): ``memory_id``, ``session_id``,
        ``source_message_ids`` and ``_distance``, as a LanceDB vector query's list."""
        query = np.asarray(vector, dtype=np.float32)
        norm = float(np.linalg.norm(query))
        sims = self.unit @ (query / norm) if norm > 0 else np.zeros(self.text.n_rows, dtype=np.float32)
        order = best_rows(sims, np.flatnonzero(self.has_vector), limit, self.text.columns[0])
        return self.text.listed(order, "_distance", 1.0 - sims[order])


class VectorCache:
    """The spaces' :class:`SpaceVectors`, least recently used first, at most
    ``max_rows`` vectors together. Shared by threads: entries are replaced, never
    changed."""

    def __init__(self, max_rows: int = VECTORS_MAX_ROWS) -> None:
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self._spaces: LRUCache[Hashable, SpaceVectors] = LRUCache(max_rows, getsizeof=lambda v: v.size)

    def get(self, key: Hashable, version: Hashable) -> SpaceVectors | None:
        """The space's vectors at ``version``, if kept."""
        with self._lock:
            hit = self._spaces.get(key)
        return hit if hit is not None and hit.version == version else None

    def latest(self, key: Hashable) -> SpaceVectors | None:
        """The space's vectors at whichever version they were kept (to carry forward)."""
        with self._lock:
            return self._spaces.get(key)

    def keep(self, key: Hashable, vectors: SpaceVectors) -> None:
        with self._lock:
            self._spaces.pop(key, None)
            if vectors.size <= self.max_rows:  # a space larger than the bound is not kept
                self._spaces[key] = vectors

    def rows(self) -> int:
        with self._lock:
            return int(self._spaces.currsize)

    def held(self) -> tuple[int, int, int]:
        """The spaces kept, their memories and their storage's bytes
        (:attr:`SpaceVectors.nbytes`), at one moment."""
        with self._lock:
            kept, total = list(self._spaces.values()), int(self._spaces.currsize)
        return len(kept), total, sum(v.nbytes for v in kept)

    def clear(self) -> None:
        with self._lock:
            self._spaces.clear()
            self._total = 0


async def read_space_vectors(store: LanceStore, scope: Any, version: Hashable) -> SpaceVectors | None:
    """The space's vectors read at ``version`` (``None``: more than
    :data:`SPACE_MAX_VECTORS` memories, left to LanceDB)."""
    table = await q.scan(q.native(store, MEMORIES), space_where(scope), _COLUMNS, SPACE_MAX_VECTORS + 1)
    if table.num_rows > SPACE_MAX_VECTORS:
        return None
    # indexing the text is Python work (tens of microseconds a row): off the event loop
    return await asyncio.to_thread(SpaceVectors.of, version, table)
