"""The single worker's projector runtime (``memstream.services.projector.runtime``):
its maintenance beside the writer."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.projections.projection_helpers import DIM, memory, positioned

from memstream.domain.events import Scope
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.store.lance_store import LanceStore
from memstream.services.projector.runtime import ProjectorRuntime
from memstream.settings.model import Settings
from memstream.streams.records.batches import RawRecord
from memstream.streams.topics import Topics

ALICE = Scope(team_id="acme", user_id="alice")


async def test_a_started_worker_drops_old_versions_at_its_first_maintenance(
    kafka_bootstrap: str, topic_prefix: str, settings_for  # type: ignore[no-untyped-def]
) -> None:
    # A worker killed more often than its cleanup cadence must still drop old versions
    # (bench chaos: the live tables grew to many times a replayed set's size).
    topics = Topics(prefix=topic_prefix, partitions=1, replication_factor=1)
    rt = ProjectorRuntime(settings_for(topics, embedder="local", reader_grace_s=7200.0), topics)
    await rt.open()
    try:
        await assert_maintenance_drops_old_versions(rt, rt.store, topics.events)
    finally:
        await rt.close()


async def assert_maintenance_drops_old_versions(rt: ProjectorRuntime, store: Any, topic: str) -> None:
    """``rt``'s next maintenance drops the old versions ``store`` (its table set, or the
    shard it just took) gathers from a few position saves."""
    store.reader_grace = timedelta(0)  # the readers' grace, shortened for the test
    for offset in range(1, 6):
        store.save_positions({(topic, 0): offset})
    before = len(store.table("positions").list_versions())
    await rt.maintain(indexes=False)
    assert rt._index_build is not None  # noqa: SLF001 - the maintenance started
    await rt._index_build  # noqa: SLF001
    assert len(store.table("positions").list_versions()) < before


def test_the_worker_writing_many_commits_keeps_lancedbs_metadata_cache_within_its_bound(tmp_path: Path) -> None:
    # The writer commits a version a fraction of a second under a trickle; each
    # version's manifest stayed in a cache bounded for readers (64 MB): the worker's
    # memory grew by several MB a minute (docs/benchmarks-history.md).
    bounded = LanceStore(tmp_path / "bounded", embedding_dim=DIM, metadata_cache_bytes=1 << 20)
    reader_bound = LanceStore(tmp_path / "default", embedding_dim=DIM)  # LANCE_METADATA_CACHE_MB
    for store in (bounded, reader_bound):
        projector = Projector(store, LocalEmbedder(DIM))
        for i in range(120):
            projector.apply(positioned([memory(ALICE, f"a{i}", f"Alice note {i}")], start=i))
    assert reader_bound.cache_bytes() > 2 << 20  # what the reader's bound lets a writer keep
    assert 0 < bounded.cache_bytes() <= 2 << 20  # the cache evicts approximately


async def test_a_failing_write_is_retried_with_back_off_until_it_succeeds_and_stops_when_cancelled(
    tmp_path: Path,
) -> None:
    # Giving up on a batch would let the next batch's positions pass it: the runtime
    # retries until the write succeeds, and only the worker stopping (cancellation) ends it.
    topics = Topics(prefix="retry.", partitions=1, replication_factor=1)
    rt = ProjectorRuntime(Settings(home=tmp_path, embedding_dim=DIM, embedder="local"), topics)
    records = [RawRecord(topics.events, 0, 7, None, b"{}", ())]
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise OSError(f"disk full (call {calls})")
        return "written"

    assert await rt._until_done(flaky, records, "projecting") == "written"  # noqa: SLF001
    assert (calls, rt.stats.retries) == (3, 2)

    async def never() -> None:
        raise OSError("still down")

    task = asyncio.create_task(rt._until_done(never, records, "projecting"))  # noqa: SLF001
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rt.stats.retries == 3
