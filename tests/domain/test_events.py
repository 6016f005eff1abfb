"""The event model's validation: every documented rule, its one-line reason, and a fuzz
proving that nothing but :class:`EventValidationError` ever escapes ``parse_event``."""

from __future__ import annotations

import copy
import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support import json_paths

from memstream.domain.content import content_hash
from memstream.domain.embedding import encode_vector
from memstream.domain.events import (
    CURRENT_SCHEMA_VERSIONS,
    EVENT_CLASSES,
    EVENT_TYPES,
    MAX_MEMORY_CHARS,
    MAX_MESSAGE_CHARS,
    DecisionRecorded,
    EmbeddingPayload,
    EventBase,
    EventValidationError,
    MemoryAdded,
    MemoryType,
    Provenance,
    Scope,
    new_event_id,
    parse_event,
)

SCOPE = {"team_id": "acme", "user_id": "u-1", "agent_id": "planner"}
T0 = "2025-01-31T09:30:00Z"
EID = "0b7e3c8e-5f0a-4c1e-9d2a-1f2e3d4c5b6a"


def valid_raw() -> dict[str, dict[str, Any]]:
    """One valid wire-shaped event per type (fresh copies on every call)."""
    env = {"event_id": EID, "occurred_at": T0, "recorded_at": T0, "scope": dict(SCOPE)}
    return {
        "MessageObserved": {
            **env, "type": "MessageObserved", "schema_version": 1, "message_id": "msg-1",
            "role": "user", "speaker": "Ada", "content": "I moved to Lisbon last week.",
            "metadata": {"channel": "chat", "n": [1, 2.5, None, True, {"x": "y"}]},
        },
        "MemoryAdded": {
            **env, "type": "MemoryAdded", "schema_version": 2, "memory_id": "mem-1",
            "content": "Ada lives in Lisbon.", "memory_type": "persona", "priority": 70,
            "scene": "relocation\nsecond line", "source_message_ids": ["msg-1"],
            "timestamp": T0, "timestamp_start": "2025-01-20T00:00:00+01:00",
            "timestamp_end": "2025-01-31T00:00:00+01:00",
            "entities": [{"name": "Lisbon", "kind": "place"}, {"name": "Ada", "kind": "person"}],
            "metadata": {"source": "chat"},
            "embedding": {"model": "mini", "dim": 3, "data": encode_vector([0.5, -1.0, 2.0])},
            "provenance": {
                "method": "llm", "prompt_id": "extract", "prompt_version": "3", "model": "m",
                "input_refs": ["memstream.messages:0:12"], "latency_ms": 12.5,
                "token_usage": {"prompt": 10, "completion": 5},
                "decisions": [{"action": "add", "score": 0.9}],
            },
        },
        "MemoryLinked": {
            **env, "type": "MemoryLinked", "schema_version": 1, "link_id": "l-1",
            "from_memory_id": "mem-2", "to_memory_id": "mem-1", "relation": "supersedes",
            "decided_by": "llm", "reason": "newer address",
        },
        "DecisionRecorded": {
            **env, "type": "DecisionRecorded", "schema_version": 1, "decision_id": "d-1",
            "subject": "ACME", "rating": "overweight", "decision_text": "Buy on weakness.",
            "horizon_days": 5, "deadline": "2025-02-07T09:30:00-05:00",
        },
        "OutcomeObserved": {
            **env, "type": "OutcomeObserved", "schema_version": 1, "outcome_id": "o-1",
            "decision_id": "d-1", "subject": "ACME", "raw_return": 0.031,
            "benchmark_return": 0.01, "alpha": 0.021, "horizon_days": 5,
            "window_start": T0, "window_end": "2025-02-07T09:30:00Z", "source": "prices",
        },
        "MemoryReflected": {
            **env, "type": "MemoryReflected", "schema_version": 1, "reflection_id": "r-1",
            "decision_id": "d-1", "outcome_id": "o-1", "subject": "ACME",
            "rating": "overweight", "decision_text": "Buy on weakness.", "raw_return": 0.031,
            "alpha": 0.021, "correct": True, "content": "The call was right. Momentum held.",
            "lesson": "Trust momentum.", "templated": False,
        },
        "DecisionExpired": {
            **env, "type": "DecisionExpired", "schema_version": 1, "decision_id": "d-2",
            "subject": "ACME", "deadline": T0,
        },
        "SubjectForgotten": {
            **env, "type": "SubjectForgotten", "schema_version": 1, "whole_team": False,
            "key_ids": ["0123456789abcdef0123456789abcdef"],
        },
    }


