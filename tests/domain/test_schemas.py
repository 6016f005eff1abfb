"""The published JSON Schemas: committed files equal the generator's output, and the
schemas accept what the models accept (and refuse the documented violations)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from memstream.domain.embedding import encode_vector
from memstream.domain.events import (
    EVENT_CLASSES,
    MAX_MEMORY_CHARS,
    WIRE_REQUIRED_FIELDS,
    DecisionExpired,
    DecisionRecorded,
    EmbeddingPayload,
    Entity,
    EventBase,
    EventValidationError,
    MemoryAdded,
    MemoryLinked,
    MemoryReflected,
    MessageObserved,
    OutcomeObserved,
    Provenance,
    Scope,
    parse_event,
)
from memstream.domain.schemas import (
    INDEX_FILENAME,
    event_schema,
    generate_schemas,
    render,
    schema_filename,
)
from memstream.schemas_gen import find_drift, main, write_schemas

REPO_ROOT = Path(__file__).resolve().parents[2]
COMMITTED = REPO_ROOT / "schemas"
SCOPE = Scope(team_id="acme", user_id="ada", agent_id="planner")
T0 = "2025-01-31T09:30:00Z"


def validator_for(cls: type[EventBase]) -> Draft202012Validator:
    schema = json.loads((COMMITTED / schema_filename(cls)).read_text(encoding="utf-8"))
    return Draft202012Validator(schema)


def sample_events() -> list[EventBase]:
    return [
        MessageObserved(scope=SCOPE, message_id="msg-1", role="assistant", speaker="bot",
                        content="Noted:\n\tyou moved to Lisbon.", metadata={"a": [1, 2.5, None, {"b": True}]}),
        MemoryAdded(scope=SCOPE, memory_id="mem-1", content="Ada lives in Lisbon.",
                    memory_type="preference", priority=0, scene="move",  # type: ignore[arg-type]
                    source_message_ids=("msg-1",), timestamp=T0,  # type: ignore[arg-type]
                    entities=(Entity(name="Lisbon", kind="place"),),  # type: ignore[arg-type]
                    embedding=EmbeddingPayload.from_vector("mini", [0.1, 0.2]),
                    provenance=Provenance(method="llm", latency_ms=3, token_usage={"prompt": 3},
                                          decisions=({"op": "add"},))),
        MemoryAdded(scope=SCOPE, memory_id="mem-2", content="x" * MAX_MEMORY_CHARS, priority=100),
        MemoryLinked(scope=SCOPE, from_memory_id="mem-2", to_memory_id="mem-1", relation="duplicates"),  # type: ignore[arg-type]
        DecisionRecorded(scope=SCOPE, decision_id="d-1", subject="ACME", rating="buy",  # type: ignore[arg-type]
                         decision_text="Buy.", deadline=T0),  # type: ignore[arg-type]
        OutcomeObserved(scope=SCOPE, outcome_id="o-1", subject="ACME", raw_return=-0.02, horizon_days=0),
        MemoryReflected(scope=SCOPE, reflection_id="r-1", decision_id="d-1", outcome_id="o-1",
                        subject="ACME", rating="sell", content="Wrong call. Lesson: wait.",  # type: ignore[arg-type]
                        correct=False),
        DecisionExpired(scope=SCOPE, decision_id="d-1", subject="ACME", deadline=T0),  # type: ignore[arg-type]
    ]


# --- drift ------------------------------------------------------------------------------


def test_committed_schemas_match_the_models() -> None:
    drift = find_drift(COMMITTED)
    assert not drift, (
        f"schemas/ drifted from the models ({drift.describe()}): run "
        "`python -m memstream.schemas_gen` from the repository root and commit the result"
    )


def test_generation_is_deterministic_and_canonical() -> None:
    first, second = generate_schemas(), generate_schemas()
    assert first == second
    for name, text in first.items():
        assert text.endswith("}\n") and not text.endswith("\n\n"), name
        assert render(json.loads(text)) == text, f"{name} is not in canonical form"


def test_one_schema_per_event_type_plus_the_index() -> None:
    files = generate_schemas()
    expected = {schema_filename(cls) for cls in EVENT_CLASSES} | {INDEX_FILENAME}
    assert set(files) == expected
    assert schema_filename(MemoryAdded) == "MemoryAdded.v2.json"
    index = json.loads(files[INDEX_FILENAME])
    assert index["events"]["MemoryAdded"] == {"schema": "MemoryAdded.v2.json", "schema_version": 2}
    assert index["wire_required"] == list(WIRE_REQUIRED_FIELDS)


def test_check_mode_reports_each_kind_of_drift(tmp_path: Path) -> None:
    target = tmp_path / "schemas"
    assert main(["--check", str(target)]) == 1  # nothing there yet
    assert main([str(target)]) == 0
    assert main(["--check", str(target)]) == 0
    assert sorted(p.name for p in target.iterdir()) == sorted(generate_schemas())

    (target / "MemoryAdded.v2.json").write_text("{}\n", encoding="utf-8")
    (target / "MemoryAdded.v1.json").write_text("{}\n", encoding="utf-8")
    (target / "DecisionExpired.v1.json").unlink()
    (target / "README.md").write_text("not a schema\n", encoding="utf-8")
    drift = find_drift(target)
    assert drift.changed == ["MemoryAdded.v2.json"]
    assert drift.stale == ["MemoryAdded.v1.json"]
    assert drift.missing == ["DecisionExpired.v1.json"]
    assert main(["--check", str(target)]) == 1

    fixed = write_schemas(target)
    assert fixed.changed and fixed.stale and fixed.missing
    assert not find_drift(target)
    assert (target / "README.md").exists()  # only generated names are touched


def test_check_mode_is_byte_exact(tmp_path: Path) -> None:
    write_schemas(tmp_path)
    path = tmp_path / INDEX_FILENAME
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    assert find_drift(tmp_path).changed == [INDEX_FILENAME]


def test_module_runs_as_a_script() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "memstream.schemas_gen", "--check", str(COMMITTED)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "match the models" in proc.stdout


# --- schemas agree with the models --------------------------------------------------------


@pytest.mark.parametrize("cls", EVENT_CLASSES, ids=lambda c: c.__name__)
def test_each_schema_is_a_valid_draft_2020_12_schema(cls: type[EventBase]) -> None:
    Draft202012Validator.check_schema(event_schema(cls))


@pytest.mark.parametrize("event", sample_events(), ids=lambda e: f"{e.type}-{id(e) % 1000}")
def test_valid_events_validate_against_their_schema(event: EventBase) -> None:
    document = json.loads(json.dumps(event.model_dump(mode="json")))
    errors = [e.message for e in validator_for(type(event)).iter_errors(document)]
    assert errors == []
    assert parse_event(document, require_envelope=True) == event


def _memory_document(**changes: Any) -> dict[str, Any]:
    event = MemoryAdded(scope=SCOPE, memory_id="mem-1", content="Ada lives in Lisbon.")
    document = event.model_dump(mode="json")
    for key, value in changes.items():
        if value is None:
            document.pop(key)
        else:
            document[key] = value
    return document


@pytest.mark.parametrize(
    "changes",
    [
        {"event_id": None},
        {"occurred_at": None},
        {"scope": None},
        {"type": "MessageObserved"},
        {"content": "a\x00b"},
        {"content": "   "},
        {"content": "x" * (MAX_MEMORY_CHARS + 1)},
        {"priority": 101},
        {"priority": "50"},
        {"memory_type": "gossip"},
        {"memory_id": "has space"},
        {"colour": "blue"},
        {"embedding": {"model": "m", "dim": 1, "data": "!!"}},
        {"scope": {"user_id": "u"}},
    ],
    ids=lambda c: ",".join(c),
)
def test_schema_and_model_both_refuse_documented_violations(changes: dict[str, Any]) -> None:
    document = _memory_document(**changes)
    assert list(validator_for(MemoryAdded).iter_errors(document)), "schema accepted it"
    with pytest.raises(EventValidationError):
        parse_event(document, require_envelope=True)


def test_embedding_payload_helper_matches_the_codec() -> None:
    assert EmbeddingPayload.from_vector("m", [1.0]).data == encode_vector([1.0])


@settings(max_examples=200)
@given(st.text(max_size=40))
def test_schema_and_model_agree_on_content(content: str) -> None:
    document = _memory_document(content=content, content_hash="")
    schema_ok = not list(validator_for(MemoryAdded).iter_errors(document))
    try:
        parse_event(document, require_envelope=True)
        model_ok = True
    except EventValidationError:
        model_ok = False
    assert schema_ok == model_ok, repr(content)


@settings(max_examples=200)
@given(st.text(max_size=20))
def test_schema_and_model_agree_on_one_line_fields(speaker: str) -> None:
    event = MessageObserved(scope=SCOPE, message_id="m", content="hi")
    document = {**event.model_dump(mode="json"), "speaker": speaker}
    schema_ok = not list(validator_for(MessageObserved).iter_errors(document))
    try:
        parse_event(document, require_envelope=True)
        model_ok = True
    except EventValidationError:
        model_ok = False
    assert schema_ok == model_ok, repr(speaker)
