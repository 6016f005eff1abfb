"""The fast MemoryAdded read path never admits what the general path refuses, and when
it admits a record its values are exactly the model's."""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support import json_values as json_values_of
from tests.support import event_strategies, mutate

from memstream.domain.embedding import encode_vector
from memstream.domain.events import MemoryAdded, Scope
from memstream.codec.fast_decode import FastDecoder, FastMemory, FastMemoryDecoder
from memstream.codec.values import event_values
from memstream.codec.wire import DecodeError, decode_record, encode_event

MODEL, DIM = "mini", 3
VECTOR = [0.5, -1.0, 2.0]
T0 = "2025-01-31T09:30:00Z"
EID = "0b7e3c8e-5f0a-4c1e-9d2a-1f2e3d4c5b6a"


def canonical() -> dict[str, Any]:
    """A MemoryAdded as the SDK writes it: every field, ``null`` for unset optionals."""
    return {
        "type": "MemoryAdded", "schema_version": 2, "event_id": EID, "occurred_at": T0,
        "recorded_at": "2025-01-31T09:30:01.25+01:00",
        "scope": {"team_id": "acme", "user_id": "u-1", "agent_id": "planner"},
        "session_id": "s-1", "task_id": None, "causation_id": None, "correlation_id": "c-9",
        "producer": "sdk", "memory_id": "mem-1", "content": "Ada lives in  Lisbon.",
        "content_hash": "", "memory_type": "persona", "priority": 70,
        "scene": "relocation\nsecond line", "source_message_ids": ["msg-1", "msg-2"],
        "timestamp": T0, "timestamp_start": "2025-01-20T00:00:00+01:00",
        "timestamp_end": "2025-01-31T00:00:00+01:00",
        "entities": [{"name": "Lisbon", "kind": "place"}, {"name": "Ada", "kind": "Org"}],
        "metadata": {"source": "chat", "n": [1, 2.5, None, True, {"k": "v"}]},
        "embedding": {"model": MODEL, "dim": DIM, "data": encode_vector(VECTOR)},
        "provenance": {"method": "llm", "model": "m", "input_refs": ["memstream.messages:0:12"],
                       "latency_ms": 12.5, "token_usage": {"prompt": 10}},
    }


DECODER = FastMemoryDecoder(MODEL, DIM)
HEADERS = [("memstream-type", b"MemoryAdded"), ("memstream-schema-version", b"2"),
           ("content-type", b"application/json")]


def model_values(event: MemoryAdded) -> FastMemory:
    """What the fast path must return for ``event``: the general path's values, and
    the vector's bytes (empty without one)."""
    vector = b"" if event.embedding is None else event.embedding.to_array().tobytes()
    return FastMemory(event_values(event), vector)


