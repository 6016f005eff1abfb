"""``decode_or_dead_letter``'s shared turns: two readers of ``messages`` in one worker
decode each turn once, and only ever reuse the answer decoding the same bytes gives."""

from __future__ import annotations

from datetime import datetime, timezone

from memstream.domain.events import MemoryAdded, MessageObserved, Scope
from memstream.domain.log import PositionedEvent
from memstream.streams.consumer import MAX_SHARED_TURNS, decode_or_dead_letter, sharing_turns
from memstream.codec.wire import encode_event

SCOPE = Scope(team_id="acme", user_id="ana")
T0 = datetime(2025, 1, 31, 9, 30, tzinfo=timezone.utc)


def turn(mid: str, text: str) -> MessageObserved:
    return MessageObserved(scope=SCOPE, message_id=mid, content=text, occurred_at=T0, recorded_at=T0)


def read(offset: int, event: MessageObserved | MemoryAdded, topic: str = "t.messages") -> PositionedEvent:
    """One reader's decoding of ``event`` as the record at ``offset`` (equal events
    make equal bytes: pass the same event for the same record)."""
    record = encode_event(event)
    item = decode_or_dead_letter(topic, 0, offset, record.key, record.value, record.headers, share_turns=True)
    assert isinstance(item, PositionedEvent)
    return item


def test_the_second_reader_of_a_turn_gets_the_first_reader_s_decoding() -> None:
    tea = turn("m1", "I like tea")
    with sharing_turns():
        first = read(7, tea)
        second = read(7, tea)  # the other reader, same record
        third = read(7, tea)  # taken out by the second: decoded again
    assert second.event is first.event and second.position == first.position
    assert third.event is not first.event and third.event == first.event


def test_other_bytes_at_the_same_position_are_decoded_not_reused() -> None:
    with sharing_turns():
        first = read(3, turn("m1", "I like tea"))
        other = read(3, turn("m1", "I like coffee"))  # another record at the same position  # e.g. another topic's record
    assert other.event is not first.event
    assert isinstance(other.event, MessageObserved) and other.event.content == "I like coffee"


def test_nothing_is_kept_without_an_extractor_sharing() -> None:
    tea = turn("m1", "I like tea")
    first = read(1, tea)
    second = read(1, tea)
    assert second.event is not first.event and second.event == first.event


def test_only_turns_are_kept() -> None:
    memory = MemoryAdded(scope=SCOPE, memory_id="mem-1", content="Ana likes tea", occurred_at=T0, recorded_at=T0)
    with sharing_turns():
        first = read(5, memory, topic="t.events")
        second = read(5, memory, topic="t.events")
    assert second.event is not first.event and second.event == first.event


def test_the_oldest_kept_turns_go_beyond_the_bound() -> None:
    turns = [turn(f"m{i}", "same words") for i in range(MAX_SHARED_TURNS + 2)]
    with sharing_turns():
        kept = [read(i, t) for i, t in enumerate(turns[:-1])]
        assert read(0, turns[0]).event is not kept[0].event  # pushed out by the last one
        assert read(MAX_SHARED_TURNS, turns[-2]).event is kept[-1].event
        read(MAX_SHARED_TURNS + 1, turns[-1])
    with sharing_turns():  # the last sharer leaving forgot everything
        assert read(1, turns[1]).event is not kept[1].event
        assert read(MAX_SHARED_TURNS + 1, turns[-1]).event == turns[-1]
