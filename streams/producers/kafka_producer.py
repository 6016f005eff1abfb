"""The one aiokafka producer configuration memstream writes with, and its partitioner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner, murmur2

from memstream.settings import BrokerSettings
from memstream.streams.clients import create_producer

__all__ = ["LINGER_MS", "MAX_BATCH_BYTES", "MAX_IN_FLIGHT", "Batching", "KeyPartitioner", "create_kafka_producer"]

LINGER_MS = 5
"""How long a producer waits to fill a batch: a burst of small events shares a request,
while a lone write waits only a few milliseconds."""
MAX_BATCH_BYTES = 256 * 1024
"""Largest batch a producer sends to one partition: many small events per request, well
under the broker's request bound (``broker.max_request_bytes``)."""
MAX_IN_FLIGHT = 10_000
"""Back-pressure bound of one SDK producer: a fleet's burst is pipelined, yet what it
buffers stays a few MB instead of growing without limit."""


@dataclass(frozen=True)
class Batching:
    """How a producer batches its sends and how many it leaves un-acknowledged (the
    constants above; a bulk loader or a test passes its own)."""

    linger_ms: int = LINGER_MS
    max_batch_bytes: int = MAX_BATCH_BYTES
    max_in_flight: int = MAX_IN_FLIGHT


class KeyPartitioner:
    """aiokafka's default partitioning, the Java client's (murmur2 of the key bytes, so
    every client puts a memory space on the same partition), with each key's hash
    remembered: a producer sends many records per memory space and murmur2 is pure
    Python (the saving is in docs/benchmarks-history.md). Records without a key go
    where aiokafka's default puts them."""

    _MAX_KEYS = 65_536

    def __init__(self) -> None:
        self._hashes: dict[bytes, int] = {}
        self._default = DefaultPartitioner()

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            return int(self._default(key, all_partitions, available))
        h = self._hashes.get(key)
        if h is None:
            if len(self._hashes) >= self._MAX_KEYS:
                self._hashes.clear()
            h = self._hashes[key] = murmur2(key) & 0x7FFFFFFF
        return all_partitions[h % len(all_partitions)]


def create_kafka_producer(
    broker: BrokerSettings,
    *,
    bootstrap_servers: str | None = None,
    client_id: str = "memstream-sdk",
    compression_type: str | None = None,
    transactional_id: str | None = None,
    partitioner: KeyPartitioner | None = None,
    batching: Batching = Batching(),
) -> AIOKafkaProducer:
    """The one aiokafka producer configuration memstream writes with.

    Idempotent with ``acks="all"``: a record is acknowledged only once every in-sync
    replica has it, and broker-side retries never duplicate or reorder a partition.
    ``linger_ms`` / ``max_batch_size`` trade a few milliseconds for throughput.
    Compression is off unless asked for (aiokafka refuses a codec whose library is
    missing, e.g. ``lz4`` without the ``lz4`` package).
    """
    kwargs: dict[str, Any] = {}
    if transactional_id is not None:
        kwargs["transactional_id"] = transactional_id
    return create_producer(
        broker,
        bootstrap_servers=bootstrap_servers,
        client_id=client_id,
        enable_idempotence=True,
        acks="all",
        linger_ms=batching.linger_ms,
        max_batch_size=batching.max_batch_bytes,
        max_request_size=broker.max_request_bytes,
        compression_type=compression_type,
        partitioner=partitioner or KeyPartitioner(),
        **kwargs,
    )
