"""Records on the wrong partition: found by the key's murmur2 partition, re-published
to the right one.

Why: a memory space (team and user, the record key) must live on one partition, the
one Kafka's Java client and memstream's SDK pick (murmur2 of the key). Every reader
relies on it: order within a space, read-your-writes positions, and later one
projection shard per partition. librdkafka-based clients (kcat, confluent-kafka, Go,
Node, .NET) default to a crc32-based partitioner and put a space elsewhere unless
told ``partitioner=murmur2_random`` (docs/producers.md). Such a record is neither
lost nor projected where it landed: the projector re-publishes it to its key's
partition, byte for byte (same key, value and headers) plus the header
:data:`HEADER_REROUTED_FROM` naming where it came from, waits for the broker's ack,
and only then lets its stored position pass the original. The copy is read and
projected like any other record of its partition; the extractor skips the original
(it will read the copy). Copies of one source partition are sent in order through one
idempotent producer, so they keep their order per target partition. A crash between
the ack and the stored position re-publishes once more: projection is idempotent.

Records without a key have no home partition and are left where they are.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from collections.abc import Sequence
from typing import Any

from aiokafka.partitioner import murmur2
from prometheus_client import Counter

__all__ = [
    "HEADER_REROUTED_FROM",
    "REROUTED",
    "home_partition",
    "is_misrouted",
    "rerouted_headers",
    "Rerouter",
]

log = logging.getLogger(__name__)

HEADER_REROUTED_FROM = "memstream-rerouted-from"
"""``topic:partition:offset`` of the original, on a re-published copy."""

REROUTED = Counter(
    "memstream_records_rerouted",
    "Records found on another partition than their key's (murmur2) and re-published to it.",
    ["topic"],
)


@lru_cache(maxsize=65_536)  # a reader meets the same few keys (memory spaces) again and again
def home_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's Java client (and the SDK) gives ``key``: murmur2 of the key
    bytes, sign bit cleared, modulo the partition count."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def is_misrouted(key: bytes | None, partition: int, partitions: int | None) -> bool:
    """True when a keyed record sits on another partition than its key's."""
    if key is None or not partitions:
        return False
    return home_partition(key, partitions) != partition


def rerouted_headers(record: Any) -> list[tuple[str, bytes]]:
    """The original's headers (a header without a value kept as empty bytes) plus
    where it came from; an earlier origin header is replaced, not repeated."""
    origin = f"{record.topic}:{record.partition}:{record.offset}".encode()
    kept = [(k, v if v is not None else b"") for k, v in record.headers if k != HEADER_REROUTED_FROM]
    return [*kept, (HEADER_REROUTED_FROM, origin)]


class Rerouter:
    """Re-publishes misrouted records through a producer the caller owns (started,
    idempotent, ``acks=all``). :meth:`publish` returns once every copy is acknowledged."""

    def __init__(self, producer: Any) -> None:
        self._producer = producer
        self.rerouted = 0

    async def publish(self, misrouted: Sequence[tuple[Any, int]]) -> None:
        """Send each ``(record, home partition)`` in order, then wait for every ack."""
        futures = []
        for rec, target in misrouted:
            log.warning(
                "record %s:%d:%d (key %r) is not on its key's partition %d (its producer does not use "
                "the murmur2 partitioner, see docs/producers.md): re-publishing it there",
                rec.topic, rec.partition, rec.offset, rec.key[:80], target,
            )
            futures.append(
                await self._producer.send(
                    rec.topic, value=rec.value, key=rec.key, partition=target, headers=rerouted_headers(rec)
                )
            )
        for fut in futures:
            await fut
        for rec, _ in misrouted:
            REROUTED.labels(rec.topic).inc()
        self.rerouted += len(misrouted)
