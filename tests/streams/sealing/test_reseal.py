"""`memstream reseal` on the real broker: a plaintext log becomes a sealed one in place."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaProducer
from tests.support import read_to_end

from memstream.domain.events import MemoryAdded, MessageObserved, Scope
from memstream.sealing import is_sealed
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.sealing.reseal import STATE_FILE, reseal
from memstream.streams.sealing.sealed_records import RecordOpener
from memstream.codec.wire import decode_record, encode_event
from memstream.streams.topics import Topics

pytestmark = pytest.mark.kafka


async def _records(bootstrap: str, topic: str, partitions: int) -> list:  # type: ignore[type-arg]
    return await read_to_end(bootstrap, [topic], partitions)


async def test_reseal_seals_a_plaintext_log_in_place(fresh_topics: Topics, settings_for) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(fresh_topics)
    canary = f"canary-{uuid.uuid4().hex[:8]}"
    events = []
    for user in ("alice", "bob", "carol"):
        scope = Scope(team_id="acme", user_id=user)
        events += [MemoryAdded(scope=scope, memory_id=f"{user}-{i}", content=f"{canary} {user} {i}") for i in range(4)]
        events += [MessageObserved(scope=scope, message_id=f"{user}-t{i}", content=f"{canary} says {i}") for i in range(3)]
    producer = AIOKafkaProducer(bootstrap_servers=settings.broker.bootstrap_servers)
    await producer.start()
    try:
        for e in events:
            rec = encode_event(e)
            topic = fresh_topics.messages if isinstance(e, MessageObserved) else fresh_topics.events
            await producer.send_and_wait(topic, rec.value, key=rec.key, headers=rec.headers)
    finally:
        await producer.stop()
    before = {
        t: [(r.partition, r.offset) for r in await _records(settings.broker.bootstrap_servers, t, 3)]
        for t in (fresh_topics.events, fresh_topics.messages)
    }

    lines: list[str] = []
    counts = await reseal(settings.streams, settings.home / STATE_FILE, progress=lines.append)
    assert counts[fresh_topics.events] == 12 and counts[fresh_topics.messages] == 9

    async with SubjectKeys(settings.streams) as keys:
        opener = RecordOpener(keys.keyring)
        decoded = []
        for topic in (fresh_topics.events, fresh_topics.messages):
            records = await _records(settings.broker.bootstrap_servers, topic, 3)
            assert [(r.partition, r.offset) for r in records] == before[topic]  # positions stay valid
            for r in records:
                assert is_sealed(r.value) and canary.encode() not in r.value
                opened = opener.open(r.value, r.headers)
                assert opened is not None
                decoded.append(decode_record(*opened))
    assert sorted(str(e.event_id) for e in decoded) == sorted(str(e.event_id) for e in events)
    assert not (settings.home / "reseal.json").exists()
    assert await reseal(settings.streams, settings.home / STATE_FILE) == dict.fromkeys(fresh_topics.kept_forever(), 0)  # again: nothing left to seal
