"""Dead letters: bad records are kept (original bytes, reason, source position) and
never cost a valid neighbour its delivery."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from tests.support import SAFETY_S, read_records

from memstream.domain.events import MemoryAdded, MessageObserved, Scope
from memstream.domain.log import LogPosition, PositionedEvent
from memstream.streams.consumer import ConsumedBatch, EventConsumer, decode_or_dead_letter
from memstream.sealing import Subject, UnreadableRecord, is_sealed, open_sealed
from memstream.streams.sealing.forget import forget
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.sealing.sealed_records import ingress_header, seal_value
from memstream.streams.dead_letters.publisher import (
    DLQ_HEADERS,
    HEADER_DLQ_SEALED_REASON,
    HEADER_DLQ_REASON,
    DeadLetter,
    DeadLetterPublisher,
    NotADeadLetter,
    dead_letter_record,
    is_dead_letter,
    parse_dead_letter,
)
from memstream.codec.wire import HEADER_TYPE, encode_event
from memstream.streams.topics import Topics

SCOPE = Scope(team_id="acme", user_id="ana")


def _dl(**changes: object) -> DeadLetter:
    base: dict[str, object] = dict(
        reason="not JSON: Expecting value at line 1 column 1",
        source_topic="memstream.events",
        source_partition=2,
        source_offset=41,
        original_value=b"\xffgarbage",
        original_key=b"acme/ana",
        original_headers=(("trace-id", b"abc"), ("memstream-type", b"MemoryAdded")),
        stage="decode",
    )
    base.update(changes)
    return DeadLetter(**base)  # type: ignore[arg-type]


# --- the record format (no broker) --------------------------------------------------------


def test_dead_letter_keeps_the_original_record_and_adds_its_story() -> None:
    dl = _dl()
    record = dead_letter_record(dl)
    assert record.value == b"\xffgarbage", "the original bytes, unchanged"
    assert record.key == b"acme/ana"
    assert record.headers[:2] == list(dl.original_headers), "original headers first, unchanged"
    assert [k for k, _ in record.headers[2:]] == list(DLQ_HEADERS)
    assert dict(record.headers)[HEADER_DLQ_REASON] == dl.reason.encode()
    assert parse_dead_letter(record.key, record.value, record.headers) == dl
    assert dl.source_position == LogPosition(topic="memstream.events", partition=2, offset=41)


@pytest.mark.parametrize(
    "dl",
    [
        _dl(original_value=None),
        _dl(original_key=None),
        _dl(original_key=None, original_value=None),
        _dl(original_headers=()),
        _dl(stage="project", reason="projector: lance write failed"),
    ],
    ids=["tombstone", "no-key", "neither", "no-headers", "later-stage"],
)
def test_round_trip_of_edge_cases(dl: DeadLetter) -> None:
    record = dead_letter_record(dl)
    assert record.key is not None or record.value is not None, "Kafka needs a key or a value"
    assert parse_dead_letter(record.key, record.value, record.headers) == dl


def test_a_dead_letter_of_a_dead_letter_keeps_both_stories() -> None:
    first = dead_letter_record(_dl())
    second = _dl(
        original_value=first.value,
        original_headers=tuple(first.headers),
        source_topic="memstream.dead-letter",
        source_offset=7,
        stage="replay",
        reason="still broken",
    )
    record = dead_letter_record(second)
    parsed = parse_dead_letter(record.key, record.value, record.headers)
    assert parsed == second
    inner = parse_dead_letter(parsed.original_key, parsed.original_value, parsed.original_headers)
    assert inner == _dl()


def test_reasons_are_one_bounded_line() -> None:
    record = dead_letter_record(_dl(reason="line one\nline two\t" + "x" * 5000))
    reason = dict(record.headers)[HEADER_DLQ_REASON].decode()
    assert "\n" not in reason and reason.startswith("line one line two")
    assert len(reason) <= 2000


def test_ordinary_records_are_not_dead_letters() -> None:
    record = encode_event(MessageObserved(scope=SCOPE, message_id="m", content="hi"))
    assert not is_dead_letter(record.headers)
    assert not is_dead_letter(None)
    with pytest.raises(NotADeadLetter):
        parse_dead_letter(record.key, record.value, record.headers)


def test_decode_or_dead_letter_judges_each_record_alone() -> None:
    event = MessageObserved(scope=SCOPE, message_id="m", content="hi")
    good = encode_event(event)
    item = decode_or_dead_letter("t.events", 1, 5, good.key, good.value, good.headers)
    assert isinstance(item, PositionedEvent)
    assert item.event == event and item.position == LogPosition(topic="t.events", partition=1, offset=5)

    bad = decode_or_dead_letter("t.events", 1, 6, b"k", b"{oops", [("x", b"y")])
    assert isinstance(bad, DeadLetter)
    assert (bad.source_topic, bad.source_partition, bad.source_offset) == ("t.events", 1, 6)
    assert bad.original_value == b"{oops" and bad.original_key == b"k"
    assert bad.original_headers == (("x", b"y"),)
    assert bad.stage == "decode" and bad.reason.startswith("not JSON")


# --- against the broker -------------------------------------------------------------------


async def _drain(consumer: EventConsumer, events: int, dead: int) -> ConsumedBatch:
    """Everything the consumer yields until it delivered ``events`` and ``dead``."""
    got_events: list[PositionedEvent] = []
    got_dead: list[DeadLetter] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SAFETY_S
    async for batch in consumer.batches(max_records=100, timeout_ms=300):
        got_events += batch.events
        got_dead += batch.dead
        if (len(got_events) >= events and len(got_dead) >= dead) or loop.time() > deadline:
            break
    return ConsumedBatch(events=got_events, dead=got_dead)


@pytest.mark.kafka
async def test_bad_records_go_to_the_dead_letter_topic_and_neighbours_are_delivered(
    kafka_bootstrap: str, fresh_topics: Topics, settings_for
) -> None:
    settings = settings_for(fresh_topics)
    key = b"acme/ana"  # one key: one partition, so the neighbours are real neighbours
    valid = [
        MemoryAdded(scope=SCOPE, memory_id=f"m{i}", content=f"valid memory {i}") for i in range(4)
    ]
    schema_invalid = json.loads(encode_event(valid[0]).value)
    schema_invalid.update(priority=500, event_id=str(uuid.uuid4()))
    mismatched = encode_event(valid[1])
    sequence: list[tuple[bytes | None, list[tuple[str, bytes]], str | None]] = [
        (encode_event(valid[0]).value, encode_event(valid[0]).headers, None),
        (b"\x00\xffthis is not an event\xfe", [("trace-id", b"t-1")], "not UTF-8"),
        (encode_event(valid[1]).value, encode_event(valid[1]).headers, None),
        (json.dumps(schema_invalid).encode(), [], "priority"),
        (encode_event(valid[2]).value, encode_event(valid[2]).headers, None),
        (mismatched.value, [(HEADER_TYPE, b"MemoryLinked")], HEADER_TYPE),
        (None, [], "no value"),
        # an empty object sent with a type header: the reason names the missing field
        (b"{}", [(HEADER_TYPE, b"MemoryAdded")], 'missing field "type"'),
        (encode_event(valid[3]).value, encode_event(valid[3]).headers, None),
    ]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        offsets = []
        for value, headers, _ in sequence:
            md = await producer.send_and_wait(fresh_topics.events, value=value, key=key, headers=headers)
            offsets.append((md.partition, md.offset))
    finally:
        await producer.stop()
    partition = offsets[0][0]
    assert all(p == partition for p, _ in offsets)

    group = f"g-{uuid.uuid4().hex[:6]}"
    async with EventConsumer(fresh_topics.events, group_id=group, streams=settings.streams) as consumer:
        got = await _drain(consumer, events=4, dead=5)
        assert await consumer.commit()
        # committed past the dead letters too: the group resumes after the last record
        tp = TopicPartition(fresh_topics.events, partition)
        assert await consumer.consumer.committed(tp) == offsets[-1][1] + 1

    # every valid record, in order, at its own position
    assert [pe.event for pe in got.events] == valid
    assert [(pe.position.partition, pe.position.offset) for pe in got.events] == [
        offsets[i] for i, (_, _, bad) in enumerate(sequence) if bad is None
    ]
    # the consumer reports the dead letters it published
    assert [(d.source_partition, d.source_offset) for d in got.dead] == [
        offsets[i] for i, (_, _, bad) in enumerate(sequence) if bad is not None
    ]

    # and the dead-letter topic holds them: original bytes, reason, source position
    records = await read_records(kafka_bootstrap, fresh_topics.dead_letter, 5)
    letters = [parse_dead_letter(r.key, r.value, r.headers) for r in sorted(records, key=lambda r: r.offset)]
    expected = [(i, item) for i, item in enumerate(sequence) if item[2] is not None]
    assert len(letters) == len(expected)
    for letter, (index, (value, headers, words)) in zip(letters, expected):
        assert letter.original_value == value
        assert letter.original_key == key
        assert letter.original_headers == tuple(headers)
        assert letter.source_topic == fresh_topics.events
        assert (letter.source_partition, letter.source_offset) == offsets[index]
        assert letter.stage == "decode"
        assert words is not None and words.lower() in letter.reason.lower(), letter.reason



@pytest.mark.kafka
async def test_a_later_stage_can_dead_letter_an_event_with_its_original_bytes(
    kafka_bootstrap: str, fresh_topics: Topics, settings_for
) -> None:
    """A projector that cannot apply an event hands it back with the record as read."""
    settings = settings_for(fresh_topics)
    event = MemoryAdded(scope=SCOPE, memory_id="m1", content="cannot be projected")
    # a non-canonical but valid encoding (spaces, another key order): a re-encoding would differ
    body = json.loads(encode_event(event).value)
    original = json.dumps(dict(reversed(list(body.items()))), indent=1).encode()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(fresh_topics.events, value=original, key=b"acme/ana")
    finally:
        await producer.stop()

    async with EventConsumer(fresh_topics.events, group_id=None, streams=settings.streams) as consumer:
        got = await _drain(consumer, events=1, dead=0)
        assert [pe.event for pe in got.events] == [event]
        position = await consumer.dead_letter(got.events[0], "vector store refused the row", stage="project")
        assert await consumer.commit() is False, "no group: positions are the caller's own"
    assert position.topic == fresh_topics.dead_letter

    records = await read_records(kafka_bootstrap, fresh_topics.dead_letter, 1)
    letter = parse_dead_letter(records[0].key, records[0].value, records[0].headers)
    assert letter.original_value == original
    assert letter.stage == "project" and letter.reason == "vector store refused the row"
    assert letter.source_position == got.events[0].position


@pytest.mark.kafka
async def test_publisher_waits_for_the_ack(kafka_bootstrap: str, fresh_topics: Topics, settings_for) -> None:
    settings = settings_for(fresh_topics)
    async with DeadLetterPublisher(fresh_topics.dead_letter, streams=settings.streams) as publisher:
        positions = await publisher.publish_many([_dl(source_offset=1), _dl(source_offset=2)])
        single = await publisher.publish(_dl(source_offset=3, original_key=None, original_value=None))
    assert [p.offset for p in [*positions, single]] == [0, 1, 2]
    records = await read_records(kafka_bootstrap, fresh_topics.dead_letter, 3)
    parsed = [parse_dead_letter(r.key, r.value, r.headers) for r in sorted(records, key=lambda r: r.offset)]
    assert parsed == [_dl(source_offset=1), _dl(source_offset=2), _dl(source_offset=3, original_key=None, original_value=None)]


@pytest.mark.kafka
async def test_a_sealed_record_that_fails_after_opening_stays_sealed_in_the_dead_letters(
    kafka_bootstrap: str, fresh_topics: Topics, settings_for
) -> None:
    settings = settings_for(fresh_topics, sealing=True)
    canary = f"zq{uuid.uuid4().hex[:10]}"
    invalid = json.dumps(
        {"type": "MemoryAdded", "event_id": str(uuid.uuid4()), "scope": {"team_id": "acme", "user_id": "ana"},
         "occurred_at": "2024-05-08T15:30:00+00:00", "memory_id": "m1", "content": {"secret": canary}}
    ).encode()
    not_json = b"\x01 " + canary.encode()
    async with SubjectKeys(settings.streams, fresh_topics, client_id="test-keys") as keys:
        key = await keys.key_for(Subject("acme", "ana"))
        header = ingress_header(invalid)
        raw = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await raw.start()
        try:
            for plain in (invalid, not_json):
                await raw.send_and_wait(
                    fresh_topics.events, value=seal_value(key, header, plain), key=b"acme/ana",
                    headers=[(HEADER_TYPE, b"MemoryAdded")],
                )
        finally:
            await raw.stop()
    async with EventConsumer(fresh_topics.events, group_id=None, streams=settings.streams) as consumer:
        await _drain(consumer, events=0, dead=2)

    records = sorted(await read_records(kafka_bootstrap, fresh_topics.dead_letter, 2), key=lambda r: r.offset)
    for r in records:
        assert canary.encode() not in b"".join([r.key or b"", r.value or b"", *(v or b"" for _, v in r.headers)])
    letters = [parse_dead_letter(r.key, r.value, r.headers) for r in records]
    assert all(is_sealed(d.original_value) and "sealed" in d.reason for d in letters)
    async with SubjectKeys(settings.streams, fresh_topics, client_id="test-keys") as keys:
        assert keys.keyring is not None
        # the evidence, for whoever holds the key
        assert [open_sealed(d.original_value, keys.keyring) for d in letters] == [invalid, not_json]
        reasons = [open_sealed(dict(d.original_headers)[HEADER_DLQ_SEALED_REASON], keys.keyring).decode() for d in letters]
        assert "content" in reasons[0] and "JSON" in reasons[1]

    await forget(settings.streams, "acme", "ana")
    async with SubjectKeys(settings.streams, fresh_topics, client_id="test-keys") as keys:
        assert keys.keyring is not None
        for d in letters:
            with pytest.raises(UnreadableRecord):
                open_sealed(d.original_value, keys.keyring)
