"""Workers in one consumer group, each projecting the shards of the partitions Kafka
assigns it (a sharded table set, :mod:`memstream.projections.store.shards`).

Membership: a small aiokafka consumer in the group ``<app_id>.projector`` whose
partitions stay paused; it only learns the assignment (its rebalance listener) and
commits the progress hints. The records are read, as by a single worker, by the
group-less feed (:class:`~memstream.streams.projector_feed.ProjectorFeed`) limited to
the owned partitions, from the positions each shard stores beside its rows.

Assignor: ``RangePartitionAssignor``. Shard ``p`` holds partition ``p`` of both the
events and the messages topic, so one member must own partition ``p`` of both; the
range assignor gives each member the same partition numbers of every topic with equal
partition counts (co-partitioning). aiokafka has no cooperative-sticky assignor, and
its (eager) sticky assignor balances each topic's partitions independently, which
could split a shard's two topics between two workers.

On revoke: wait for the write in flight (the apply lock), stop the feed, commit the
hints; shards stay open and leased until the new assignment is known (an eager
rebalance revokes everything each time; most shards come back). On assign: close and
release the shards no longer owned, then, outside the listener (so a member never
blocks the group's next rebalance), take the lease of each new one (a per-shard file
lock; waiting while its previous owner finishes), open it, and start a feed for the
owned partitions from their stored positions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter as Tally
from collections.abc import Iterable
from typing import Any

import faust
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from prometheus_client import Counter, Gauge

from memstream.projections.embedders import build_embedder
from memstream.projections.store import DEFAULT_LEASE_TTL_S, LanceDirBusyError, LanceDirLock, shard_dir
from memstream.services.projector.runtime import ProjectorRuntime
from memstream.services.projector.service import ProjectorService, add_projector, feed_consumer, projector_group
from memstream.services.shards import open_projector, open_shards
from memstream.settings import Settings
from memstream.streams.clients import KafkaConsumer, create_consumer
from memstream.streams.connect import until_started
from memstream.streams.projector_feed import FeedBatch
from memstream.streams.topics import Topics


__all__ = ["ShardLeases", "ShardLostError", "GroupRuntime", "GroupProjectorService", "register_group_projector", "member_consumer"]

log = logging.getLogger(__name__)

SHARD_OWNED = Gauge(
    "memstream_shard_owned", "1 for each shard a live worker writes.", ["partition"], multiprocess_mode="livesum"
)
SHARD_RECORDS = Counter("memstream_shard_records", "Records projected into each shard.", ["partition"])
SHARD_REBALANCES = Counter("memstream_shard_rebalances", "Assignments a worker received from its group.")

_LEASE_POLL_S = 0.1
_LEASE_WAIT_S = 120.0
"""Longest wait for a shard's previous owner to let go (then the worker fails)."""


class ShardLostError(RuntimeError):
    """This worker's lease on a shard expired or was taken over: it must not write."""


class ShardLeases:
    """This process's per-shard write leases: an exclusive file lock per shard
    (``<set>/shards/<p>.lock``), dropped by the kernel if the process dies; on an
    object-store root an expiring lease object per shard (``<p>.lease``,
    :mod:`memstream.projections.store.object_lease`), which :meth:`check` verifies before
    each write."""

    def __init__(self, set_dir: Any, owner: str, lease_ttl_s: float = DEFAULT_LEASE_TTL_S) -> None:
        self.set_dir = set_dir
        self.owner = owner
        self.lease_ttl_s = lease_ttl_s
        self._locks: dict[int, LanceDirLock] = {}

    def held(self) -> frozenset[int]:
        return frozenset(self._locks)

    async def take(self, partition: int, wait_s: float | None = None) -> None:
        """Take shard ``partition``'s lease, waiting while its previous owner finishes
        (or, on an object store, until a dead owner's lease expires)."""
        lock = LanceDirLock(shard_dir(self.set_dir, partition), lease_ttl_s=self.lease_ttl_s)
        deadline = time.monotonic() + (wait_s if wait_s is not None else max(_LEASE_WAIT_S, 3 * self.lease_ttl_s))
        # a lease poll is a GET on the object store: not ten a second per shard
        poll_s = _LEASE_POLL_S if lock.is_local else min(1.0, self.lease_ttl_s / 8)
        while not await asyncio.to_thread(lock.try_acquire, self.owner):
            if time.monotonic() > deadline:
                raise LanceDirBusyError(f"shard {partition} is held by {lock.holder() or 'another process'}")
            await asyncio.sleep(poll_s)
        self._locks[partition] = lock

    def check(self, partitions: Iterable[int]) -> None:
        """Raise :class:`ShardLostError` unless every lease of ``partitions`` is valid."""
        for p in partitions:
            lock = self._locks.get(p)
            if lock is None or not lock.valid():
                raise ShardLostError(f"shard {p}'s lease is no longer this worker's: not writing it")

    def generation(self, partition: int) -> int:
        lock = self._locks.get(partition)
        return lock.generation if lock is not None else 0

    def release(self, partitions: frozenset[int] | set[int]) -> None:
        for p in partitions:
            lock = self._locks.pop(p, None)
            if lock is not None:
                lock.release()


