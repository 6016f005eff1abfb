"""The console's log reader on the real broker: the newest records of each partition,
filtered, with the topics' sizes; one consumer serves read after read and sees what
was written between them (nothing of the log is kept across reads)."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaProducer

from memstream.streams.log_tail import LogTail
from memstream.streams.topics import Topics

pytestmark = pytest.mark.kafka


async def _write(bootstrap: str, topic: str, partition: int, values: list[bytes], key: bytes = b"k") -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for v in values:
            await producer.send_and_wait(topic, v, key=key, partition=partition)
    finally:
        await producer.stop()


async def test_the_newest_records_of_each_partition_and_what_comes_after(fresh_topics: Topics, settings_for) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(fresh_topics)
    topic = fresh_topics.events  # three partitions
    await _write(settings.broker.bootstrap_servers, topic, 0, [f"a{i}".encode() for i in range(5)])
    await _write(settings.broker.bootstrap_servers, topic, 1, [b"b0", b"b1"])
    await _write(settings.broker.bootstrap_servers, topic, 1, [b"other"], key=b"x")
    tail = LogTail(settings.broker)
    try:
        first = await tail.read([topic, f"{fresh_topics.prefix}no-such-topic"], 3)
        assert sorted(r.value for r in first.records) == [b"a2", b"a3", b"a4", b"b0", b"b1", b"other"]
        assert first.total == 8 and first.truncated  # partition 0 holds older records than were read
        await _write(settings.broker.bootstrap_servers, topic, 0, [b"a5"])
        second = await tail.read([topic], 10, lambda r: r.key == b"k")
        assert sorted(r.value for r in second.records) == [*(f"a{i}".encode() for i in range(6)), b"b0", b"b1"]
        assert second.total == 9 and not second.truncated
    finally:
        await tail.close()
    assert (await tail.read([topic], 1)).total == 9  # closed: the next read starts a consumer again
    await tail.close()
