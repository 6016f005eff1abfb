"""The fast MessageObserved read path never admits what the general path refuses, and
when it admits a record it returns the very event the model would (equal values of
the same types, and the same bytes once encoded again)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support import json_values as json_values_of
from tests.support import event_strategies, mutate

from memstream.domain.events import MessageObserved, Scope
from memstream.streams.consumer import decode_or_dead_letter
from memstream.streams.deadletter import DeadLetter
from memstream.streams.fast_decode import decode_turn
from memstream.streams.serializer import DecodeError, decode_record, encode_event

T0 = "2025-01-31T09:30:00Z"
EID = "0b7e3c8e-5f0a-4c1e-9d2a-1f2e3d4c5b6a"
HEADERS = [("memstream-type", b"MessageObserved"), ("memstream-schema-version", b"1"),
           ("content-type", b"application/json")]


def canonical() -> dict[str, Any]:
    """A turn as the SDK writes it: every field, ``null`` for unset optionals."""
    return {
        "type": "MessageObserved", "schema_version": 1, "event_id": EID, "occurred_at": T0,
        "recorded_at": "2025-01-31T09:30:01.25+01:00",
        "scope": {"team_id": "acme", "user_id": "u-1", "agent_id": "planner"},
        "session_id": "s-1", "task_id": None, "causation_id": "c-1", "correlation_id": None,
        "producer": "sdk", "message_id": "D1:3", "role": "assistant", "speaker": "Ada",
        "content": "I moved to Lisbon\nlast spring.\t(finally)",
        "metadata": {"source": "chat", "n": [1, 2.5, None, True, {"k": "v"}]},
    }


def wire(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")


def assert_agrees(body: Any, headers: Any = HEADERS) -> MessageObserved | None:
    """The contract: accepted -> the general path accepts, with the same event."""
    value = wire(body)
    got = decode_turn(value, headers)
    if got is None:
        return None
    try:
        event = decode_record(value, headers)
    except DecodeError as exc:  # pragma: no cover - the bug these tests hunt
        raise AssertionError(f"fast path accepted what the general path refuses: {exc.reason}") from None
    assert type(got) is type(event) is MessageObserved
    assert got == event
    for name in MessageObserved.model_fields:
        mine, theirs = getattr(got, name), getattr(event, name)
        assert mine == theirs and type(mine) is type(theirs), name
        if isinstance(mine, datetime):
            assert mine.tzinfo is timezone.utc and theirs.tzinfo is timezone.utc, name
    assert type(got.scope) is Scope and got.scope.space == event.scope.space
    assert encode_event(got) == encode_event(event)
    return got


def test_the_canonical_form_takes_the_fast_path() -> None:
    got = assert_agrees(canonical())
    assert got is not None
    assert got.recorded_at == datetime(2025, 1, 31, 8, 30, 1, 250000, tzinfo=timezone.utc)
    assert got.content.endswith("\t(finally)")


def test_sdk_encoded_turns_take_the_fast_path() -> None:
    event = MessageObserved(scope=Scope(team_id="t"), message_id="m-1", content="Übung macht den Meister")
    record = encode_event(event)
    got = decode_turn(record.value, record.headers)
    assert got == event
    assert got is not None and got.event_id == event.event_id


def test_a_missing_recorded_at_is_the_occurrence_as_on_the_general_path() -> None:
    body = canonical()
    del body["recorded_at"]
    got = assert_agrees(body)
    assert got is not None and got.recorded_at == got.occurred_at
    assert assert_agrees({**canonical(), "recorded_at": None}) is not None


@pytest.mark.parametrize(
    ("label", "change"),
    [
        ("newer schema version", {"schema_version": 2}),
        ("another type", {"type": "MemoryAdded"}),
        ("uppercase uuid", {"event_id": EID.upper()}),
        ("space instead of T", {"occurred_at": "2025-01-31 09:30:00Z"}),
        ("naive time", {"occurred_at": "2025-01-31T09:30:00"}),
        ("unknown role", {"role": "narrator"}),
        ("explicit null default", {"role": None}),
        ("null metadata", {"metadata": None}),
        ("unknown field", {"colour": "red"}),
        ("blank content", {"content": " \t "}),
        ("control character", {"content": "a\x00b"}),
        ("newline in speaker", {"speaker": "A\nB"}),
        ("bad id", {"message_id": "has space"}),
        ("id holding a newline", {"task_id": "a\nb"}),
        ("scope id holding a newline", {"scope": {"team_id": "acme\nu-1"}}),
        ("long id", {"session_id": "s" * 129}),
        ("null scope", {"scope": None}),
        ("scope without team", {"scope": {"user_id": "u"}}),
        ("NaN in metadata", {"metadata": {"x": float("nan")}}),
    ],
)
def test_unusual_or_invalid_bodies_go_to_the_model(label: str, change: dict[str, Any]) -> None:
    assert decode_turn(wire({**canonical(), **change}), HEADERS) is None, label


@pytest.mark.parametrize(
    "headers",
    [None, [], [("memstream-type", b"MemoryAdded")], [("memstream-type", b"MessageObserved"),
     ("memstream-schema-version", b"2")], [("memstream-type", b"MessageObserved"), ("content-type", b"text/plain")],
     [("memstream-type", None)], [("memstream-type", b"MessageObserved"), ("memstream-type", b"MemoryAdded")]],
)
def test_records_without_the_canonical_headers_go_to_the_general_path(headers: Any) -> None:
    assert decode_turn(wire(canonical()), headers) is None
    assert decode_turn(wire(canonical()), [("x-trace", b"1"), *HEADERS]) is not None  # others are ignored


def test_size_and_bytes_limits_are_the_readers() -> None:
    value = wire(canonical())
    assert decode_turn(value, HEADERS, max_bytes=len(value) - 1) is None
    assert decode_turn(value, HEADERS, max_bytes=len(value)) is not None
    assert decode_turn(b"\xff\xfe", HEADERS) is None
    assert decode_turn(b'{"content": "\\ud800"}', HEADERS) is None
    assert decode_turn(None, HEADERS) is None


def test_the_consumer_reads_turns_on_the_fast_path_and_still_dead_letters_bad_ones() -> None:
    good = wire(canonical())
    item = decode_or_dead_letter("memstream.messages", 0, 7, b"k", good, HEADERS)
    assert not isinstance(item, DeadLetter) and item.event == decode_record(good, HEADERS)
    bad = wire({**canonical(), "content": "a\x00b"})
    dead = decode_or_dead_letter("memstream.messages", 0, 8, b"k", bad, HEADERS)
    assert isinstance(dead, DeadLetter) and "control character" in dead.reason
    assert dead.original_value == bad
    oversized = decode_or_dead_letter("memstream.messages", 0, 9, b"k", good, HEADERS, max_bytes=len(good) - 1)
    assert isinstance(oversized, DeadLetter) and oversized.original_value == good


# --- generated bodies ---------------------------------------------------------------

TRICKY = [None, True, 0, 1, -1, 2.0, float("inf"), "", " ", "x", "a b", "a\nb", "a\tb", "a\x01b", "user",
          "assistant", "system", "tool", "USER", T0, EID, "2025-01-31T09:30:00", "2025-01-31T09:30:00+02:00",
          "x" * 129, "y" * 300, [], {}, ["msg-1"], {"team_id": "t"}, {"team_id": "t", "user_id": None},
          {"a": [1, {"b": None}]}, "\ud800", "é" * 3]
json_values = json_values_of(TRICKY, list(canonical()))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_bodies_never_pass_what_the_model_refuses(data: st.DataObject) -> None:
    assert_agrees(mutate(data, canonical(), json_values))


texts, ids, times = event_strategies()


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(content=texts, speaker=st.none() | texts, mid=ids, team=ids, when=times,
       role=st.sampled_from(["user", "assistant", "system", "tool"]),
       meta=st.dictionaries(st.text(max_size=5), json_values, max_size=3))
def test_generated_turns_round_trip_through_the_wire_agree(
    content: str, speaker: str | None, mid: str, team: str, when: datetime, role: str, meta: dict[str, Any],
) -> None:
    try:
        event = MessageObserved(scope=Scope(team_id=team), message_id=mid, content=content, speaker=speaker,
                                role=role, occurred_at=when, metadata=meta)
    except ValueError:
        return  # the model refuses the draw (blank content, control characters, NaN...)
    record = encode_event(event)
    got = decode_turn(record.value, record.headers)
    # what the SDK writes always takes the fast path, and comes back as the same event
    assert got == event
    assert_agrees(json.loads(record.value))
