"""The ingress sealer on the real broker: plaintext in, sealed records in the log."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from memstream.domain.events import MemoryAdded, MessageObserved, Scope
from memstream.sealing import Subject, is_sealed, sealed_header
from memstream.streams.dead_letters.publisher import parse_dead_letter
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.sealing.sealed_records import RecordOpener
from memstream.streams.sealing.sealer import IngressSealer
from memstream.codec.wire import decode_record, encode_event
from memstream.streams.topics import Topics

pytestmark = pytest.mark.kafka


async def _read_all(bootstrap: str, topic: str) -> list:  # type: ignore[type-arg]
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    try:
        out = []
        while True:
            polled = await consumer.getmany(timeout_ms=1500)
            if not polled:
                return out
            out.extend(r for batch in polled.values() for r in batch)
    finally:
        await consumer.stop()


async def test_ingress_records_are_sealed_into_their_topics(fresh_topics: Topics, settings_for) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(fresh_topics)
    scope = Scope(team_id="acme", user_id="alice")
    canary = f"canary-{uuid.uuid4().hex[:8]}"
    memory = MemoryAdded(scope=scope, memory_id="m1", content=f"{canary} lives in Lyon", memory_type="persona")
    turn = MessageObserved(scope=scope, message_id="t1", content=f"I am {canary}")
    producer = AIOKafkaProducer(bootstrap_servers=settings.broker.bootstrap_servers)
    await producer.start()
    try:
        for event in (memory, turn):
            rec = encode_event(event)
            await producer.send_and_wait(fresh_topics.ingress, rec.value, key=rec.key, headers=rec.headers)
        await producer.send_and_wait(fresh_topics.ingress, b'{"type":"MemoryAdded"}', key=b"x")
    finally:
        await producer.stop()

    async with SubjectKeys(settings.streams) as keys:
        sealer = IngressSealer(settings.streams, settings.worker.app_id, keys, fresh_topics)
        await sealer.run(until_idle=True)
        assert (sealer.sealed, sealer.dead_lettered) == (2, 1)
        events = await _read_all(settings.broker.bootstrap_servers, fresh_topics.events)
        messages = await _read_all(settings.broker.bootstrap_servers, fresh_topics.messages)
        assert len(events) == len(messages) == 1
        opener = RecordOpener(keys.keyring)
        for raw, original in ((events[0], memory), (messages[0], turn)):
            assert is_sealed(raw.value) and canary.encode() not in raw.value
            assert raw.key == b"acme/alice"
            assert sealed_header(raw.value).event_id == str(original.event_id)
            opened = opener.open(raw.value, raw.headers)
            assert opened is not None
            assert decode_record(opened[0], opened[1]) == original

        await keys.forget("acme", "alice")
        assert opener.open(events[0].value, events[0].headers) is None
        assert opener.counts.forgotten == 1

    dead = await _read_all(settings.broker.bootstrap_servers, fresh_topics.dead_letter)
    assert len(dead) == 1
    assert "cannot seal" in parse_dead_letter(dead[0].key, dead[0].value, dead[0].headers).reason


async def test_an_ingress_record_written_before_a_forget_is_never_sealed_under_the_next_key(
    fresh_topics: Topics, settings_for  # type: ignore[no-untyped-def]
) -> None:
    settings = settings_for(fresh_topics)
    scope = Scope(team_id="acme", user_id="alice")
    stale = MemoryAdded(scope=scope, memory_id="m1", content="alice's old address")
    fresh = MemoryAdded(scope=scope, memory_id="m2", content="alice, again")
    producer = AIOKafkaProducer(bootstrap_servers=settings.broker.bootstrap_servers)
    await producer.start()
    try:
        async with SubjectKeys(settings.streams) as keys:
            await keys.key_for(Subject("acme", "alice"))
            rec = encode_event(stale)
            await producer.send_and_wait(fresh_topics.ingress, rec.value, key=rec.key, headers=rec.headers)
            await keys.forget("acme", "alice")  # before the sealer reached the record
        async with SubjectKeys(settings.streams) as keys:
            forgotten_at = keys.forgotten_at[Subject("acme", "alice")]
            rec = encode_event(fresh)  # alice writes again: a new life
            await producer.send_and_wait(
                fresh_topics.ingress, rec.value, key=rec.key, headers=rec.headers, timestamp_ms=forgotten_at + 1
            )
            sealer = IngressSealer(settings.streams, settings.worker.app_id, keys, fresh_topics)
            await sealer.run(until_idle=True)
            assert (sealer.sealed, sealer.dead_lettered) == (1, 1)
            (event,) = await _read_all(settings.broker.bootstrap_servers, fresh_topics.events)
            assert sealed_header(event.value).event_id == str(fresh.event_id)
    finally:
        await producer.stop()
    (dead,) = await _read_all(settings.broker.bootstrap_servers, fresh_topics.dead_letter)
    assert "written before" in parse_dead_letter(dead.key, dead.value, dead.headers).reason


async def test_sealed_ingress_records_are_deleted_from_the_ingress(fresh_topics: Topics, settings_for) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(fresh_topics)
    canary = f"canary-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(bootstrap_servers=settings.broker.bootstrap_servers)
    await producer.start()
    try:
        for i in range(3):
            rec = encode_event(MemoryAdded(scope=Scope(team_id="acme", user_id=f"u{i}"), memory_id="m", content=f"{canary} {i}"))
            await producer.send_and_wait(fresh_topics.ingress, rec.value, key=rec.key, headers=rec.headers)
    finally:
        await producer.stop()
    assert len(await _read_all(settings.broker.bootstrap_servers, fresh_topics.ingress)) == 3
    async with SubjectKeys(settings.streams) as keys:
        sealer = IngressSealer(settings.streams, settings.worker.app_id, keys, fresh_topics)
        await sealer.run(until_idle=True)
    assert sealer.sealed == 3
    # Sealed and committed: the plaintext is gone from the ingress, not kept for its retention.
    assert await _read_all(settings.broker.bootstrap_servers, fresh_topics.ingress) == []
