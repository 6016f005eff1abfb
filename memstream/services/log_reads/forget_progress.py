"""Where a forget stands: its records in the log against the projection's positions.

A forget is applied by the projections when their stored position of each partition
holding one of its ``SubjectForgotten`` records has passed that record (the rows are
deleted in the same step as the positions move; every shard stores the positions of
the partitions it owns, so the current set's positions cover every shard). The table
files follow within the readers' grace (docs/security.md, time bounds).
``memstream forget --wait`` and ``memstream forget status`` read this."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiokafka import TopicPartition

from memstream.domain.log import LogPosition
from memstream.projections.store import StoreError, TableSets
from memstream.services.shards import routing as shard_routing
from memstream.settings import Settings
from memstream.streams.admin import topic_partitions
from memstream.streams.clients import create_consumer
from memstream.streams.sealing.key_records import forget_order
from memstream.streams.topics import Topics
from memstream.streams.trust.worker_identity import worker_key

__all__ = ["ForgetProgress", "progress", "forget_positions", "wait_applied"]



@dataclass(frozen=True)
class ForgetProgress:
    positions: tuple[LogPosition, ...]
    """The forget's records (every topic the projector folds)."""
    projected: dict[tuple[str, int], int]
    """The current set's stored next offsets."""

    @property
    def pending(self) -> list[LogPosition]:
        return [p for p in self.positions if self.projected.get((p.topic, p.partition), 0) <= p.offset]

    @property
    def applied(self) -> bool:
        return bool(self.positions) and not self.pending

    def line(self) -> str:
        if not self.positions:
            return "no forget of this subject is in the log"
        done = len(self.positions) - len(self.pending)
        head = f"{done}/{len(self.positions)} forget records applied by the projections"
        if not self.pending:
            return head + "; rows deleted, table files shredded within the readers' grace"
        behind = ", ".join(
            f"{p.topic}:{p.partition} at {self.projected.get((p.topic, p.partition), 0)} (needs > {p.offset})"
            for p in self.pending
        )
        return f"{head}; waiting for {behind}"


def projected_positions(settings: Settings) -> dict[tuple[str, int], int]:
    """The current table set's stored positions (empty before the first projection)."""
    current = TableSets(settings.storage.root).current()
    if not shard_routing.has_projection(current):
        return {}
    try:
        store = shard_routing.open_store(settings, current, create=False)
    except StoreError:
        return {}
    return {k: int(v) for k, v in store.positions().items()}


async def forget_positions(settings: Settings, team_id: str, user_id: str | None) -> list[LogPosition]:
    """The positions of the latest forget of the subject (a user, or every user of the
    team), found by reading the events and messages topics: only forgets the worker
    signed count (a forged one forgets nothing, so it must not read as progress)."""
    topics = Topics.from_settings(settings.broker)
    key = worker_key(settings.resolved_worker_key_file, create=False) if settings.resolved_worker_key_file.exists() else None
    consumer = create_consumer(settings.broker, group_id=None,
                               enable_auto_commit=False, client_id="memstream-forget-status")
    await consumer.start()
    try:
        names = (topics.events, topics.messages)
        found = await topic_partitions(settings.broker.bootstrap_servers, names, client_id="memstream-forget-status")
        tps = [TopicPartition(t, p) for t in names for p in sorted(found.get(t, ()))]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        latest: dict[tuple[str, str, str], LogPosition] = {}
        for tp in tps:
            while await consumer.position(tp) < ends[tp]:
                for r in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, ()):
                    named = forget_order(r.value, r.headers, key)
                    if named is None or named[0].team_id != team_id or user_id not in (None, named[0].user_id):
                        continue
                    latest[(r.topic, named[0].team_id, named[0].user_id)] = LogPosition(
                        topic=r.topic, partition=r.partition, offset=r.offset
                    )
        return sorted(latest.values(), key=lambda p: (p.topic, p.partition, p.offset))
    finally:
        await consumer.stop()


async def progress(settings: Settings, positions: Sequence[LogPosition]) -> ForgetProgress:
    projected = await asyncio.get_running_loop().run_in_executor(None, projected_positions, settings)
    return ForgetProgress(tuple(positions), projected)


async def wait_applied(
    settings: Settings, positions: Sequence[LogPosition], timeout_s: float,
    on_progress: Callable[[ForgetProgress], None] = lambda _: None, poll_s: float = 0.5,
) -> ForgetProgress:
    """Poll the projection until it has applied every record of the forget or
    ``timeout_s`` passed; ``on_progress`` gets each change."""
    deadline = time.monotonic() + timeout_s
    last: str | None = None
    while True:
        state = await progress(settings, positions)
        if state.line() != last:
            on_progress(state)
            last = state.line()
        if state.applied or time.monotonic() >= deadline:
            return state
        await asyncio.sleep(poll_s)