def reason_for(raw: Any, **kw: Any) -> str:
    with pytest.raises(EventValidationError) as info:
        parse_event(raw, **kw)
    reason = info.value.reason
    assert "\n" not in reason and "\r" not in reason, reason
    assert str(info.value) == reason
    return reason


def with_(etype: str, **changes: Any) -> dict[str, Any]:
    raw = valid_raw()[etype]
    for key, value in changes.items():
        if value is _DELETE:
            raw.pop(key, None)
        else:
            raw[key] = value
    return raw


_DELETE = object()


# --- valid events ----------------------------------------------------------------------


def test_every_event_type_has_a_valid_sample() -> None:
    assert set(valid_raw()) == set(EVENT_TYPES) == {c.model_fields["type"].default for c in EVENT_CLASSES}


@pytest.mark.parametrize("etype", sorted(EVENT_TYPES))
def test_valid_events_parse_and_round_trip_through_json(etype: str) -> None:
    event = parse_event(valid_raw()[etype], require_envelope=True)
    assert type(event) is EVENT_TYPES[etype]
    assert event.schema_version == CURRENT_SCHEMA_VERSIONS[etype]
    wire = json.loads(json.dumps(event.model_dump(mode="json")))
    assert parse_event(wire, require_envelope=True) == event


def test_times_are_stored_in_utc() -> None:
    event = parse_event(valid_raw()["DecisionRecorded"])
    assert isinstance(event, DecisionRecorded)
    assert event.deadline == datetime(2025, 2, 7, 14, 30, tzinfo=timezone.utc)
    assert event.deadline.utcoffset() == timedelta(0)
    added = parse_event(valid_raw()["MemoryAdded"])
    assert isinstance(added, MemoryAdded)
    assert added.timestamp_start == datetime(2025, 1, 19, 23, 0, tzinfo=timezone.utc)


def test_memory_added_fills_the_content_hash_and_checks_a_given_one() -> None:
    event = parse_event(valid_raw()["MemoryAdded"])
    assert isinstance(event, MemoryAdded)
    assert event.content_hash == content_hash("Ada lives in Lisbon.")
    same = parse_event(with_("MemoryAdded", content_hash=content_hash("  ADA lives in lisbon. ")))
    assert same == event
    reason = reason_for(with_("MemoryAdded", content_hash=content_hash("something else")))
    assert "content_hash" in reason and "does not match" in reason


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("preference", MemoryType.persona),
        ("episode", MemoryType.episodic),
        ("instruct", MemoryType.instruction),
        ("Preference", MemoryType.persona),
        ("WORK-FACT", MemoryType.work_fact),
        ("work task", MemoryType.work_task),
        ("work_artifact", MemoryType.work_artifact),
    ],
)
def test_memory_types_parse_leniently_with_legacy_names(given: str, expected: MemoryType) -> None:
    assert MemoryType.parse(given) is expected
    event = parse_event(with_("MemoryAdded", memory_type=given))
    assert isinstance(event, MemoryAdded) and event.memory_type is expected


def test_content_limits_are_inclusive() -> None:
    at_limit = "x" * MAX_MEMORY_CHARS
    assert isinstance(parse_event(with_("MemoryAdded", content=at_limit)), MemoryAdded)
    message = parse_event(with_("MessageObserved", content="y" * MAX_MESSAGE_CHARS))
    assert len(message.content) == MAX_MESSAGE_CHARS  # type: ignore[attr-defined]


def test_tab_newline_and_carriage_return_are_kept_in_content() -> None:
    text = "line one\r\n\tline two\n"
    event = parse_event(with_("MemoryAdded", content=text))
    assert event.content == text  # type: ignore[attr-defined]


