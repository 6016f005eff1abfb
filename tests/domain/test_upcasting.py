"""The upcasting seam: old ``schema_version``s become current on read, in one place."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from memstream.domain.content import content_hash
from memstream.domain.events import (
    CURRENT_SCHEMA_VERSIONS,
    EventValidationError,
    MemoryAdded,
    MemoryType,
    parse_event,
)
from memstream.domain.upcasting import UPCASTERS, UpcastError, Upcaster, upcast

V1_MEMORY: dict[str, Any] = {
    "type": "MemoryAdded",
    "schema_version": 1,
    "event_id": "6c1d3a52-0a8e-4f7e-8f35-2b1b9f0d7e11",
    "occurred_at": "2024-06-01T08:00:00+02:00",
    "scope": {"team_id": "acme", "user_id": "ada"},
    "memory_id": "mem-legacy",
    "content": "Ada prefers tea over coffee.",
    "kind": "preference",
    "priority": 60,
}


def test_v1_memory_added_is_read_as_v2() -> None:
    original = copy.deepcopy(V1_MEMORY)
    event = parse_event(V1_MEMORY, require_envelope=True)
    assert isinstance(event, MemoryAdded)
    assert event.schema_version == 2
    assert event.memory_type is MemoryType.persona  # "kind", with its legacy name
    assert event.scene is None
    assert event.priority == 60
    assert event.content_hash == content_hash(V1_MEMORY["content"])
    assert V1_MEMORY == original  # the input is never mutated


def test_v1_without_a_version_field_counts_as_v1() -> None:
    raw = {k: v for k, v in V1_MEMORY.items() if k != "schema_version"}
    raw["kind"] = "episode"
    event = parse_event(raw)
    assert isinstance(event, MemoryAdded)
    assert event.schema_version == 2 and event.memory_type is MemoryType.episodic


def test_v1_upcast_is_idempotent_with_the_v2_reading() -> None:
    v2 = parse_event(V1_MEMORY, require_envelope=True)
    again = parse_event(v2.model_dump(mode="json"), require_envelope=True)
    assert again == v2


def test_v1_with_both_kind_and_memory_type_is_refused() -> None:
    raw = {**V1_MEMORY, "memory_type": "persona"}
    with pytest.raises(EventValidationError, match="both kind and memory_type"):
        parse_event(raw)


def test_kind_is_an_unknown_field_in_v2() -> None:
    raw = {**V1_MEMORY, "schema_version": 2}
    with pytest.raises(EventValidationError, match="kind: unknown field"):
        parse_event(raw)


def test_a_version_newer_than_the_reader_is_refused_clearly() -> None:
    raw = {**V1_MEMORY, "schema_version": 3}
    raw.pop("kind")
    with pytest.raises(EventValidationError) as info:
        parse_event(raw)
    assert info.value.reason == (
        "schema_version 3 of MemoryAdded is newer than this reader's (2); upgrade memstream to read it"
    )


def test_an_absurdly_new_version_does_not_break_the_message() -> None:
    with pytest.raises(EventValidationError, match="much larger number"):
        parse_event({**V1_MEMORY, "schema_version": 10**5000})


@pytest.mark.parametrize("version", ["2", 2.0, True, None, 0, -1, [2]])
def test_malformed_versions_are_refused(version: Any) -> None:
    with pytest.raises(EventValidationError, match="schema_version must be"):
        parse_event({**V1_MEMORY, "schema_version": version})


def test_a_current_event_passes_through_unchanged() -> None:
    raw = {"type": "MemoryLinked", "schema_version": 1, "x": 1}
    assert upcast(raw, 1) is raw
    assert upcast({"type": "MemoryLinked"}, 1) == {"type": "MemoryLinked", "schema_version": 1}


def test_every_version_gap_has_a_registered_step() -> None:
    for etype, current in CURRENT_SCHEMA_VERSIONS.items():
        for version in range(1, current):
            assert (etype, version) in UPCASTERS, f"{etype} v{version} -> v{version + 1} missing"


def test_a_missing_step_is_an_error_not_a_skip() -> None:
    with pytest.raises(UpcastError, match="no upcaster registered for Thing v1 -> v2"):
        upcast({"type": "Thing", "schema_version": 1}, 2, steps={})


def test_steps_chain_in_order() -> None:
    def one_to_two(raw: dict[str, Any]) -> dict[str, Any]:
        return {**raw, "trail": raw.get("trail", "") + "a", "schema_version": 2}

    def two_to_three(raw: dict[str, Any]) -> dict[str, Any]:
        return {**raw, "trail": raw["trail"] + "b", "schema_version": 3}

    steps: dict[tuple[str, int], Upcaster] = {("Thing", 1): one_to_two, ("Thing", 2): two_to_three}
    assert upcast({"type": "Thing"}, 3, steps) == {"type": "Thing", "schema_version": 3, "trail": "ab"}
    assert upcast({"type": "Thing", "schema_version": 2, "trail": "x"}, 3, steps)["trail"] == "xb"
