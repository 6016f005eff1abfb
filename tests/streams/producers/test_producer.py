"""The producer SDK against the real broker: durability, order per memory space,
byte-identical records, back-pressure, batch failures, the sync wrapper."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from aiokafka.errors import MessageSizeTooLargeError
from tests.support import SAFETY_S, read_records

from memstream.domain.events import (
    EventValidationError,
    MemoryAdded,
    MemoryLinked,
    MessageObserved,
    Scope,
)
from memstream.domain.log import LogPosition
from memstream.settings.model import Settings
from memstream.streams.consumer import EventConsumer
from memstream.streams.producers.producer import (
    MemstreamProducer,
    NotSentError,
    ProduceError,
    ProducerClosedError,
)
from memstream.streams.producers.kafka_producer import Batching
from memstream.streams.producers.sync_producer import SyncProducer
from memstream.codec.wire import EncodeError, decode_record, encode_event
from memstream.streams.topics import Topics

pytestmark = pytest.mark.kafka



def memories(n: int, spaces: int) -> list[MemoryAdded]:
    out = []
    for i in range(n):
        scope = Scope(team_id=f"team{i % 3}", user_id=f"user{i % spaces}", agent_id=f"agent{i % 2}")
        out.append(
            MemoryAdded(
                scope=scope,
                memory_id=f"mem-{i}",
                content=f"fact number {i} — naïve café #{i % 7}",
                priority=i % 101,
                metadata={"i": i},
            )
        )
    return out


async def test_ten_thousand_events_come_back_byte_identical_and_in_order(
    kafka_bootstrap: str, fresh_topics: Topics, settings_for
) -> None:
    settings = settings_for(fresh_topics)
    events = memories(10_000, spaces=12)
    async with MemstreamProducer(settings.streams, topics=fresh_topics) as producer:
        positions = await producer.send_many(events)
    assert len(positions) == len(events)
    assert all(p.topic == fresh_topics.events for p in positions)
    assert len({(p.partition, p.offset) for p in positions}) == len(events), "each event has its own offset"

    # Positions follow send order within each partition (the SDK keeps order per key).
    per_partition: dict[int, list[int]] = defaultdict(list)
    for pos in positions:
        per_partition[pos.partition].append(pos.offset)
    for offsets in per_partition.values():
        assert offsets == sorted(offsets)

    records = await read_records(kafka_bootstrap, fresh_topics.events, len(events))
    assert len(records) == len(events)
    by_position = {(r.partition, r.offset): r for r in records}
    keys_per_partition: dict[bytes, set[int]] = defaultdict(set)
    for event, pos in zip(events, positions):
        rec = by_position[(pos.partition, pos.offset)]
        expected = encode_event(event)
        assert rec.value == expected.value
        assert rec.key == expected.key
        assert list(rec.headers) == expected.headers
        assert decode_record(rec.value, rec.headers) == event
        keys_per_partition[rec.key].add(rec.partition)
    assert len(keys_per_partition) == 12
    assert all(len(parts) == 1 for parts in keys_per_partition.values()), "one memory space, one partition"

    # In order per key, as a consumer group sees it.
    sent_order: dict[bytes, list[uuid.UUID]] = defaultdict(list)
    for event in events:
        sent_order[encode_event(event).key].append(event.event_id)
    seen_order: dict[bytes, list[uuid.UUID]] = defaultdict(list)
    async with EventConsumer(
        fresh_topics.events, group_id=f"g-{uuid.uuid4().hex[:6]}", streams=settings.streams
    ) as consumer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SAFETY_S
        total = 0
        sent_positions = set(positions)
        async for batch in consumer.batches(max_records=2000, timeout_ms=500):
            assert batch.dead == []
            for item in batch.events:
                seen_order[encode_event(item.event).key].append(item.event.event_id)
                assert item.position in sent_positions
            total += len(batch.events)
            assert await consumer.commit() or batch.empty
            if total >= len(events) or loop.time() > deadline:
                break
    assert seen_order == sent_order


async def test_send_returns_the_acknowledged_position(kafka_bootstrap: str, fresh_topics: Topics, settings_for) -> None:
    settings = settings_for(fresh_topics)
    event = MessageObserved(scope=Scope(team_id="acme", user_id="ana"), message_id="m1", content="hello")
    async with MemstreamProducer(settings.streams, topics=fresh_topics) as producer:
        position = await producer.send(event)
        second = await producer.send(event.model_copy(update={"event_id": uuid.uuid4()}))
    assert position.topic == fresh_topics.messages, "turns go to the messages topic by default"
    assert (second.partition, second.offset) == (position.partition, position.offset + 1)
    records = await read_records(kafka_bootstrap, fresh_topics.messages, 2)
    first = next(r for r in records if r.offset == position.offset and r.partition == position.partition)
    assert first.value == encode_event(event).value


async def test_default_topics_and_conveniences(kafka_bootstrap: str, fresh_topics: Topics, settings_for) -> None:
    settings = settings_for(fresh_topics)
    scope = {"team_id": "acme", "user_id": "ana", "agent_id": "trader"}
    deadline = datetime(2030, 1, 1, tzinfo=timezone.utc)
    async with MemstreamProducer(settings.streams, topics=fresh_topics, client_id="trader-7") as producer:
        memory = await producer.add_memory(scope, "Ana prefers tea", memory_type="preference", priority=90)
        turn = await producer.observe_message(scope, "msg-1", "I prefer tea", role="user", session_id="s1")
        decision = await producer.record_decision(scope, "d-1", "NVDA", "buy", "Buy on strength", deadline)
        outcome = await producer.observe_outcome(scope, "o-1", "NVDA", 0.05, 5, decision_id="d-1")
        link = await producer.send(
            MemoryLinked(scope=Scope(**scope), from_memory_id="a", to_memory_id="b", relation="supersedes")
        )
        with pytest.raises(EventValidationError, match="priority"):
            await producer.add_memory(scope, "too important", priority=500)
        with pytest.raises(EventValidationError, match="scope"):
            await producer.add_memory({"user_id": "nobody"}, "no team")
    assert memory.position.topic == fresh_topics.events
    assert memory.event.memory_type == "persona" and memory.event.priority == 90
    assert memory.event.producer == "trader-7"
    assert str(memory) == f"{fresh_topics.events}:{memory.position.partition}:{memory.position.offset}"
    assert turn.position.topic == fresh_topics.messages and turn.event.session_id == "s1"
    assert decision.position.topic == fresh_topics.pending_reflections
    assert outcome.position.topic == fresh_topics.outcomes and outcome.event.decision_id == "d-1"
    assert link.topic == fresh_topics.events
    records = await read_records(kafka_bootstrap, fresh_topics.pending_reflections, 1)
    assert decode_record(records[0].value, records[0].headers) == decision.event


async def test_explicit_topic_overrides_the_default(kafka_bootstrap: str, fresh_topics: Topics, settings_for) -> None:
    settings = settings_for(fresh_topics)
    event = MessageObserved(scope=Scope(team_id="acme"), message_id="m1", content="hi")
    async with MemstreamProducer(settings.streams, topics=fresh_topics) as producer:
        position = await producer.send(event, topic=fresh_topics.events)
    assert position.topic == fresh_topics.events


async def test_back_pressure_bounds_the_sends_in_flight(
    kafka_bootstrap: str, fresh_topics: Topics, settings_for
) -> None:
    """With one send allowed in flight, the next send_nowait returns only after the
    previous one was acknowledged."""
    settings = settings_for(fresh_topics)
    events = memories(5, spaces=2)
    one = Batching(linger_ms=50, max_in_flight=1)
    async with MemstreamProducer(settings.streams, topics=fresh_topics, batching=one) as producer:
        futures = []
        for event in events:
            futures.append(await producer.send_nowait(event))
            assert all(f.done() for f in futures[:-1])
        positions = [await f for f in futures]
    assert len({(p.partition, p.offset) for p in positions}) == 5

    # and with a generous bound, sends really are pipelined (not one at a time)
    generous = Batching(linger_ms=50, max_in_flight=100)
    async with MemstreamProducer(settings.streams, topics=fresh_topics, batching=generous) as producer:
        futures = [await producer.send_nowait(e) for e in memories(20, spaces=2)]
        assert not all(f.done() for f in futures), "linger batches several sends together"
        await producer.flush()
        assert all(f.done() and not f.exception() for f in futures)


async def test_send_many_encodes_everything_before_sending_anything(
    kafka_bootstrap: str, fresh_topics: Topics, settings_for
) -> None:
    settings = settings_for(fresh_topics)
    good = memories(3, spaces=1)
    unencodable = MemoryAdded.model_construct(**{**dict(good[0]), "metadata": {"x": float("nan")}})
    async with MemstreamProducer(settings.streams, topics=fresh_topics) as producer:
        with pytest.raises(EncodeError):
            await producer.send_many([*good, unencodable])
        marker = await producer.send(good[0])
    assert marker.offset == 0, "nothing of the refused batch reached the topic"


async def test_send_many_reports_per_event_results(kafka_bootstrap: str, fresh_topics: Topics, settings_for) -> None:
    """A record the client refuses (over ``max_request_bytes``) is reported per event;
    what came before it is acknowledged, what came after it is not sent (order)."""
    settings = settings_for(fresh_topics, max_request_bytes=2048)
    small = memories(2, spaces=1)
    big = MemoryAdded(scope=small[0].scope, memory_id="big", content="x" * 4000)
    async with MemstreamProducer(settings.streams, topics=fresh_topics) as producer:
        with pytest.raises(ProduceError) as info:
            await producer.send_many([small[0], big, small[1]])
    results = info.value.results
    assert isinstance(results[0], LogPosition)
    assert isinstance(results[1], MessageSizeTooLargeError)
    assert isinstance(results[2], NotSentError)
    assert "2 of 3" in str(info.value)
    records = await read_records(kafka_bootstrap, fresh_topics.events, 1)
    assert decode_record(records[0].value) == small[0]


@pytest.mark.parametrize(("in_flight", "batch_bytes"), [(10_000, 256 * 1024), (10_000, 1024), (3, 1024), (1, 4096)])
async def test_send_many_positions_name_each_event_whatever_the_batching(
    kafka_bootstrap: str, fresh_topics: Topics, settings_for, in_flight: int, batch_bytes: int
) -> None:
    """``send_many`` builds record batches per partition: small batches (several per
    partition) and a bound below the batch's size (sent in parts, never stuck) still
    give every event the position it landed at, in order within its memory space."""
    settings = settings_for(fresh_topics)
    events = memories(60, spaces=4)
    batching = Batching(max_batch_bytes=batch_bytes, max_in_flight=in_flight)
    async with MemstreamProducer(settings.streams, topics=fresh_topics, batching=batching) as producer:
        positions = await producer.send_many(events)
        assert producer._in_flight is not None and producer._in_flight._value == in_flight  # every permit returned
    records = await read_records(kafka_bootstrap, fresh_topics.events, len(events))
    landed = {(r.partition, r.offset): decode_record(r.value, r.headers) for r in records}
    assert len(landed) == len(events)
    assert [landed[(p.partition, p.offset)] for p in positions] == events
    for space in {e.scope.space for e in events}:
        mine = [p for p, e in zip(positions, events) if e.scope.space == space]
        assert len({p.partition for p in mine}) == 1
        assert [p.offset for p in mine] == sorted(p.offset for p in mine)


async def test_producer_must_be_started(fresh_topics: Topics, settings_for) -> None:
    producer = MemstreamProducer(settings_for(fresh_topics).streams, topics=fresh_topics)
    with pytest.raises(ProducerClosedError):
        await producer.send(memories(1, 1)[0])
    await producer.start()
    await producer.stop()
    await producer.stop()  # idempotent
    with pytest.raises(ProducerClosedError):
        await producer.start()


def test_sync_producer_for_code_without_asyncio(kafka_bootstrap: str, topic_prefix: str, settings_for) -> None:
    topics = Topics(prefix=topic_prefix)
    from memstream.streams.admin import ensure_topics

    asyncio.run(ensure_topics(kafka_bootstrap, topics))
    settings: Settings = settings_for(topics)
    events = memories(50, spaces=3)
    with SyncProducer(settings.streams, topics=topics) as producer:
        first = producer.send(events[0])
        many = producer.send_many(events[1:40])
        futures = [producer.send_nowait(e) for e in events[40:]]
        producer.flush()
        later = [f.result(timeout=SAFETY_S) for f in futures]
        memory = producer.add_memory({"team_id": "acme"}, "synchronous memory")
        with pytest.raises(EventValidationError):
            producer.add_memory({"team_id": "acme"}, "")
    with pytest.raises(ProducerClosedError):
        producer.send(events[0])
    positions = [first, *many, *later, memory.position]
    assert len({(p.partition, p.offset) for p in positions}) == 51
    records = asyncio.run(read_records(kafka_bootstrap, topics.events, 51))
    values = {r.value for r in records}
    assert {encode_event(e).value for e in events} | {encode_event(memory.event).value} == values


def test_sync_producer_reports_an_unreachable_broker(topic_prefix: str) -> None:
    settings = Settings(bootstrap_servers="127.0.0.1:1", topic_prefix=topic_prefix)
    producer = SyncProducer(settings.streams)
    with pytest.raises(Exception, match="127.0.0.1"):
        producer.send(memories(1, 1)[0])
    producer.close()




@settings(max_examples=300)
@given(keys=st.lists(st.binary(max_size=40), min_size=1, max_size=20), n=st.integers(1, 64))
def test_the_key_partitioner_places_keys_as_the_default_partitioner(keys: list[bytes], n: int) -> None:
    from aiokafka.partitioner import DefaultPartitioner

    from memstream.streams.producers.producer import KeyPartitioner

    partitions = list(range(n))
    mine, theirs = KeyPartitioner(), DefaultPartitioner()
    for key in keys + keys:  # the second time from the remembered hash
        assert mine(key, partitions, partitions) == theirs(key, partitions, partitions)
    assert mine(None, partitions, partitions[:1]) == 0  # no key: an available partition
