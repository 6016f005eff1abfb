"""Append-only storage: a prefix viewed before an append or a growth reads the same
rows after it; the whole grows by a factor, not row by row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from memstream.projections.search.growing import MAX_CHUNKS, Buffer, Chunks


def test_a_view_taken_before_appends_and_growths_keeps_its_rows() -> None:
    buffer = Buffer(np.arange(6, dtype=np.int32).reshape(3, 2))
    before = buffer.prefix(3)
    capacity = buffer.nbytes
    for i in range(40):
        buffer.append(np.full((2, 2), 100 + i, dtype=np.int32))
    assert before.tolist() == [[0, 1], [2, 3], [4, 5]]
    assert len(buffer) == 83 and buffer.prefix(83)[-1].tolist() == [139, 139]
    assert buffer.prefix(5)[3:].tolist() == [[100, 100], [100, 100]]
    assert buffer.nbytes < 2 * 83 * 2 * 4 and buffer.nbytes > capacity  # grown by a factor


def test_a_column_keeps_its_rows_and_few_chunks() -> None:
    chunks = Chunks(pa.array(["a", "b"]))
    early = chunks.column()
    for i in range(3 * MAX_CHUNKS):
        chunks.append(pa.chunked_array([pa.array([f"x{i}"])]))
    column = chunks.column()
    assert column.to_pylist() == ["a", "b", *(f"x{i}" for i in range(3 * MAX_CHUNKS))]
    assert column.num_chunks <= MAX_CHUNKS and early.to_pylist() == ["a", "b"]