def wire(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")


def fast(body: Any, headers: Any = HEADERS) -> FastMemory | None:
    """Both steps of the fast path: the record, then its vector (checked per batch)."""
    got = DECODER.decode(wire(body), headers)
    if got is None or not DECODER.vectors([got])[1].all():
        return None
    return got


def assert_agrees(body: Any, headers: Any = HEADERS) -> FastMemory | None:
    """The contract: accepted -> the general path accepts, with equal values."""
    value = wire(body)
    got = fast(body, headers)
    if got is None:
        return None
    try:
        event = decode_record(value, headers)
    except DecodeError as exc:  # pragma: no cover - the bug these tests hunt
        raise AssertionError(f"fast path accepted what the general path refuses: {exc.reason}") from None
    assert isinstance(event, MemoryAdded)
    expected = model_values(event)
    mine_all = got.values.as_dict()
    assert list(mine_all) == list(expected.values)
    for name in expected.values:
        mine, theirs = mine_all[name], expected.values[name]
        assert mine == theirs, name
        assert type(mine) is type(theirs) or theirs is None, name
        if isinstance(mine, datetime):
            offset = mine.utcoffset()
            assert offset is not None and offset.total_seconds() == 0
    matrix, _ = DECODER.vectors([got])
    if event.embedding is None:
        assert not matrix[0].any()  # a zero row, for the projector to fill in
    else:
        assert np.array_equal(matrix[0], event.embedding.to_array())
    return got


@pytest.mark.parametrize("body", [{"embedding": None}, {}], ids=["null", "absent"])
def test_a_memory_without_a_vector_takes_the_fast_path_for_the_projector_to_embed(body: dict[str, Any]) -> None:
    record = canonical()
    del record["embedding"]
    got = assert_agrees({**record, **body})
    assert got is not None and got.vector == b""


def test_the_canonical_form_takes_the_fast_path() -> None:
    fast = assert_agrees(canonical())
    assert fast is not None
    assert fast.values.entities == [{"name": "Lisbon", "kind": "place"}, {"name": "Ada", "kind": "organization"}]
    assert fast.values.recorded_at == datetime(2025, 1, 31, 8, 30, 1, 250000, tzinfo=timezone.utc)


def test_the_projectors_reader_crosses_a_process_boundary() -> None:
    """The decoder process is sent the reader pickled; it reads there as here."""
    record = encode_event(MemoryAdded.model_validate(canonical()))
    reader = FastMemoryDecoder(MODEL, len(VECTOR))
    here = reader.decode(record.value, record.headers)
    assert here is not None
    script = (
        "import pickle, sys; reader, value, headers = pickle.loads(sys.stdin.buffer.read()); "
        "print(repr(reader.decode(value, headers).values.content))"
    )
    sent = pickle.dumps((reader, record.value, record.headers))
    done = subprocess.run([sys.executable, "-c", script], input=sent, capture_output=True, check=True)
    assert done.stdout.decode().strip() == repr(here.values.content)


def test_sdk_encoded_events_take_the_fast_path() -> None:
    from memstream.domain.events import EmbeddingPayload, Entity

    event = MemoryAdded(
        scope=Scope(team_id="t"), memory_id="m-1", content="Übung macht den Meister",
        entities=(Entity(name="Meister"),),
        embedding=EmbeddingPayload.from_vector(MODEL, VECTOR),
    )
    record = encode_event(event)
    got = DECODER.decode(record.value, record.headers)
    assert got is not None and (got.values.as_dict(), got.vector) == model_values(event)
    assert DECODER.decode(record.value, None) == got  # headers are optional


@pytest.mark.parametrize(
    ("label", "change"),
    [
        ("older schema version", {"schema_version": 1}),
        ("version as float", {"schema_version": 2.0}),
        ("uppercase uuid", {"event_id": EID.upper()}),
        ("uuid without hyphens", {"event_id": EID.replace("-", "")}),
        ("space instead of T", {"occurred_at": "2025-01-31 09:30:00Z"}),
        ("naive time", {"occurred_at": "2025-01-31T09:30:00"}),
        ("seven fraction digits", {"occurred_at": "2025-01-31T09:30:00.1234567Z"}),
        ("priority as float", {"priority": 70.0}),
        ("priority as bool", {"priority": True}),
        ("priority out of range", {"priority": 101}),
        ("explicit null default", {"memory_type": None}),
        ("null entities", {"entities": None}),
        ("vector of another model", {"embedding": {"model": "other", "dim": DIM, "data": encode_vector(VECTOR)}}),
        ("unknown field", {"colour": "red"}),
        ("blank content", {"content": " \t "}),
        ("control character", {"content": "a\x00b"}),
        ("wrong hash", {"content_hash": "sha256:" + "0" * 64}),
        ("end before start", {"timestamp_end": "2025-01-01T00:00:00Z"}),
        ("bad id", {"memory_id": "has space"}),
        ("id holding a newline", {"memory_id": "a\nb"}),
        ("source id holding a newline", {"source_message_ids": ["msg-1", "a\nb"]}),
        ("scope id holding a newline", {"scope": {"team_id": "acme\nu-1"}}),
        ("NaN in metadata", {"metadata": {"x": float("nan")}}),
        ("bad provenance", {"provenance": {"method": "magic"}}),
        ("non-finite vector", {"embedding": {"model": MODEL, "dim": DIM, "data": encode_vector([1.0, float("inf"), 0.0])}}),
    ],
)
def test_unusual_or_invalid_bodies_go_to_the_model(label: str, change: dict[str, Any]) -> None:
    body = {**canonical(), **change}
    assert fast(body) is None, label


@pytest.mark.parametrize(
    "headers",
    [[("memstream-type", b"MemoryLinked")], [("memstream-schema-version", b"1")],
     [("content-type", b"text/plain")], [("memstream-type", None)],
     [("memstream-type", b"MemoryAdded"), ("memstream-type", b"MemoryLinked")]],
)
def test_odd_headers_go_to_the_general_path(headers: Any) -> None:
    assert fast(canonical(), headers) is None
    assert fast(canonical(), [("x-trace", b"1"), *HEADERS]) is not None  # others are ignored


def test_oversized_and_non_json_records_go_to_the_general_path() -> None:
    big = {**canonical(), "metadata": {"pad": "x" * 1_100_000}}
    assert fast(big) is None
    assert DECODER.decode(b"\xff\xfe", HEADERS) is None
    assert DECODER.decode(b'{"content": "\\ud800"}', HEADERS) is None
    assert DECODER.decode(None, HEADERS) is None


@pytest.mark.parametrize("dim", [1, 2, 3, 4, 5])
def test_vectors_of_any_dimension_agree_with_the_codec(dim: int) -> None:
    decoder = FastMemoryDecoder(MODEL, dim)  # dims 1, 2, 4, 5: base64 with padding
    values = [float(i) + 0.5 for i in range(dim)]
    body = {**canonical(), "embedding": {"model": MODEL, "dim": dim, "data": encode_vector(values)}}
    got = decoder.decode(wire(body), HEADERS)
    assert got is not None
    matrix, ok = decoder.vectors([got, got])
    assert ok.all() and matrix.tolist() == [values, values]


@pytest.mark.parametrize(
    "data",
    ["AAAA" * 3, "AAAAAAAAAAA", "AAAAAAAAAAA=", "AAAAAAAAAAAAAAAA====", "AAAA AAAAAAAA", "AAAA\nAAAAAAAA",
     "AAAAAA=AAAAA", "____AAAAAAAA", "-_AAAAAAAAAA", "AAAAAAAAAAAAAAA="],
)
def test_base64_the_codec_refuses_is_refused(data: str) -> None:
    body = {**canonical(), "embedding": {"model": MODEL, "dim": DIM, "data": data}}
    assert fast(body) is None
    with pytest.raises(DecodeError):
        decode_record(wire(body), HEADERS)


def test_a_batch_with_one_bad_vector_flags_only_that_row() -> None:
    good = fast(canonical())
    assert good is not None
    bad = good._replace(vector=np.array([1.0, np.nan, 0.0], dtype="<f4").tobytes())
    matrix, ok = DECODER.vectors([good, bad, good])
    assert ok.tolist() == [True, False, True]
    assert matrix[0].tolist() == VECTOR


@pytest.mark.parametrize(
    "when",
    ["2025-01-31T24:00:00Z", "2025-01-31T23:59:60Z", "2025-02-30T00:00:00Z", "2025-01-31T09:30:00+24:00",
     "2025-01-31T09:30:00-00:00", "0001-01-01T00:30:00+01:00", "9999-12-31T23:30:00-01:00",
     "2025-01-31T09:30:00.5Z", "2025-01-31T09:30:00.000001+05:45"],
)
def test_edge_times_agree_with_the_model(when: str) -> None:
    assert_agrees({**canonical(), "occurred_at": when, "recorded_at": None})


@pytest.mark.parametrize(
    "times",
    [{"recorded_at": T0, "timestamp": T0, "timestamp_start": T0, "timestamp_end": T0},
     {"recorded_at": T0, "timestamp": "2025-01-31T10:30:00+01:00", "timestamp_start": None, "timestamp_end": None},
     {"recorded_at": "2025-02-01T00:00:00Z", "timestamp": None, "timestamp_start": T0, "timestamp_end": "2025-02-01T00:00:00Z"}],
)
def test_times_equal_to_occurred_at_or_not_agree_with_the_model(times: dict[str, Any]) -> None:
    # the reader reuses occurred_at's parsed value for an equal time field
    got = assert_agrees({**canonical(), "occurred_at": T0, **times})
    assert got is not None


def test_the_wire_provenance_has_the_models_fields_and_defaults() -> None:
    from memstream.domain.events import Provenance

    # decoded from an empty object, the wire form dumps as the model's defaults
    assert fast({**canonical(), "provenance": {}}).values.provenance == Provenance().model_dump(mode="json")  # type: ignore[union-attr]


def test_the_wire_structs_are_the_models_fields() -> None:
    struct = FastDecoder(MemoryAdded).struct
    assert sorted(struct.__struct_fields__) == sorted(MemoryAdded.model_fields)


def test_a_field_added_to_the_model_is_read_without_a_change_here() -> None:
    from memstream.domain.events import Label

    class Extended(MemoryAdded):
        colour: Label | None = None
        tags: tuple[Label, ...] = ()

    decoder = FastDecoder(Extended)
    body = {**canonical(), "colour": "blue", "tags": ["a", "b"]}
    del body["embedding"]
    got = decoder.decode(wire(body), None)
    assert got is not None and got.colour == "blue" and got.tags == ["a", "b"]
    assert got.as_dict() == event_values(Extended.model_validate({**body, "recorded_at": body["recorded_at"]}))
    assert decoder.decode(wire({**body, "colour": "a\nb"}), None) is None  # the model's rule, derived
    assert decoder.decode(wire({**body, "colour": 3}), None) is None


def test_a_rule_it_cannot_derive_stops_the_import() -> None:
    from pydantic import field_validator

    class Odd(MemoryAdded):
        colour: str = ""

        @field_validator("colour", mode="after")
        @classmethod
        def _upper(cls, v: str) -> str:
            return v.upper()

    with pytest.raises(TypeError, match="cannot derive"):
        FastDecoder(Odd)


FULL_PROVENANCE = {
    "method": "llm", "prompt_id": "extract", "prompt_version": "3", "prompt_sha256": "ab" * 32,
    "model": "gpt", "input_refs": ["memstream.messages:0:1", "memstream.messages:0:2"],
    "output_refs": ["mem-1"], "latency_ms": 12, "token_usage": {"prompt": 10, "completion": 0},
    "status": "ok+judgment_failed", "decisions": [{"memory_id": "m", "action": "store", "n": [1, 2.5, None]}],
    "note": "line one\nline two",
}


@pytest.mark.parametrize(
    "change",
    [{}, {"latency_ms": 0.5}, {"latency_ms": None}, {"decisions": []}, {"note": None}, {"input_refs": []}],
)
def test_provenance_in_the_writers_forms_takes_the_fast_path(change: dict[str, Any]) -> None:
    assert assert_agrees({**canonical(), "provenance": {**FULL_PROVENANCE, **change}}) is not None


@pytest.mark.parametrize(
    "change",
    [{"latency_ms": True}, {"latency_ms": -1}, {"latency_ms": "12"}, {"token_usage": {"p": -1}},
     {"token_usage": {"p": True}}, {"token_usage": {"a\x01": 1}}, {"method": "oracle"}, {"method": None},
     {"status": "x" * 201}, {"status": None}, {"model": "a\nb"}, {"input_refs": ["ok", "bad\nref"]},
     {"output_refs": [""]}, {"output_refs": ["r" * 513]}, {"note": "n" * 2001}, {"decisions": [1]},
     {"decisions": {"a": 1}}, {"extra": 1}],
)
def test_provenance_the_model_refuses_is_left_to_it(change: dict[str, Any]) -> None:
    body = {**canonical(), "provenance": {**FULL_PROVENANCE, **change}}
    with pytest.raises(DecodeError):
        decode_record(wire(body), HEADERS)
    assert fast(body) is None


# --- generated bodies ---------------------------------------------------------------

TRICKY = [None, True, 0, 1, -1, 50, 100, 101, 2.0, float("inf"), "", " ", "x", "a b", "a\nb", "a\x01b",
          "persona", "PERSONA", "preference", "Episode", "place", T0, EID, "2025-01-31T09:30:00",
          "2025-01-31T09:30:00+02:00", "x" * 129, "y" * 600, [], {}, ["msg-1"], ["bad id"],
          [{"name": "n"}], [{"name": "n", "kind": 3}], [{"name": " "}], {"team_id": "t"},
          {"team_id": "t", "user_id": None}, {"a": [1, {"b": None}]}]
json_values = json_values_of(TRICKY, list(canonical()))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_bodies_never_pass_what_the_model_refuses(data: st.DataObject) -> None:
    assert_agrees(mutate(data, canonical(), json_values))


texts, ids, times = event_strategies()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=texts, scene=st.none() | texts, mid=ids, team=ids, when=times, kind=st.text(max_size=12),
       name=texts, priority=st.integers(0, 100), meta=st.dictionaries(st.text(max_size=5), json_values, max_size=3))
