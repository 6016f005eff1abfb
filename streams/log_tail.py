"""The newest records of a few topics, for the console's pages that read the log
(dead letters, pending decisions): one consumer kept started for the API's life, so
a page costs the offsets and the fetches, not a new connection and an admin client
(those were most of a page's time, and all of its p95 on a busy broker).

Reads are serialised on the one consumer (it is assigned per read); partition lists
are kept ``PARTITIONS_TTL_S`` (they change only when an operator adds partitions).
The records themselves are read again each time: nothing of the log is cached here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from memstream.settings import BrokerSettings
from memstream.streams.admin import topic_partitions
from memstream.streams.connect import kafka_options

__all__ = ["FETCH_WAIT_MS", "PARTITIONS_TTL_S", "LogTail", "TailRead"]

FETCH_WAIT_MS = 10
"""The broker's wait for more data per fetch: the reader knows where each partition
ends, so it never waits for records to arrive (Kafka's default, 500 ms, would be
every page's floor)."""
PARTITIONS_TTL_S = 30.0
"""How long a topic's partition list is reused before it is asked again."""


@dataclass
class TailRead:
    records: list[Any] = field(default_factory=list)
    """The kept records, partition by partition, in offset order."""
    total: int = 0
    """Records the topics hold (end minus beginning offsets, retention aside)."""
    truncated: bool = False
    """True when a partition holds older records than were read."""


class LogTail:
    """Reads the last ``scan`` records of each partition of some topics."""

    def __init__(self, broker: BrokerSettings, *, client_id: str = "memstream-console") -> None:
        self._broker = broker
        self._client_id = client_id
        self._consumer: AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()
        self._partitions: dict[str, tuple[float, list[int]]] = {}

    async def read(self, topics: Sequence[str], scan: int, keep: Callable[[Any], bool] = lambda r: True) -> TailRead:
        """The records ``keep`` accepts among the newest ``scan`` of each partition of
        ``topics`` (a topic that does not exist holds none). Raises what Kafka raises;
        the consumer is started afresh on the next read after an error."""
        async with self._lock:
            try:
                return await self._read(topics, scan, keep)
            except BaseException:
                await self._drop()
                raise

    async def close(self) -> None:
        async with self._lock:
            await self._drop()
        self._lock = asyncio.Lock()  # an app served again runs on another event loop

    async def _read(self, topics: Sequence[str], scan: int, keep: Callable[[Any], bool]) -> TailRead:
        out = TailRead()
        tps = [TopicPartition(t, p) for t, ps in (await self._partitions_of(topics)).items() for p in ps]
        if not tps:
            return out
        consumer = await self._started()
        consumer.assign(tps)
        begins, ends = await consumer.beginning_offsets(tps), await consumer.end_offsets(tps)
        out.total = sum(ends[tp] - begins[tp] for tp in tps)
        for tp in tps:
            start = max(begins[tp], ends[tp] - scan)
            out.truncated = out.truncated or start > begins[tp]
            consumer.seek(tp, start)
        waiting = {tp for tp in tps if ends[tp] > max(begins[tp], ends[tp] - scan)}
        try:
            while waiting:
                batch = await consumer.getmany(*waiting, timeout_ms=1000)
                for tp, rows in batch.items():
                    out.records += [r for r in rows if r.offset < ends[tp] and keep(r)]
                for tp in list(waiting):
                    if await consumer.position(tp) >= ends[tp]:
                        waiting.discard(tp)
        finally:
            consumer.pause(*tps)  # no fetching in the background between pages
        return out

    async def _partitions_of(self, topics: Sequence[str]) -> dict[str, list[int]]:
        now = time.monotonic()
        stale = [t for t in topics if t not in self._partitions or self._partitions[t][0] < now]
        if stale:
            found = await topic_partitions(self._broker.bootstrap_servers, stale, client_id=self._client_id)
            for t in stale:
                self._partitions[t] = (now + PARTITIONS_TTL_S, found.get(t, []))
        return {t: self._partitions[t][1] for t in topics if self._partitions[t][1]}

    async def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(**kafka_options(self._broker), group_id=None, enable_auto_commit=False,
                                        client_id=self._client_id, fetch_max_wait_ms=FETCH_WAIT_MS)
            await consumer.start()
            self._consumer = consumer
        return self._consumer

    async def _drop(self) -> None:
        consumer, self._consumer = self._consumer, None
        self._partitions.clear()
        if consumer is not None:
            await consumer.stop()