def test_numbers_accept_integral_floats_and_ints_for_floats() -> None:
    event = parse_event(with_("MemoryAdded", priority=70.0))
    assert event.priority == 70  # type: ignore[attr-defined]
    outcome = parse_event(with_("OutcomeObserved", raw_return=1))
    assert outcome.raw_return == 1.0  # type: ignore[attr-defined]


def test_metadata_tuples_are_stored_as_json_arrays() -> None:
    event = MemoryAdded(
        scope=Scope(team_id="acme"), memory_id="m", content="c",
        metadata={"tags": ("a", ("b", {"c": (1,)}))},
        provenance={"decisions": ({"ids": ("x", "y")},)},  # type: ignore[arg-type]
    )
    assert event.metadata == {"tags": ["a", ["b", {"c": [1]}]]}
    assert event.provenance is not None and event.provenance.decisions[0] == {"ids": ["x", "y"]}
    assert parse_event(json.loads(event.model_dump_json())) == event


def test_unknown_entity_kinds_become_other() -> None:
    event = parse_event(with_("MemoryAdded", entities=[{"name": "Kafka", "kind": "software"}]))
    assert event.entities[0].kind == "other"  # type: ignore[attr-defined]


def test_embedding_payload_round_trips_a_vector() -> None:
    payload = EmbeddingPayload.from_vector("mini", [0.25, -3.5, 1e-3])
    assert payload.dim == 3
    assert payload.to_vector()[:2] == [0.25, -3.5]


# --- every documented rejection, with its reason ----------------------------------------

