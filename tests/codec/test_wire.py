"""The wire format: round trips, headers, keys, and every way a record can be refused.

No broker needed: the serializer is pure bytes in, bytes out.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memstream.domain.embedding import encode_vector
from memstream.domain.events import (
    DecisionExpired,
    DecisionRecorded,
    EmbeddingPayload,
    Entity,
    EventBase,
    MemoryAdded,
    MemoryLinked,
    MemoryReflected,
    MessageObserved,
    OutcomeObserved,
    Provenance,
    Scope,
)
from memstream.codec.wire import (
    HEADER_CONTENT_TYPE,
    HEADER_SCHEMA_VERSION,
    HEADER_TYPE,
    MAX_RECORD_BYTES,
    DecodeError,
    EncodeError,
    decode_record,
    encode_event,
    record_key,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
SCOPE = Scope(team_id="acme", user_id="ana", agent_id="planner")


def sample_events() -> list[EventBase]:
    """One fully populated event of every type."""
    common = dict(scope=SCOPE, occurred_at=T0, recorded_at=T0, session_id="s-1", producer="tests")
    return [
        MessageObserved(message_id="msg-1", role="user", speaker="Ana", content="Bonjour, ça va? 你好 🙂", **common),
        MemoryAdded(
            memory_id="mem-1",
            content="Ana prefers tea over coffee.",
            memory_type="persona",
            priority=80,
            scene="morning routine",
            source_message_ids=("msg-1",),
            timestamp=T0,
            timestamp_start=T0,
            timestamp_end=T0 + timedelta(hours=1),
            entities=(Entity(name="Ana", kind="person"),),
            metadata={"lang": "en", "score": 0.25, "tags": ["a", "b"], "nested": {"n": 1}},
            embedding=EmbeddingPayload(model="test-embed", dim=3, data=encode_vector([0.5, -1.0, 2.25])),
            provenance=Provenance(method="llm", model="m", prompt_id="extract", prompt_version="1"),
            **common,
        ),
        MemoryLinked(
            from_memory_id="mem-2", to_memory_id="mem-1", relation="supersedes", decided_by="llm", reason="newer", **common
        ),
        DecisionRecorded(
            decision_id="d-1", subject="NVDA", rating="buy", decision_text="Buy on strength.", horizon_days=5,
            deadline=T0 + timedelta(days=7), **common,
        ),
        OutcomeObserved(
            outcome_id="o-1", decision_id="d-1", subject="NVDA", raw_return=0.031, benchmark_return=0.01,
            alpha=0.021, horizon_days=5, **common,
        ),
        MemoryReflected(
            reflection_id="r-1", decision_id="d-1", outcome_id="o-1", subject="NVDA", rating="buy",
            content="The call was right. Momentum held. Size up next time.", correct=True, **common,
        ),
        DecisionExpired(decision_id="d-2", subject="AAPL", deadline=T0, **common),
    ]


@pytest.mark.parametrize("event", sample_events(), ids=lambda e: e.type)
def test_round_trip_is_exact_and_deterministic(event: EventBase) -> None:
    record = encode_event(event)
    decoded = decode_record(record.value, record.headers)
    assert decoded == event
    assert type(decoded) is type(event)
    again = encode_event(decoded)
    assert again.value == record.value, "encode(decode(encode(e))) must equal encode(e)"
    assert again == record
    # compact: no whitespace between tokens
    assert b'": ' not in record.value and b'", ' not in record.value


@pytest.mark.parametrize("event", sample_events(), ids=lambda e: e.type)
def test_headers_describe_the_body(event: EventBase) -> None:
    record = encode_event(event)
    assert record.headers == [
        (HEADER_TYPE, event.type.encode()),
        (HEADER_SCHEMA_VERSION, str(event.schema_version).encode()),
        (HEADER_CONTENT_TYPE, b"application/json"),
    ]
    body = json.loads(record.value)
    assert body["type"] == event.type and body["schema_version"] == event.schema_version


def test_value_is_utf8_json_of_model_dump() -> None:
    event = sample_events()[0]
    record = encode_event(event)
    assert json.loads(record.value.decode("utf-8")) == event.model_dump(mode="json")
    assert "你好 🙂".encode() in record.value, "non-ASCII stays UTF-8, not \\u escapes"


def test_key_is_the_memory_space() -> None:
    assert record_key(SCOPE) == b"acme/ana"
    other_agent = Scope(team_id="acme", user_id="ana", agent_id="critic")
    assert record_key(other_agent) == record_key(SCOPE), "every agent of a user shares one ordered space"
    assert record_key(Scope(team_id="acme", user_id="bob")) != record_key(SCOPE)
    assert record_key(Scope(team_id="other", user_id="ana")) != record_key(SCOPE)
    assert record_key(Scope(team_id="acme")) == b"acme/default"
    for event in sample_events():
        assert encode_event(event).key == b"acme/ana"


def test_headerless_record_is_accepted() -> None:
    """Plain Kafka clients (console producers, kcat) send no headers."""
    event = sample_events()[1]
    assert decode_record(encode_event(event).value) == event
    assert decode_record(encode_event(event).value, []) == event


def test_content_type_parameters_are_accepted() -> None:
    event = sample_events()[0]
    value = encode_event(event).value
    assert decode_record(value, [(HEADER_CONTENT_TYPE, b"application/json; charset=utf-8")]) == event
    assert decode_record(value, [(HEADER_CONTENT_TYPE, b"Application/JSON")]) == event


def test_old_schema_version_is_upcast_on_read() -> None:
    """A v1 MemoryAdded (``kind`` instead of ``memory_type``, no ``scene``) reads as v2."""
    v1 = {
        "type": "MemoryAdded",
        "schema_version": 1,
        "event_id": str(uuid.uuid4()),
        "occurred_at": "2024-05-01T10:00:00Z",
        "scope": {"team_id": "acme", "user_id": "ana"},
        "memory_id": "legacy-1",
        "content": "Ana likes jazz",
        "kind": "preference",
    }
    value = json.dumps(v1).encode()
    event = decode_record(value, [(HEADER_TYPE, b"MemoryAdded"), (HEADER_SCHEMA_VERSION, b"1")])
    assert isinstance(event, MemoryAdded)
    assert event.schema_version == 2
    assert event.memory_type == "persona"
    assert event.scene is None
    assert event.recorded_at == event.occurred_at, "a missing recorded_at is the occurrence time, not read time"
    # written back, it is a current-version record
    assert encode_event(event).headers[1] == (HEADER_SCHEMA_VERSION, b"2")


def _valid_body() -> dict[str, object]:
    return json.loads(encode_event(sample_events()[1]).value)


def _bytes(body: object) -> bytes:
    return json.dumps(body).encode()


def _with(**changes: object) -> bytes:
    body = _valid_body()
    body.update(changes)
    return _bytes(body)


def _without(*names: str) -> bytes:
    body = _valid_body()
    for name in names:
        body.pop(name)
    return _bytes(body)


VALID = encode_event(sample_events()[1]).value
BAD_RECORDS = [
    # (id, value, headers, kind, words in the reason)
    ("tombstone", None, None, "empty", "no value"),
    ("empty", b"", None, "empty", "empty"),
    ("blank", b"  \n", None, "empty", "empty"),
    ("too-large", b" " * (MAX_RECORD_BYTES + 1), None, "too-large", "limit"),
    ("latin1", '{"content": "café"}'.encode("latin-1"), None, "not-utf8", "UTF-8"),
    ("garbage", b"\x00\xff\xfe garbage", None, "not-utf8", "UTF-8"),
    ("not-json", b"hello world", None, "not-json", "not JSON"),
    ("truncated", VALID[: len(VALID) // 2], None, "not-json", "not JSON"),
    ("nan", VALID.replace(b'"priority":80', b'"priority":NaN'), None, "not-json", "NaN"),
    ("infinity-literal", b'{"x": Infinity}', None, "not-json", "Infinity"),
    ("overflow", b'{"x": 1e999}', None, "not-json", "out of range"),
    ("huge-int", b'{"x": ' + b"9" * 5000 + b"}", None, "not-json", "not JSON"),
    ("deep", b"[" * 100_000 + b"]" * 100_000, None, "not-json", "not JSON"),
    ("lone-surrogate", VALID.replace(b"Ana prefers", b"\\ud800 prefers"), None, "not-json", "surrogate"),
    ("array", b"[1, 2, 3]", None, "not-object", "array"),
    ("string", b'"MemoryAdded"', None, "not-object", "string"),
    ("number", b"42", None, "not-object", "number"),
    ("null", b"null", None, "not-object", "null"),
    ("unknown-type", _with(type="MemoryDeleted"), None, "invalid", "unknown event type"),
    ("no-scope", _without("scope"), None, "invalid", "scope"),
    ("no-event-id", _without("event_id"), None, "invalid", "event_id"),
    ("no-occurred-at", _without("occurred_at"), None, "invalid", "occurred_at"),
    ("naive-time", _with(occurred_at="2025-01-01T10:00:00"), None, "invalid", "occurred_at"),
    ("priority", _with(priority=500), None, "invalid", "priority"),
    ("empty-content", _with(content="   "), None, "invalid", "content"),
    ("memory-type", _with(memory_type="gossip"), None, "invalid", "memory_type"),
    ("hash-mismatch", _with(content_hash="sha256:" + "0" * 64), None, "invalid", "content_hash"),
    ("newer-version", _with(schema_version=99), None, "invalid", "newer"),
    ("bad-embedding", _with(embedding={"model": "m", "dim": 4, "data": "AAAA"}), None, "invalid", "embedding"),
    ("header-type", VALID, [(HEADER_TYPE, b"MemoryLinked")], "header-mismatch", HEADER_TYPE),
    ("header-version", VALID, [(HEADER_SCHEMA_VERSION, b"1")], "header-mismatch", HEADER_SCHEMA_VERSION),
    ("header-version-junk", VALID, [(HEADER_SCHEMA_VERSION, b"two")], "bad-header", HEADER_SCHEMA_VERSION),
    ("header-content-type", VALID, [(HEADER_CONTENT_TYPE, b"application/avro")], "header-mismatch", "content-type"),
    ("header-not-utf8", VALID, [(HEADER_TYPE, b"\xff")], "bad-header", "UTF-8"),
    ("header-null", VALID, [(HEADER_TYPE, None)], "bad-header", "no value"),
    (
        "header-repeated",
        VALID,
        [(HEADER_TYPE, b"MemoryAdded"), (HEADER_TYPE, b"MemoryLinked")],
        "bad-header",
        "repeated",
    ),
]


@pytest.mark.parametrize(
    ("value", "headers", "kind", "words"),
    [case[1:] for case in BAD_RECORDS],
    ids=[case[0] for case in BAD_RECORDS],
)
def test_every_refusal_has_a_one_line_reason(value, headers, kind, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DecodeError) as info:
        decode_record(value, headers)
    error = info.value
    assert error.kind == kind, error.reason
    assert words.lower() in error.reason.lower(), error.reason
    assert "\n" not in error.reason and error.reason == str(error)
    assert len(error.reason) < 1000


def test_repeated_identical_headers_are_fine() -> None:
    event = sample_events()[1]
    headers = [(HEADER_TYPE, b"MemoryAdded"), (HEADER_TYPE, b"MemoryAdded")]
    assert decode_record(encode_event(event).value, headers) == event


def test_lenient_read_fills_a_new_events_envelope_once() -> None:
    """``require_envelope=False`` is for producers validating new input."""
    value = _without("event_id", "occurred_at", "recorded_at")
    event = decode_record(value, require_envelope=False)
    assert isinstance(event.event_id, uuid.UUID)
    with pytest.raises(DecodeError):
        decode_record(value)


def test_encode_refuses_oversized_events() -> None:
    event = sample_events()[1]
    size = len(encode_event(event).value)
    with pytest.raises(EncodeError, match="limit"):
        encode_event(event, max_bytes=size - 1)
    assert encode_event(event, max_bytes=size).value


def test_encode_refuses_what_no_reader_could_read() -> None:
    """Events built without validation (``model_construct``) can still hold NaN."""
    good = sample_events()[4]
    assert isinstance(good, OutcomeObserved)
    bad = OutcomeObserved.model_construct(**{**dict(good), "raw_return": float("nan")})
    with pytest.raises(EncodeError):
        encode_event(bad)


# --- properties ---------------------------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
_HEADERS = st.lists(
    st.tuples(
        st.sampled_from([HEADER_TYPE, HEADER_SCHEMA_VERSION, HEADER_CONTENT_TYPE, "other"]),
        st.one_of(st.none(), st.binary(max_size=20), st.sampled_from([b"MemoryAdded", b"2", b"application/json"])),
    ),
    max_size=4,
)


def _decode_or_refuse(value: bytes | None, headers: list[tuple[str, bytes]] | None) -> None:
    try:
        event = decode_record(value, headers)
    except DecodeError as exc:
        assert exc.reason and "\n" not in exc.reason
    else:
        assert isinstance(event, EventBase)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.one_of(st.none(), st.binary(max_size=300)), headers=st.one_of(st.none(), _HEADERS))
def test_random_bytes_never_raise_anything_but_decode_error(value, headers) -> None:  # type: ignore[no-untyped-def]
    _decode_or_refuse(value, headers)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_JSON)
def test_random_json_never_raises_anything_but_decode_error(body) -> None:  # type: ignore[no-untyped-def]
    _decode_or_refuse(json.dumps(body).encode(), None)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    event=st.sampled_from(sample_events()),
    field=st.sampled_from(["type", "schema_version", "scope", "event_id", "occurred_at", "content", "priority", "x"]),
    replacement=_JSON,
)
def test_random_field_values_never_raise_anything_but_decode_error(event, field, replacement) -> None:  # type: ignore[no-untyped-def]
    body = json.loads(encode_event(event).value)
    body[field] = replacement
    _decode_or_refuse(json.dumps(body).encode(), encode_event(event).headers)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event=st.sampled_from(sample_events()), data=st.data())
def test_corrupted_records_never_raise_anything_but_decode_error(event, data) -> None:  # type: ignore[no-untyped-def]
    value = bytearray(encode_event(event).value)
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(value) - 1))
        value[pos] = data.draw(st.integers(0, 255))
    _decode_or_refuse(bytes(value), encode_event(event).headers)


@settings(max_examples=200, deadline=None)
@given(
    content=st.text(min_size=1, max_size=200).filter(lambda s: s.strip()),
    team=st.from_regex(r"[A-Za-z0-9_.:@+=-]{1,20}", fullmatch=True),
    priority=st.integers(0, 100),
)
def test_valid_memories_round_trip(content: str, team: str, priority: int) -> None:
    try:
        event = MemoryAdded(scope=Scope(team_id=team), memory_id="m", content=content, priority=priority)
    except ValueError:
        return  # content the model refuses (control characters, surrogates) is not our concern here
    record = encode_event(event)
    assert decode_record(record.value, record.headers) == event
    assert encode_event(decode_record(record.value)).value == record.value


def _old_encoding(event: EventBase) -> bytes:
    """The encoder's careful path: ``json.dumps`` over ``model_dump``."""
    body = event.model_dump(mode="json")
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def test_the_fast_writer_writes_what_the_careful_one_writes() -> None:
    for event in sample_events():
        assert encode_event(event).value == _old_encoding(event)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(metadata=st.dictionaries(st.text(max_size=10), _JSON, max_size=4), content=st.text(min_size=1, max_size=40))
