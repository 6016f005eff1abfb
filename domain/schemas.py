"""JSON Schemas of the events, generated from the models, for producers in any language.

A Java, Go or kcat producer cannot import the pydantic models, so the repository
publishes one JSON Schema (draft 2020-12) per event type and version in ``schemas/``,
generated here and committed; a test fails when the committed files drift from the
models. This module is pure: :func:`generate_schemas` returns file names and texts,
``memstream.schemas_gen`` writes them.

The schemas describe the *wire* contract, which is slightly stricter than the Python
constructors: ``type``, ``schema_version``, ``event_id``, ``occurred_at`` and ``scope``
are required (see :data:`~memstream.domain.events.WIRE_REQUIRED_FIELDS`), so every
record carries its own identity and time and a retried send stays idempotent. Readers
are more lenient than the schemas in a few documented ways (legacy memory-type names,
upper-case enum values, entity kinds outside the list become ``other``, older schema
versions are upcast), never stricter, with one exception a schema cannot express:
``MemoryAdded.content_hash``, when given, must equal the hash of the content.

Output is deterministic (sorted keys, two-space indent, a trailing newline), so a
regenerated file differs only when a model did.
"""

from __future__ import annotations

import json
from typing import Any

from memstream.domain.events import (
    EVENT_CLASSES,
    MAX_MEMORY_CHARS,
    MAX_MESSAGE_CHARS,
    WIRE_REQUIRED_FIELDS,
    EventBase,
)

__all__ = [
    "JSON_SCHEMA_DIALECT",
    "INDEX_FILENAME",
    "schema_filename",
    "event_schema",
    "index_document",
    "render",
    "generate_schemas",
]

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
INDEX_FILENAME = "index.json"


def _type_and_version(cls: type[EventBase]) -> tuple[str, int]:
    return cls.model_fields["type"].default, cls.model_fields["schema_version"].default


def schema_filename(cls: type[EventBase]) -> str:
    """``MemoryAdded`` at version 2 -> ``MemoryAdded.v2.json``."""
    etype, version = _type_and_version(cls)
    return f"{etype}.v{version}.json"


def _one_line_descriptions(node: Any) -> None:
    """Docstrings become descriptions; fold their line breaks so each reads as one line."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                node[key] = " ".join(value.split())
            else:
                _one_line_descriptions(value)
    elif isinstance(node, list):
        for item in node:
            _one_line_descriptions(item)


def event_schema(cls: type[EventBase]) -> dict[str, Any]:
    """The wire JSON Schema of one event class (current version)."""
    schema = cls.model_json_schema(mode="validation")
    _one_line_descriptions(schema)
    properties = schema.get("properties", {})
    required = set(schema.get("required", ())) | {f for f in WIRE_REQUIRED_FIELDS if f in properties}
    schema["required"] = sorted(required)
    schema["$schema"] = JSON_SCHEMA_DIALECT
    schema["$id"] = schema_filename(cls)
    return schema


def index_document() -> dict[str, Any]:
    """``index.json``: which schema file describes which event type, and the limits."""
    events = {}
    for cls in EVENT_CLASSES:
        etype, version = _type_and_version(cls)
        events[etype] = {"schema": schema_filename(cls), "schema_version": version}
    return {
        "description": (
            "memstream event schemas (JSON Schema draft 2020-12), one per event type at "
            "its current schema_version. Generated from memstream.domain.events by "
            "`python -m memstream.schemas_gen`; do not edit by hand."
        ),
        "events": events,
        "limits": {"max_memory_chars": MAX_MEMORY_CHARS, "max_message_chars": MAX_MESSAGE_CHARS},
        "wire_required": list(WIRE_REQUIRED_FIELDS),
    }


def render(document: dict[str, Any]) -> str:
    """Deterministic JSON text: sorted keys, two-space indent, UTF-8, trailing newline."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def generate_schemas() -> dict[str, str]:
    """Every file of ``schemas/``: file name -> text, the index included."""
    files = {schema_filename(cls): render(event_schema(cls)) for cls in EVENT_CLASSES}
    files[INDEX_FILENAME] = render(index_document())
    return dict(sorted(files.items()))
