"""A hard bound on what one fetched record batch may inflate to.

A compressed Kafka batch is small on the wire and can be huge once inflated: 200 MiB of
zeros gzip to about 200 KB. aiokafka inflates a whole batch inside its fetcher, before
any of our code sees a record, so a size check on records comes too late. This module
replaces the one step where aiokafka parses a fetch response into batches
(:class:`BoundedMemoryRecords` in place of ``MemoryRecords``): a compressed v2 batch is
inflated here first, under :data:`MAX_INFLATED_BATCH_BYTES`.

* gzip is inflated incrementally (``zlib`` with ``max_length``) and given up the moment
  the output passes the bound; a batch within it is handed on already inflated, so
  aiokafka does not inflate it a second time;
* snappy, lz4 and zstd cannot be bounded while inflating with the libraries aiokafka
  uses, so such a batch passes only when its size times the codec's worst ratio fits
  the bound (and only when aiokafka can read the codec at all);
* a refused batch becomes one marker record at the batch's last offset (so positions
  move past the whole batch): no value, one :data:`HEADER` whose value is the reason.
  :func:`refusal` reads it; every decoder of the log turns it into a dead letter.

The bound holds for one fetch of one partition, all its batches together: once a
fetch has inflated its share, the rest of it is left to the next fetch (which starts
there, as after a fetch that ended mid-batch), so a batch is refused only when it alone
passes the bound.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import aiokafka.consumer.fetcher as _fetcher
from aiokafka import codec as _codecs
from aiokafka.record.default_records import DefaultRecord, DefaultRecordBatch
from aiokafka.record.memory_records import MemoryRecords

__all__ = ["HEADER", "MAX_INFLATED_BATCH_BYTES", "BoundedMemoryRecords", "Refused", "bound_inflation", "inflate_batch", "refusal"]

HEADER = "memstream-inflation-refused"

MAX_INFLATED_BATCH_BYTES = 64 * 1024 * 1024
"""Most one fetch of one partition inflates to: 64 times the default largest request
(``broker.max_request_bytes``), far above real events' batches, and all a bomb can cost."""

_CODECS = {1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
# The most one compressed byte can become (snappy: a 3-byte copy tag makes 64 bytes; lz4:
# 255 per length byte; zstd: a 4-byte RLE block makes 128 KiB).
_WORST_RATIO = {2: 22, 3: 255, 4: 32_768}
_READABLE = {2: _codecs.has_snappy, 3: _codecs.has_lz4, 4: _codecs.has_zstd}
_CHUNK = 1 << 20
# The v2 batch header (Kafka's DefaultRecordBatch): records start after 61 bytes.
_HEADER_BYTES = 61
_LENGTH_AT, _MAGIC_AT, _ATTRIBUTES_AT = 8, 16, 21
_LOG_OVERHEAD = 12
_CODEC_MASK = 0x07


def refusal(value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None) -> str | None:
    """The reason when this record is the marker of a refused batch, else None."""
    if value is not None or not headers:
        return None
    for key, reason in headers:
        if key == HEADER:
            return (reason or b"").decode("utf-8", "replace")
    return None


class Refused(NamedTuple):
    """Why a batch is not inflated; ``over_bound``: only for its size (a fetch that
    has inflated other batches already leaves it to the next fetch)."""

    reason: str
    over_bound: bool


def inflate_batch(batch: bytes | memoryview, limit: int) -> bytearray | Refused | int:
    """``batch`` (one compressed v2 batch) inflated into an uncompressed batch; or why
    not (over ``limit`` bytes of records, unreadable codec, corrupt); or, for a codec
    aiokafka inflates itself, the most it can become (within ``limit``)."""
    view = memoryview(batch)
    codec = view[_ATTRIBUTES_AT + 1] & _CODEC_MASK
    name = _CODECS.get(codec, f"codec {codec}")
    body = view[_HEADER_BYTES:]
    if codec != 1:
        if codec not in _WORST_RATIO or not _READABLE[codec]():
            return Refused(f"a {name} batch, which this worker cannot read", False)
        worst = len(body) * _WORST_RATIO[codec]
        if worst > limit:
            return Refused(
                f"a {name} batch of {len(body)} bytes may inflate past the bound of {limit} bytes "
                "(only gzip is inflated under a bound)",
                True,
            )
        return worst
    out = bytearray(view[:_HEADER_BYTES])
    try:
        done = _gunzip_into(out, body, limit + _HEADER_BYTES)
    except zlib.error as exc:
        return Refused(f"a gzip batch that does not inflate: {exc}", False)
    if not done:
        return Refused(f"a gzip batch inflating past the bound of {limit} bytes", True)
    attributes = struct.unpack_from(">h", out, _ATTRIBUTES_AT)[0]
    struct.pack_into(">h", out, _ATTRIBUTES_AT, attributes & ~_CODEC_MASK)
    struct.pack_into(">i", out, _LENGTH_AT, len(out) - _LOG_OVERHEAD)
    return out


def _gunzip_into(out: bytearray, data: memoryview, most: int) -> bool:
    """Append the inflated gzip ``data`` (one or more members) to ``out``; False as
    soon as ``out`` would pass ``most`` bytes. Raises ``zlib.error`` when corrupt."""
    pending = bytes(data)
    inflater = zlib.decompressobj(wbits=31)
    while True:
        chunk = inflater.decompress(pending, min(_CHUNK, most + 1 - len(out)))
        out += chunk
        if len(out) > most:
            return False
        if inflater.eof:
            pending = inflater.unused_data
            if not pending.strip(b"\0"):
                return True  # zero padding after the last member, as gzip allows
            inflater = zlib.decompressobj(wbits=31)  # the next gzip member
            continue
        tail = inflater.unconsumed_tail
        if not chunk and len(tail) == len(pending):
            raise zlib.error("truncated gzip stream")  # no input left, or none taken
        pending = tail


class _Inflated:
    """A batch inflated under the bound: the original's header and CRC check, the
    inflated copy's records."""

    def __init__(self, original: Any, inflated: bytearray) -> None:
        self._original = original
        self._records = DefaultRecordBatch(inflated)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._records)

    def __next__(self) -> Any:
        return next(self._records)


