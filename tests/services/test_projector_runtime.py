"""The single worker's projector runtime (``memstream.services.projector_runtime``):
its maintenance beside the writer."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from memstream.services.projector_runtime import ProjectorRuntime
from memstream.streams.topics import Topics


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