LONG_ID = "a" * 129
REJECTIONS: list[tuple[str, Any, str]] = [
    # (label, raw event, a fragment the one-line reason must contain)
    ("not an object", [1, 2], "must be a JSON object, got list"),
    ("unknown type", with_("MemoryAdded", type="MemoryDeleted"), "unknown event type 'MemoryDeleted'"),
    ("missing type", with_("MemoryAdded", type=_DELETE), "unknown event type None"),
    ("type not a string", with_("MemoryAdded", type=["MemoryAdded"]), "unknown event type"),
    ("missing scope", with_("MemoryAdded", scope=_DELETE), "scope: missing"),
    ("null scope", with_("MemoryAdded", scope=None), "scope: missing"),
    ("empty scope", with_("MemoryAdded", scope={}), "scope: missing"),
    ("scope without team", with_("MemoryAdded", scope={"user_id": "u"}), "scope.team_id: missing"),
    ("scope not an object", with_("MemoryAdded", scope="acme"), "scope: must be a JSON object"),
    ("naive time", with_("MemoryAdded", occurred_at="2025-01-31T09:30:00"), "occurred_at: needs a UTC offset"),
    ("naive nested time", with_("MemoryAdded", timestamp="2025-01-31 09:30"), "timestamp: needs a UTC offset"),
    ("unparsable time", with_("MemoryAdded", recorded_at="last tuesday"), "recorded_at: is not an ISO 8601"),
    ("epoch number time", with_("MemoryAdded", occurred_at=1738315800), "occurred_at: must be an ISO 8601"),
    ("epoch string time", with_("MemoryAdded", occurred_at="1738315800"), "not a number"),
    ("time overflows in UTC", with_("DecisionExpired", deadline="9999-12-31T23:00:00-05:00"), "deadline: is out of the representable range"),
    ("empty content", with_("MemoryAdded", content=""), "content: is empty"),
    ("blank content", with_("MemoryAdded", content=" \n\t "), "content: is empty"),
    ("oversized memory", with_("MemoryAdded", content="x" * (MAX_MEMORY_CHARS + 1)), f"content: is {MAX_MEMORY_CHARS + 1} characters; the limit is {MAX_MEMORY_CHARS}"),
    ("oversized message", with_("MessageObserved", content="x" * (MAX_MESSAGE_CHARS + 1)), f"the limit is {MAX_MESSAGE_CHARS}"),
    ("NUL in content", with_("MemoryAdded", content="a\x00b"), "content: holds control character U+0000 at position 1"),
    ("escape in content", with_("MessageObserved", content="\x1b[31mred"), "U+001B"),
    ("surrogate in content", with_("MemoryAdded", content="a\ud800"), "unpaired surrogate U+D800"),
    ("newline in a one-line field", with_("MessageObserved", speaker="Ada\nBob"), "speaker: holds control character U+000A"),
    ("content not a string", with_("MemoryAdded", content=42), "content: must be a string, got int"),
    ("unknown memory type", with_("MemoryAdded", memory_type="gossip"), "memory_type: unknown memory type 'gossip'"),
    ("priority above 100", with_("MemoryAdded", priority=101), "priority: must be <= 100, got 101"),
    ("priority below 0", with_("MemoryAdded", priority=-1), "priority: must be >= 0, got -1"),
    ("priority huge", with_("MemoryAdded", priority=10**5000), "priority: must be <= 100"),
    ("priority as string", with_("MemoryAdded", priority="50"), "priority: must be a number, got str"),
    ("priority as bool", with_("MemoryAdded", priority=True), "priority: must be a number, got bool"),
    ("priority fractional", with_("MemoryAdded", priority=50.5), "priority"),
    ("embedding bad base64", with_("MemoryAdded", embedding={"model": "m", "dim": 1, "data": "!!!!!!!="}), "embedding: embedding data is not valid base64"),
    ("embedding wrong length", with_("MemoryAdded", embedding={"model": "m", "dim": 4, "data": encode_vector([1.0, 2.0, 3.0])}), "dimension 4 needs"),
    ("embedding NaN", with_("MemoryAdded", embedding={"model": "m", "dim": 2, "data": encode_vector([1.0, float("nan")])}), "embedding: embedding holds NaN or infinite values"),
    ("embedding infinity", with_("MemoryAdded", embedding={"model": "m", "dim": 1, "data": encode_vector([float("inf")])}), "NaN or infinite"),
    ("embedding dim zero", with_("MemoryAdded", embedding={"model": "m", "dim": 0, "data": ""}), "embedding.dim: must be >= 1"),
    ("embedding dim string", with_("MemoryAdded", embedding={"model": "m", "dim": "3", "data": encode_vector([1.0, 2.0, 3.0])}), "embedding.dim: must be a number"),
    ("embedding data not text", with_("MemoryAdded", embedding={"model": "m", "dim": 1, "data": 5}), "embedding.data: must be a string"),
    ("metadata NaN", with_("MemoryAdded", metadata={"score": float("nan")}), "metadata: holds a non-finite number"),
    ("metadata not JSON", with_("MemoryAdded", metadata={"when": datetime(2025, 1, 1)}), "metadata.when"),
    ("metadata not an object", with_("MessageObserved", metadata=[1]), "metadata"),
    ("unknown field", with_("MemoryAdded", colour="blue"), "colour: unknown field"),
    ("id with a space", with_("MemoryAdded", memory_id="mem 1"), "memory_id: is not an id"),
    ("id with a control char", with_("MemoryAdded", memory_id="mem\x00"), "memory_id: is not an id"),
    ("id with a trailing newline", with_("MemoryAdded", memory_id="mem\n"), "memory_id: is not an id"),
    ("id too long", with_("MemoryAdded", memory_id=LONG_ID), "memory_id: is 129 characters; the limit is 128"),
    ("empty id", with_("MemoryAdded", memory_id=""), "memory_id: is empty"),
    ("bad event id", with_("MemoryAdded", event_id="not-a-uuid"), "event_id: is not a UUID"),
    ("end before start", with_("MemoryAdded", timestamp_start="2025-01-02T00:00:00Z", timestamp_end="2025-01-01T00:00:00Z"), "timestamp_end is before timestamp_start"),
    ("self link", with_("MemoryLinked", to_memory_id="mem-2"), "cannot link to itself"),
    ("unknown relation", with_("MemoryLinked", relation="likes"), "relation"),
    ("return NaN", with_("OutcomeObserved", raw_return=float("nan")), "raw_return: must be a finite number"),
    ("return too large", with_("OutcomeObserved", alpha=10**400), "alpha: is out of range"),
    ("window reversed", with_("OutcomeObserved", window_start="2025-03-01T00:00:00Z"), "window_end is before window_start"),
    ("unknown rating", with_("DecisionRecorded", rating="strong buy"), "rating"),
    ("bool as string", with_("MemoryReflected", correct="yes"), "correct: must be true or false, got str"),
    ("bool as number", with_("MemoryReflected", templated=1), "templated: must be true or false, got int"),
    ("newer schema version", with_("MemoryAdded", schema_version=3), "newer than this reader"),
    ("schema version not int", with_("MemoryAdded", schema_version="2"), "schema_version must be an integer"),
    ("schema version zero", with_("MemoryAdded", schema_version=0), "schema_version must be >= 1"),
    ("non-string field name", {**valid_raw()["MemoryAdded"], 7: "x"}, "field names must be strings"),
]


