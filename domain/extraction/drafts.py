"""What the parser makes of one memory the model wrote, before it is an event."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from memstream.domain.content import content_hash
from memstream.domain.events import Entity, MemoryType

__all__ = [
    "MAX_ENTITIES",
    "DEFAULT_PRIORITY",
    "MemoryDraft",
    "DraftIssue",
    "ExtractionParse",
    "clean_text",
    "as_list",
]

MAX_ENTITIES = 20
DEFAULT_PRIORITY = 50


@dataclass(frozen=True)
class MemoryDraft:
    """A validated memory that is not an event yet (no id, no embedding)."""

    content: str
    memory_type: MemoryType
    priority: int
    source_message_ids: tuple[str, ...]
    occurred_at: datetime
    scene: str | None = None
    timestamp: datetime | None = None
    timestamp_start: datetime | None = None
    timestamp_end: datetime | None = None
    entities: tuple[Entity, ...] = ()
    notes: tuple[str, ...] = ()

    @cached_property
    def content_hash(self) -> str:
        """Computed once (dedup, the lookup and the event all ask for it)."""
        return content_hash(self.content)


@dataclass(frozen=True)
class DraftIssue:
    """Something the parser dropped or fixed, kept for the run's record and provenance."""

    kind: str
    detail: str
    content: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"issue": self.kind, "detail": self.detail}
        if self.content is not None:
            out["content"] = self.content[:200]
        return out


@dataclass(frozen=True)
class ExtractionParse:
    """The drafts and issues of one answer, with the weak-output counts for metrics:
    memory types repaired, cited ids dropped, memories dropped as hallucination
    suspects; ``nothing_to_remember`` when the model explicitly found nothing."""

    drafts: tuple[MemoryDraft, ...]
    issues: tuple[DraftIssue, ...]
    scenes: int
    type_repairs: int = 0
    invented_ids_dropped: int = 0
    hallucination_suspects: int = 0
    nothing_to_remember: bool = False


_UNSAFE_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Model text made storable: C0 control characters other than tab, newline and
    carriage return, and unpaired surrogates, removed (events refuse both); trimmed."""
    return _UNSAFE_CHARS.sub("", text).strip()


def as_list(value: Any) -> list[Any]:
    """``value`` as a list: ``None`` is empty, a scalar is one item."""
    if value is None:
        return []
    if isinstance(value, list):
        return value
    if isinstance(value, (tuple, set)):
        return list(value)
    return [value]
