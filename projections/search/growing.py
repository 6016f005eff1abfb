"""Append-only storage shared by the versions of a kept index, each of which views a
prefix of it.

Why: under a steady stream of writes a memory space gets a new table version several
times a second, and its kept vectors and text index (``vectors``,
``lexical``) are brought to each one. Copying the whole space at every version
cost time and memory in proportion to the space, not to what was written (a 9,000-row
space copied 14 MB of vectors per commit, and the freed copies fragmented the C heap:
docs/benchmarks-history.md). Here a new version appends its rows behind
the old ones; the older versions keep viewing the rows they had, which are never
written again.

Not thread-safe by themselves: their owner serialises appends (a lock, and the check
that the version appending is the one that ends at the storage's end).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["Buffer", "Chunks", "GROWTH", "MAX_CHUNKS"]

GROWTH = 1.5
"""A full buffer's next capacity, as a multiple: amortised O(1) per row appended, at
most a third of the buffer unused."""
MAX_CHUNKS = 32
"""Arrow chunks a column holds before they are combined into one (a take over many
small chunks costs more than over one; combining every 32 appends is O(rows / 32) per
append)."""


class Buffer:
    """A NumPy array that grows at its end. :meth:`prefix` views the first rows; a view
    taken before a growth keeps the old array alive and unchanged."""

    def __init__(self, first: np.ndarray) -> None:
        capacity = max(16, int(len(first) * GROWTH))
        self._array = np.empty((capacity, *first.shape[1:]), dtype=first.dtype)
        self._array[: len(first)] = first
        self.size = len(first)

    def __len__(self) -> int:
        return self.size

    def prefix(self, rows: int) -> np.ndarray:
        return self._array[:rows]

    def append(self, rows: np.ndarray) -> None:
        end = self.size + len(rows)
        if end > len(self._array):
            grown = np.empty((max(end, int(len(self._array) * GROWTH)), *self._array.shape[1:]), self._array.dtype)
            grown[: self.size] = self._array[: self.size]
            self._array = grown  # views of the old array keep it
        self._array[self.size : end] = rows
        self.size = end

    @property
    def nbytes(self) -> int:
        """The bytes the storage holds (its unused capacity too)."""
        return int(self._array.nbytes)


class Chunks:
    """An Arrow column that grows at its end: its chunks, combined into one when there
    are more than :data:`MAX_CHUNKS`. :meth:`column` is the whole column now."""

    def __init__(self, first: pa.Array | pa.ChunkedArray) -> None:
        self._chunks = list(first.chunks) if isinstance(first, pa.ChunkedArray) else [first]
        self._type = first.type

    def append(self, rows: pa.Array | pa.ChunkedArray) -> None:
        if rows.type != self._type:  # a column read empty may come typed null
            rows = rows.cast(self._type)
        self._chunks.extend(rows.chunks if isinstance(rows, pa.ChunkedArray) else [rows])
        if len(self._chunks) > MAX_CHUNKS:
            self._chunks = [pa.concat_arrays(self._chunks)]

    def column(self) -> pa.ChunkedArray:
        return pa.chunked_array(self._chunks, type=self._type)

    @property
    def nbytes(self) -> int:
        """The bytes of the chunks' buffers."""
        return sum(c.get_total_buffer_size() for c in self._chunks)