class _Refused:
    """A refused batch: its header, and one marker record at its last offset."""

    def __init__(self, original: Any, reason: str) -> None:
        self._original = original
        last = original.base_offset + original.last_offset_delta
        first = f"offsets {original.base_offset}-{last}" if last != original.base_offset else f"offset {last}"
        text = f"{first}: {reason}"
        self._marker = iter([DefaultRecord(last, original.max_timestamp, original.timestamp_type, None, None, [(HEADER, text.encode())])])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)

    def __iter__(self) -> Iterator[Any]:
        return self._marker

    def __next__(self) -> Any:
        return next(self._marker)


class BoundedMemoryRecords:
    """aiokafka's ``MemoryRecords`` (one fetched partition) with compressed v2 batches
    inflated here, all of them together under :attr:`limit` (set by
    :func:`bound_inflation`). The first batch past what is left ends this fetch early:
    the next one starts at that batch, with the whole bound; a batch past the whole
    bound is refused."""

    limit = MAX_INFLATED_BATCH_BYTES

    def __init__(self, bytes_data: bytes) -> None:
        self._buffer = bytes_data
        self._pos = 0
        self._inner = MemoryRecords(bytes_data)
        self._spent = 0
        self._next: Any = None
        self._ended = False

    def size_in_bytes(self) -> int:
        return self._inner.size_in_bytes()

    def has_next(self) -> bool:
        if self._next is None and not self._ended:
            self._next = self._parse_next()
            self._ended = self._next is None
        return self._next is not None

    def next_batch(self) -> Any:
        if not self.has_next():
            return None
        batch, self._next = self._next, None
        return batch

    def _parse_next(self) -> Any:
        if not self._inner.has_next():
            return None
        buffer, start = self._buffer, self._pos
        # The same walk as MemoryRecords: each batch's length is at the same place.
        end = start + _LOG_OVERHEAD + struct.unpack_from(">i", buffer, start + _LENGTH_AT)[0]
        if buffer[start + _MAGIC_AT] < 2 or not buffer[start + _ATTRIBUTES_AT + 1] & _CODEC_MASK:
            self._pos = end
            return self._inner.next_batch()
        got = inflate_batch(memoryview(buffer)[start:end], self.limit - self._spent)
        if isinstance(got, Refused) and got.over_bound and self._spent:
            return None  # this fetch has inflated its share
        self._pos = end
        batch = self._inner.next_batch()
        if isinstance(got, Refused):
            return _Refused(batch, got.reason)
        if isinstance(got, int):  # aiokafka inflates it, to at most this
            self._spent += got
            return batch
        self._spent += len(got)
        return _Inflated(batch, got)


def bound_inflation(limit: int | None = None) -> None:
    """Make every aiokafka consumer of this process read through
    :class:`BoundedMemoryRecords`, bounded at ``limit`` bytes per batch (default:
    :data:`MAX_INFLATED_BATCH_BYTES`, read at each call; idempotent)."""
    # The one hook into aiokafka: its fetcher parses each response with the name
    # MemoryRecords it imported (aiokafka 0.14, consumer/fetcher.py; pinned <0.15 in
    # pyproject.toml, and tests/streams/records/test_inflation_bound.py fails when that changes).
    current = getattr(_fetcher, "MemoryRecords", None)
    if current is not MemoryRecords and current is not BoundedMemoryRecords:
        raise RuntimeError("aiokafka's fetcher no longer parses with MemoryRecords: the inflation bound cannot apply")
    BoundedMemoryRecords.limit = MAX_INFLATED_BATCH_BYTES if limit is None else limit
    _fetcher.MemoryRecords = BoundedMemoryRecords  # type: ignore[misc]
