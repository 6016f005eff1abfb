"""The extractor's commits: per partition, only up to the oldest turn not extracted
yet, each carrying a resume mark (which turns after it are done already), read back
when a partition is assigned so a restarted extractor builds the same windows."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError, RebalanceInProgressError

from memstream.domain.extraction.resume_marks import decode_mark
from memstream.services.extraction.turn_buffer import TurnBuffer
from memstream.settings import Settings
from memstream.streams.clients import KafkaAdmin, KafkaConsumer, create_admin

__all__ = ["ExtractorCommits", "consumer_group"]

log = logging.getLogger(__name__)

_COMMIT_EVERY_S = 1.0


def consumer_group(settings: Settings) -> str:
    """The extractor's own consumer group (its commits mean "extracted up to here")."""
    return f"{settings.worker.app_id}.extractor"


class ExtractorCommits:
    """What the extractor committed, and the resume marks it read, per partition."""

    def __init__(self, settings: Settings, buffer: TurnBuffer) -> None:
        self.settings = settings
        self.buffer = buffer
        self.offsets: dict[tuple[str, int], int] = {}
        self.marks: dict[tuple[str, int], str] = {}
        self.marks_read: set[tuple[str, int]] = set()
        """Partitions whose resume marks were read since they were assigned."""
        self._admin: KafkaAdmin | None = None
        self._last_commit = 0.0
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        if self._admin is not None:
            await self._admin.close()
            self._admin = None

    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.read_marks([tp for tp in assigned if (tp.topic, tp.partition) not in self.marks_read])

    async def read_marks(self, assigned: list[TopicPartition]) -> None:
        """Read the resume marks the partitions' last commits carry (which turns
        after each commit were extracted already), before any of their records is
        taken in."""
        if not assigned:
            return
        try:
            if self._admin is None:
                admin = create_admin(self.settings.broker, client_id="memstream-extractor-admin")
                await admin.start()
                self._admin = admin
            committed = await self._admin.list_consumer_group_offsets(
                consumer_group(self.settings), partitions=list(assigned)
            )
        except (KafkaError, OSError) as exc:
            log.warning("extractor: resume marks not read (%s); turns after the commits count as new", exc)
            self.marks_read.update((tp.topic, tp.partition) for tp in assigned)
            return
        for tp in assigned:
            self.marks_read.add((tp.topic, tp.partition))
            meta = committed.get(tp)
            mark = decode_mark(meta.offset, meta.metadata) if meta is not None and meta.offset >= 0 else None
            self.buffer.resume((tp.topic, tp.partition), mark)
            if mark is not None:
                log.info(
                    "extractor resumes %s:%d at %d; %d turn(s) after it are done already",
                    tp.topic, tp.partition, meta.offset, mark.end - meta.offset - len(mark.pending),
                )

    async def commit(self, consumer: KafkaConsumer | None, *, force: bool = False) -> None:
        if consumer is None:
            return
        loop = asyncio.get_running_loop()
        if not force and loop.time() - self._last_commit < _COMMIT_EVERY_S:
            return
        # One commit at a time (the poll loop, finished extractions and a rebalance all
        # commit): each computes its offsets when its turn comes, so they only advance.
        async with self._lock:
            self._last_commit = loop.time()
            assigned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
            safe = {tp: off for tp, off in self.buffer.safe_offsets().items() if tp in assigned}
            marks = self.buffer.commit_marks(safe)
            offsets = {
                TopicPartition(t, p): (off, marks[(t, p)])
                for (t, p), off in safe.items()
                if (self.offsets.get((t, p)), self.marks.get((t, p))) != (off, marks[(t, p)])
            }
            if not offsets:
                return
            try:
                await consumer.commit(offsets)
            except (CommitFailedError, RebalanceInProgressError, IllegalStateError, KafkaError) as exc:
                log.info("extractor commit deferred: %s", exc)
                return
            for tp, (off, mark) in offsets.items():
                self.offsets[(tp.topic, tp.partition)] = off
                self.marks[(tp.topic, tp.partition)] = mark

    async def on_revoked(self, consumer: KafkaConsumer | None, revoked: list[TopicPartition]) -> None:
        if consumer is not None and revoked:
            await self.commit(consumer, force=True)
        gone = [(tp.topic, tp.partition) for tp in revoked]
        dropped = self.buffer.drop_partitions(gone)
        for key in gone:
            self.marks_read.discard(key)
            self.offsets.pop(key, None)
            self.marks.pop(key, None)
        if dropped:
            log.info("extractor released %d pending turns of %d revoked partition(s)", dropped, len(gone))