@pytest.mark.parametrize(("label", "raw", "fragment"), REJECTIONS, ids=[r[0] for r in REJECTIONS])
def test_rejections_have_clear_one_line_reasons(label: str, raw: Any, fragment: str) -> None:
    reason = reason_for(copy.deepcopy(raw))
    assert fragment in reason, f"{label}: {reason!r}"
    assert len(reason) < 600, reason


def test_validation_error_is_a_value_error_with_a_reason() -> None:
    with pytest.raises(ValueError):
        parse_event({"type": "nope"})
    err = EventValidationError("a\nb")
    assert err.reason == "a\\x0ab"


def test_reasons_stay_short_and_one_line_for_hostile_input() -> None:
    huge_key = "k\n" * 10_000
    reason = reason_for({**valid_raw()["MemoryAdded"], huge_key: 1})
    assert len(reason) < 300
    reason = reason_for({"type": "x" * 100_000, "scope": SCOPE})
    assert len(reason) < 300
    many = {**valid_raw()["MemoryAdded"], **{f"extra{i}": i for i in range(50)}}
    reason = reason_for(many)
    assert reason.endswith("and 47 more")


def test_reasons_never_echo_content() -> None:
    secret = "my password is hunter2"
    reason = reason_for(with_("MemoryAdded", content=secret + "\x00"))
    assert "hunter2" not in reason


# --- the envelope on the read path ------------------------------------------------------


def test_require_envelope_refuses_events_without_their_own_identity() -> None:
    assert "event_id: missing" in reason_for(with_("MemoryAdded", event_id=_DELETE), require_envelope=True)
    assert "occurred_at: missing" in reason_for(with_("MemoryAdded", occurred_at=_DELETE), require_envelope=True)


def test_require_envelope_makes_reads_deterministic() -> None:
    raw = with_("MemoryAdded", recorded_at=_DELETE)
    first = parse_event(raw, require_envelope=True)
    second = parse_event(raw, require_envelope=True)
    assert first == second
    assert first.recorded_at == first.occurred_at
    # The lenient producer path assigns fresh defaults on each call, which is why the
    # log's read path must not use it for records missing their identity.
    lenient = with_("MemoryAdded", event_id=_DELETE)
    assert parse_event(lenient).event_id != parse_event(lenient).event_id


def test_producer_defaults_fill_the_envelope() -> None:
    event = MemoryAdded(scope=Scope(team_id="acme"), memory_id="m", content="hello")
    assert isinstance(event.event_id, uuid.UUID)
    assert event.occurred_at.tzinfo is not None and event.recorded_at.utcoffset() == timedelta(0)
    assert event.scope.space == "acme/default"


def test_events_are_frozen() -> None:
    event = parse_event(valid_raw()["MemoryAdded"])
    with pytest.raises(ValueError):
        event.content = "changed"  # type: ignore[misc]


# --- fuzz: junk in, EventValidationError out ---------------------------------------------

FIELD_NAMES = sorted(
    {name for cls in EVENT_CLASSES for name in cls.model_fields}
    | {"team_id", "user_id", "agent_id", "model", "dim", "data", "name", "kind", "kind"}
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([2**63, -(2**63) - 1, 2**64])
    # huge ints (kept under Python's 4300-digit repr limit so hypothesis can print them;
    # the explicit rejection table covers 10**5000)
    | st.integers(19, 4000).map(lambda n: 10**n)
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from([T0, EID, "2025-01-31T09:30:00", "\x00", "\ud800", "persona", "MemoryAdded"])
)
keys = st.sampled_from(FIELD_NAMES) | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=25,
)
odd_python_values = st.sampled_from([b"bytes", (1, 2), {1, 2}, object(), 1j, float("nan"), datetime(2025, 1, 1)])


