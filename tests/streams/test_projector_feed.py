"""The projector's feed against the real broker: how fetched batches are grouped into
writes."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

import pytest
from aiokafka import AIOKafkaConsumer

from memstream.domain.events import MessageObserved, Scope
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.projector_feed import FeedBatch, ProjectorFeed
from memstream.streams.topics import Topics

pytestmark = pytest.mark.kafka

_T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)


async def test_batches_still_being_decoded_join_the_write(kafka_bootstrap: str, fresh_topics: Topics, settings_for) -> None:  # type: ignore[no-untyped-def]
    """A write takes what was fetched before it started, including the batches still
    in decoding (one LanceDB write instead of one each); every record is applied once,
    in log order."""
    settings = settings_for(fresh_topics)
    scope = Scope(team_id="t", user_id="u")
    turns = [
        MessageObserved(scope=scope, session_id="s", message_id=f"m{i:03d}", content=f"turn {i}", occurred_at=_T0)
        for i in range(60)
    ]
    async with MemstreamProducer(settings.streams, topics=fresh_topics) as producer:
        positions = await producer.send_many(turns)
    partition = positions[0].partition
    assert {p.partition for p in positions} == {partition}  # one memory space, one partition
    end = positions[-1].offset + 1

    applied: list[list[int]] = []

    async def apply(batch: FeedBatch) -> None:
        applied.append([r.offset for r in batch.records])

    async def slow_decoding(batch: FeedBatch) -> None:
        await asyncio.sleep(0.1)  # every batch is still decoding when the previous one is written

    async def partitions(names: object) -> dict[str, list[int]]:
        return {fresh_topics.messages: list(range(fresh_topics.partitions))}

    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        feed = ProjectorFeed(
            consumer,
            [fresh_topics.messages],
            apply,
            start={},
            end_offsets={(fresh_topics.messages, p): (end if p == partition else 0) for p in range(fresh_topics.partitions)},
            on_decoded=slow_decoding,
            fetch_records=10,
            max_batch=1_000,
            list_partitions=partitions,
        )
        await asyncio.wait_for(feed.run(), timeout=60)
    finally:
        await consumer.stop()
    assert [o for batch in applied for o in batch] == [p.offset for p in positions]
    # the first write waited for the batches fetched before it (each decoded 0.1 s
    # after the one before), instead of writing its 10 records alone
    assert len(applied[0]) > 10
    assert len(applied) < 6