def test_any_valid_event_encodes_to_the_same_json_and_round_trips(metadata, content) -> None:  # type: ignore[no-untyped-def]
    try:
        event = MessageObserved(
            scope=SCOPE, message_id="m-1", content=content, metadata=metadata, occurred_at=T0, recorded_at=T0
        )
    except ValueError:
        return  # e.g. blank content, a control character, a lone surrogate: refused earlier
    value = encode_event(event).value
    assert json.loads(value) == json.loads(_old_encoding(event))  # floats may be spelled 1e-7 or 1e-07
    assert decode_record(value, encode_event(event).headers) == event


@pytest.mark.parametrize("word", ["NaN", "Infinity", "-Infinity"])
def test_text_holding_the_words_of_non_finite_numbers_still_encodes(word: str) -> None:
    event = MessageObserved(scope=SCOPE, message_id="m-1", content=f"{word} bread", occurred_at=T0, recorded_at=T0)
    assert encode_event(event).value == _old_encoding(event)


def test_encode_refuses_infinity_and_lone_surrogates_in_unvalidated_events() -> None:
    good = sample_events()[0]
    for bad in (
        MessageObserved.model_construct(**{**dict(good), "metadata": {"x": float("inf")}}),
        MessageObserved.model_construct(**{**dict(good), "metadata": {"x": [float("-inf")]}}),
        MessageObserved.model_construct(**{**dict(good), "content": "a \ud800 b"}),
    ):
        with pytest.raises(EncodeError):
            encode_event(bad)