def _check_parse(raw: Any) -> None:
    """Either a valid event (which then survives a JSON round trip) or the one error."""
    try:
        event = parse_event(raw)
    except EventValidationError as exc:
        assert exc.reason and "\n" not in exc.reason
        return
    assert isinstance(event, EventBase)
    try:
        wire = json.loads(json.dumps(event.model_dump(mode="json"), allow_nan=False))
    except ValueError as exc:  # pragma: no cover - a failure here is the bug being hunted
        raise AssertionError(f"accepted event is not JSON: {exc}") from None
    assert parse_event(wire) == event


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(json_values | odd_python_values)
def test_fuzz_random_json_values_only_raise_the_validation_error(raw: Any) -> None:
    _check_parse(raw)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(etype=st.sampled_from(sorted(EVENT_TYPES)), body=st.dictionaries(keys, json_values | odd_python_values, max_size=8))
def test_fuzz_known_types_with_junk_bodies(etype: str, body: dict[Any, Any]) -> None:
    _check_parse({**body, "type": etype, "scope": body.get("scope", SCOPE)})


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), etype=st.sampled_from(sorted(EVENT_TYPES)))
def test_fuzz_mutations_of_valid_events(data: st.DataObject, etype: str) -> None:
    raw = valid_raw()[etype]
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = json_paths(raw)
        path = data.draw(st.sampled_from(paths), label="path")
        parent: Any = raw
        for part in path[:-1]:
            parent = parent[part]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]), label="action")
        if action == "replace":
            parent[path[-1]] = data.draw(json_values | odd_python_values, label="value")
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[data.draw(keys, label="key")] = data.draw(json_values, label="value")
        else:
            parent.append(data.draw(json_values, label="value"))
    _check_parse(raw)


# --- event ids ---------------------------------------------------------------------------


def test_event_ids_are_random_version_4_uuids_never_repeated_across_threads() -> None:
    import threading

    drawn: list[list[uuid.UUID]] = [[] for _ in range(4)]

    def draw(out: list[uuid.UUID]) -> None:
        out.extend(new_event_id() for _ in range(2_000))  # several refills each

    threads = [threading.Thread(target=draw, args=(out,)) for out in drawn]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [i for out in drawn for i in out]
    assert len(set(ids)) == len(ids) == 8_000
    assert {i.version for i in ids} == {4} and {i.variant for i in ids} == {uuid.RFC_4122}


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")
def test_a_forked_child_draws_ids_its_parent_does_not() -> None:
    import os

    new_event_id()  # the parent holds drawn ids in its pool
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only draws ids and writes them out
        try:
            os.write(write, b"".join(new_event_id().bytes for _ in range(300)))
        finally:
            os._exit(0)
    os.close(write)
    raw = b""
    while chunk := os.read(read, 65536):
        raw += chunk
    os.close(read)
    os.waitpid(pid, 0)
    child = {uuid.UUID(bytes=raw[i : i + 16]) for i in range(0, len(raw), 16)}
    parent = {new_event_id() for _ in range(300)}
    assert len(child) == 300 and not child & parent


# --- provenance refs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("refs", "message"),
    [
        (["ok", "x\x01y"], "item 1 holds control character U+0001 at position 1"),
        (["ok", "fine", "  "], "item 2 is empty"),
        (["a" * 513], "item 0 is 513 characters; the limit is 512"),
        (["ok", "\ud800"], "item 1 holds an unpaired surrogate U+D800"),
        (["two\nlines"], "item 0 holds control character U+000A"),
    ],
)
def test_provenance_refs_are_checked_together_with_the_failing_item_named(refs: list[str], message: str) -> None:
    for field in ("input_refs", "output_refs"):
        with pytest.raises(ValidationError) as info:
            Provenance(**{field: refs})
        (error,) = info.value.errors()
        assert error["loc"] == (field,) and message in error["msg"]


def test_provenance_refs_accept_what_a_single_ref_accepts() -> None:
    refs = ["memstream.messages:0:12", "D3:14", "mem-" + "a" * 32, "x" * 512, "ünïcode ref ✓"]
    assert Provenance(input_refs=refs, output_refs=refs[::-1]).input_refs == tuple(refs)
    assert Provenance().input_refs == ()