class GroupRuntime(ProjectorRuntime):
    """The projector's runtime over the shards this worker owns (none at first)."""

    def __init__(self, settings: Settings, topics: Topics) -> None:
        super().__init__(settings, topics)
        self.set_dir = self.sets.current()
        self.owned: frozenset[int] = frozenset()
        self._embedder: Any = None
        self._moving = False

    async def open(self) -> None:
        def nothing_owned() -> tuple[Any, Any]:
            self._embedder = build_embedder(self.settings.embeddings)
            store = open_shards(self.settings, self.set_dir, ())
            return store, open_projector(store, self.settings, embedder=self._embedder)

        await self.reopen(nothing_owned)
        await self._dead_letters.start()

    async def own(self, partitions: frozenset[int]) -> None:
        """Write exactly these shards from the next batch on (kept shards stay open)."""
        self._moving = True
        try:
            build = self._index_build
            if build is not None and not build.done():
                await asyncio.gather(build, return_exceptions=True)  # maintenance may touch any shard

            def make() -> tuple[Any, Any]:
                store = open_shards(self.settings, self.set_dir, partitions, reuse=self._store)
                return store, open_projector(store, self.settings, embedder=self._embedder, reuse=self._projector)

            await self.reopen(make)
            if partitions - self.owned:
                # A shard just taken (a worker restarted, a shard moved) drops its old
                # versions at the next maintenance, not a cleanup period of uptime later:
                # workers killed more often than that never dropped any (bench chaos).
                self._cleaned_at = float("-inf")
            self.owned = partitions
        finally:
            self._moving = False

    async def maintain(self, *, indexes: bool = True) -> None:
        if not self._moving and self.owned:
            await super().maintain(indexes=indexes)


class _Listener(ConsumerRebalanceListener):
    def __init__(self, service: "GroupProjectorService") -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.service.on_revoked()

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.service.on_assigned(assigned)


def member_consumer(settings: Settings, client_id: str) -> KafkaConsumer:
    """The group membership consumer (it reads nothing: its partitions stay paused)."""
    return create_consumer(
        settings.broker,
        group_id=projector_group(settings),
        client_id=client_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        partition_assignment_strategy=(RangePartitionAssignor,),
        session_timeout_ms=int(settings.worker.session_timeout_s * 1000),
        heartbeat_interval_ms=max(100, int(settings.worker.session_timeout_s * 1000 / 5)),
        fetch_max_bytes=1024 * 1024,
        max_partition_fetch_bytes=64 * 1024,
    )


async def _topics_known(consumer: KafkaConsumer, topics: Any, wait_s: float = 60.0) -> None:
    """Wait (bounded) until the broker's metadata lists ``topics``: a member that joins
    before it does is assigned nothing until its metadata next refreshes (minutes)."""
    deadline = time.monotonic() + wait_s
    while not set(topics) <= await consumer.topics() and time.monotonic() < deadline:
        await asyncio.sleep(0.5)


