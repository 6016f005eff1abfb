"""The JSON schema of the extraction answer, sent as structured output."""

from __future__ import annotations

from typing import Any

from memstream.domain.events import EntityKind, MemoryType

__all__ = ["EXTRACTION_PROMPTS", "EXTRACTION_SCHEMA", "compact_extraction_schema", "extraction_schema"]

_MEMORY_TYPES = [t.value for t in MemoryType]
_ENTITY_KINDS = [k.value for k in EntityKind]

_KNOWN_RELATIONS = [
    "supersedes", "preference_update", "contradicts", "same_entity", "narrative_continuation", "duplicates"
]
"""What a new memory may say of a known one (``memstream.domain.extraction.known`` reads them)."""

EXTRACTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "scenes": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "title": {"type": "string"},
                    "message_ids": {"type": "array", "items": {"type": "string"}},
                    "memories": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "content": {"type": "string"},
                                "type": {"type": "string", "enum": _MEMORY_TYPES},
                                "priority": {"type": "integer"},
                                "source_ids": {"type": "array", "items": {"type": "string"}},
                                "timestamp": {"type": ["string", "null"]},
                                "timestamp_start": {"type": ["string", "null"]},
                                "timestamp_end": {"type": ["string", "null"]},
                                "entities": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "name": {"type": "string"},
                                            "kind": {"type": "string", "enum": _ENTITY_KINDS},
                                        },
                                        "required": ["name", "kind"],
                                        "additionalProperties": False,
                                    },
                                },
                                "links": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "known": {"type": "string"},
                                            "relation": {"type": "string", "enum": _KNOWN_RELATIONS},
                                        },
                                        "required": ["known", "relation"],
                                        "additionalProperties": False,
                                    },
                                },
                            },
                            "required": [
                                "content",
                                "type",
                                "priority",
                                "source_ids",
                                "timestamp",
                                "timestamp_start",
                                "timestamp_end",
                                "entities",
                                "links",
                            ],
                            "additionalProperties": False,
                        },
                    },
                },
                "required": ["title", "message_ids", "memories"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["scenes"],
    "additionalProperties": False,
}
"""The JSON schema sent as structured output (strict-mode compatible: every property
required, nullable times as type unions, no numeric bounds; the parser clamps)."""


def compact_extraction_schema(max_memories: int) -> dict[str, Any]:
    """The answer of the compact prompt (``extraction_compact``): a flat list of at most
    ``max_memories`` memories, each with only its content, type and source ids. Sent as
    a grammar by llama.cpp servers, it bounds what a small model can write: nothing to
    loop in, no field it may get wrong that the parser would only drop."""
    return {
        "type": "object",
        "properties": {
            "memories": {
                "type": "array",
                "maxItems": max_memories,
                "items": {
                    "type": "object",
                    "properties": {
                        "content": {"type": "string"},
                        "type": {"type": "string", "enum": _MEMORY_TYPES},
                        "source_ids": {"type": "array", "items": {"type": "string"}},
                    },
                    "required": ["content", "type", "source_ids"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["memories"],
        "additionalProperties": False,
    }


EXTRACTION_PROMPTS: dict[str, str] = {"full": "extraction", "compact": "extraction_compact"}
"""The prompt id for each ``extract_prompt`` setting."""


def extraction_schema(variant: str, max_memories: int) -> dict[str, Any]:
    """The schema sent with the ``variant`` prompt (see :data:`EXTRACTION_PROMPTS`)."""
    return compact_extraction_schema(max_memories) if variant == "compact" else EXTRACTION_SCHEMA
