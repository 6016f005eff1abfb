"""The vector leg of hybrid search from memory (and the lexical one, ``search_lexical``,
kept beside it): a memory space's vectors, read once per
version of ``memories`` and kept, so that a search compares its query with them in
NumPy instead of asking LanceDB for a flat search (which, without an ANN index, reads
every vector under the prefilter at every query, and cannot start before the query is
embedded: it was the longest step after the embedding; docs/benchmarks.md).

Used only where the flat search would give the same list: the table has no ANN index,
the search filters by the space alone (``SearchFilters`` off), and the space holds at
most :data:`SPACE_MAX_VECTORS` memories. The space's vectors are read while the query
is embedded, under the space's predicate (the agent's too for a pinned read), at the
version the search reads at; distances are LanceDB's cosine distance, ``1 - cos``.
Memory is bounded by :data:`VECTORS_MAX_ROWS` over all spaces, least recently used
spaces first. The space's ``content`` is read with its vectors and indexed for BM25
(``search_lexical``), under the same conditions and at the same version.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memstream.projections import search_queries as q
from memstream.projections.schema import MEMORIES
from memstream.projections.search_lexical import SpaceText, best_rows
from memstream.projections.store import LanceStore, space_where
from memstream.settings import SEARCH_CACHE_VECTORS

__all__ = ["SPACE_MAX_VECTORS", "VECTORS_MAX_ROWS", "SpaceVectors", "VectorCache", "read_space_vectors"]

SPACE_MAX_VECTORS = 20_000
"""Largest space whose vectors are kept (a bigger one is searched by LanceDB)."""
VECTORS_MAX_ROWS = SEARCH_CACHE_VECTORS
"""Memories kept over every space together by default (a vector of 384 float32, its
text and about a dozen BM25 postings each: about 100 MB; ``Settings.search_cache_vectors``)."""

_COLUMNS = ("memory_id", "session_id", "source_message_ids", "content", "vector")


@dataclass(frozen=True)
class SpaceVectors:
    """One space's memories at one version of ``memories``: ids, sessions, source turns
    and the vectors scaled to unit length (a zero vector stays zero) of those that have
    one; and every memory's ``content`` as a BM25 index (``search_lexical``), the
    search's lexical list."""

    version: Hashable
    ids: pa.Array
    sessions: pa.Array
    sources: pa.Array
    unit: np.ndarray
    text: SpaceText

    @classmethod
    def of(cls, version: Hashable, table: pa.Table, text: SpaceText | None = None) -> SpaceVectors:
        """From rows with :data:`_COLUMNS` (``text``: their index, when already built)."""
        text = text if text is not None else SpaceText.of(table)
        table = table.filter(pc.is_valid(table.column("vector")))
        column = table.column("vector").combine_chunks()
        dim = column.type.list_size
        matrix = column.values.to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(column), dim)
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        unit = np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)
        ids, sessions, sources = (table.column(c).combine_chunks() for c in _COLUMNS[:3])
        return cls(version, ids, sessions, sources, unit, text)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def size(self) -> int:
        """The memories held (those without a vector too): what the cache's bound counts."""
        return len(self.text)

    def nearest(self, vector: Sequence[float], limit: int) -> pa.Table:
        """The ``limit`` nearest memories to ``vector`` by cosine distance (nearest
        first, ties by memory id): ``memory_id``, ``session_id``,
        ``source_message_ids`` and ``_distance``, as a LanceDB vector query's list."""
        query = np.asarray(vector, dtype=np.float32)
        norm = float(np.linalg.norm(query))
        sims = self.unit @ (query / norm) if norm > 0 else np.zeros(len(self), dtype=np.float32)
        order = best_rows(sims, np.arange(len(self)), limit, self.ids)
        take = pa.array(order, type=pa.int64())
        return pa.table(
            {
                "memory_id": self.ids.take(take),
                "session_id": self.sessions.take(take),
                "source_message_ids": self.sources.take(take),
                "_distance": pa.array(1.0 - sims[order], type=pa.float32()),
            }
        )


class VectorCache:
    """The spaces' :class:`SpaceVectors`, least recently used first, at most
    ``max_rows`` vectors together. Shared by threads: entries are replaced, never
    changed."""

    def __init__(self, max_rows: int = VECTORS_MAX_ROWS) -> None:
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self._spaces: OrderedDict[Hashable, SpaceVectors] = OrderedDict()
        self._total = 0

    def get(self, key: Hashable, version: Hashable) -> SpaceVectors | None:
        """The space's vectors at ``version``, if kept."""
        with self._lock:
            hit = self._spaces.get(key)
            if hit is None or hit.version != version:
                return None
            self._spaces.move_to_end(key)
            return hit

    def latest(self, key: Hashable) -> SpaceVectors | None:
        """The space's vectors at whichever version they were kept (to carry forward)."""
        with self._lock:
            return self._spaces.get(key)

    def keep(self, key: Hashable, vectors: SpaceVectors) -> None:
        with self._lock:
            old = self._spaces.pop(key, None)
            self._total -= old.size if old is not None else 0
            if vectors.size > self.max_rows:
                return
            self._spaces[key] = vectors
            self._total += vectors.size
            while self._total > self.max_rows:
                _, dropped = self._spaces.popitem(last=False)
                self._total -= dropped.size

    def rows(self) -> int:
        with self._lock:
            return self._total

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