def test_generated_events_round_trip_through_the_wire_agree(
    content: str, scene: str | None, mid: str, team: str, when: datetime, kind: str, name: str,
    priority: int, meta: dict[str, Any],
) -> None:
    body = {**canonical(), "content": content, "scene": scene, "memory_id": mid,
            "scope": {"team_id": team}, "occurred_at": when.isoformat(), "priority": priority,
            "entities": [{"name": name, "kind": kind}], "metadata": meta}
    if assert_agrees(body) is None:
        # Left to the general path: then either it refuses too, or the record is in a
        # form the fast path leaves to it on purpose (and that form is rare).
        try:
            decode_record(wire(body), HEADERS)
        except DecodeError:
            return
        # The generated times that take this road carry an offset with seconds
        # (historic zones), a form the check leaves to the model.
        assert re.search(r"[+-]\d\d:\d\d:\d\d(\.\d+)?$", body["occurred_at"]), body["occurred_at"]


def test_a_values_record_holds_exactly_the_event_values_in_their_order() -> None:
    from memstream.codec.values import record_type, value_names

    event = MemoryAdded(scope=Scope(team_id="t", user_id="u", agent_id="a"), memory_id="m-1", content="x")
    record_cls = record_type(MemoryAdded)
    assert record_cls.names == value_names(MemoryAdded) and "embedding" not in record_cls.names
    record = record_cls()
    for name, value in event_values(event).items():
        setattr(record, name, value)
    assert record.as_dict() == event_values(event) and list(record.as_dict()) == list(value_names(MemoryAdded))
    other = record_cls()
    for name, value in event_values(event).items():
        setattr(other, name, value)
    assert other == record
    other.content = "y"
    assert other != record
    with pytest.raises(AttributeError):
        record.colour = "blue"  # type: ignore[attr-defined]  # slots: no stray value
    # A decoder process sends records to the projector's process.
    assert pickle.loads(pickle.dumps(record)) == record
    with pytest.raises(TypeError):
        hash(record)


def test_tuples_of_reads_the_named_values_of_each_record_in_order() -> None:
    from memstream.codec.values import record_type, tuples_of

    record_cls = record_type(MemoryAdded)
    records = []
    for i in range(3):
        event = MemoryAdded(scope=Scope(team_id="t", user_id=f"u{i}", agent_id="a"), memory_id=f"m-{i}", content=f"x{i}")
        record = record_cls()
        for name, value in event_values(event).items():
            setattr(record, name, value)
        records.append(record)
    names = ("memory_id", "user_id", "content")
    assert tuples_of(record_cls, names)(records) == [tuple(r.as_dict()[n] for n in names) for r in records]
    with pytest.raises(ValueError, match="colour"):
        tuples_of(record_cls, ("memory_id", "colour"))