class GroupProjectorService(ProjectorService):
    """The projector of one worker among several (see the module docstring)."""

    def __init__(self, app: faust.App, runtime: GroupRuntime) -> None:
        super().__init__(app, runtime)
        self.runtime: GroupRuntime = runtime
        self._members: KafkaConsumer | None = None
        self._membership: asyncio.Task[None] | None = None
        self._leases = ShardLeases(
            runtime.set_dir, f"memstream worker {runtime.settings.worker.app_id}", runtime.settings.storage.lease_ttl_s
        )  # the lock adds the pid
        self.rebalances = 0

    async def on_start(self) -> None:
        rt = self.runtime
        await rt.open()
        s = rt.settings
        self._consumer = await until_started(lambda: feed_consumer(s, f"{s.worker.app_id}-projector"), "projector consumer")
        self._members = await until_started(
            lambda: member_consumer(s, f"{s.worker.app_id}-projector-member"), "projector group member"
        )
        await _topics_known(self._members, rt.source_topics)
        self._members.subscribe(list(rt.source_topics), listener=_Listener(self))
        self._membership = asyncio.ensure_future(self._keep_membership())

    async def _keep_membership(self) -> None:
        assert self._members is not None
        while True:  # polling keeps the member alive (max.poll.interval) and runs rebalances
            await self._members.getmany(timeout_ms=500)

    async def on_revoked(self) -> None:
        async with self._apply_lock:  # the write in flight ends first; none starts after
            await self._stop_feed()
        await self._commit_hint()

    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        assert self._members is not None
        self._members.pause(*assigned)
        owned = frozenset(tp.partition for tp in assigned)
        self.rebalances += 1
        gone = self._leases.held() - owned
        await self.runtime.own(self._leases.held() & owned)
        self._leases.release(gone)
        for p in gone:
            SHARD_OWNED.labels(str(p)).set(0)
        for p in owned:
            SHARD_OWNED.labels(str(p)).set(1)
        SHARD_REBALANCES.inc()
        log.info(
            "projector owns shards %s (rebalance %d; released %s)",
            sorted(owned) or "none", self.rebalances, sorted(gone) or "none",
        )
        if owned:
            self._task = asyncio.ensure_future(self._run_owned(owned))

    async def _apply(self, batch: FeedBatch) -> None:
        # fencing: a worker whose lease lapsed (stalled past its ttl) writes nothing more
        self._leases.check({r.partition for r in batch.records})
        await super()._apply(batch)
        for p, n in Tally(r.partition for r in batch.records).items():
            SHARD_RECORDS.labels(str(p)).inc(n)

    async def _run_owned(self, owned: frozenset[int]) -> None:
        try:
            # Leases are awaited here, not in the rebalance listener: a member waiting
            # there could not rejoin, and two members holding each other's shards
            # from different generations would wait on each other. The next revoke
            # cancels this wait; the lock lets a started `own` finish first.
            for p in sorted(owned - self._leases.held()):
                await self._leases.take(p)
            async with self._apply_lock:
                await self.runtime.own(owned)
            start = await self.runtime.positions()
            await self._feed(start, owned).run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.critical("projector failed; stopping the worker: %s: %s", type(exc).__name__, exc)
            await self.app.crash(exc)
            raise

    async def _stop_feed(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _hint_consumer(self) -> Any:
        """Hints go through the member (a group with members refuses other commits),
        for the partitions it owns."""
        owned = self.runtime.owned
        self._hint = {k: v for k, v in self._hint.items() if k[1] in owned}
        return self._members

    async def on_stop(self) -> None:
        try:
            if self._membership is not None:
                self._membership.cancel()
                await asyncio.gather(self._membership, return_exceptions=True)
            await self.on_revoked()
            if self._members is not None:
                await self._members.stop()
                self._members = None
        finally:
            try:
                await super().on_stop()
            finally:
                self._leases.release(self._leases.held())


def register_group_projector(app: faust.App, settings: Settings, topics: Topics) -> GroupRuntime:
    """Add the group projector service and its maintenance timer to ``app``."""
    rt = GroupRuntime(settings, topics)
    add_projector(app, settings, GroupProjectorService(app, rt), rt.maintain)
    return rt
