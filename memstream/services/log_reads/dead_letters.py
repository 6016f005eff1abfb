"""The newest dead letters, for the console's operations page: read from the end of
each partition of the dead-letter topic, parsed with ``parse_dead_letter`` (their
reason, stage and source position), never the whole topic."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone

from memstream.streams.log_tail import LogTail
from memstream.settings import Settings
from memstream.streams.dead_letters.publisher import NotADeadLetter, parse_dead_letter
from memstream.streams.topics import Topics

__all__ = ["DeadLetterRow", "DeadLetterPage", "recent_dead_letters"]


@dataclass(frozen=True)
class DeadLetterRow:
    position: str
    """Where the dead letter itself sits (topic:partition:offset)."""
    at: datetime
    stage: str
    reason: str
    source: str
    """Where the original record was read."""
    event_type: str | None


@dataclass
class DeadLetterPage:
    rows: list[DeadLetterRow] = field(default_factory=list)
    total: int = 0
    """Records in the topic (its end offsets added up, retention aside)."""
    by_reason: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(stage, reason's first words) -> count, over the records read for this page."""
    has_more: bool = False


def _reason_kind(reason: str) -> str:
    head = reason.split(":", 1)[0]
    return head if len(head) <= 60 else head[:57] + "..."


async def recent_dead_letters(settings: Settings, tail: LogTail, *, limit: int = 25, offset: int = 0) -> DeadLetterPage:
    """Dead letters newest first: the last ``offset + limit`` records of every
    partition are read and merged by time, and the page ``[offset, offset+limit)``."""
    found = await tail.read([Topics.from_settings(settings.broker).dead_letter], offset + limit + 1)
    rows = sorted((_row(r) for r in found.records), key=lambda r: r.at, reverse=True)
    return DeadLetterPage(rows=rows[offset : offset + limit], total=found.total,
                          by_reason=Counter((r.stage, _reason_kind(r.reason)) for r in rows),
                          has_more=len(rows) > offset + limit)


def _row(record: object) -> DeadLetterRow:
    r = record
    at = datetime.fromtimestamp((getattr(r, "timestamp", 0) or 0) / 1000, tz=timezone.utc)
    position = f"{getattr(r, 'topic')}:{getattr(r, 'partition')}:{getattr(r, 'offset')}"
    headers = list(getattr(r, "headers", None) or ())
    try:
        dl = parse_dead_letter(getattr(r, "key"), getattr(r, "value"), headers)
    except NotADeadLetter as exc:
        return DeadLetterRow(position, at, "unknown", f"not a memstream dead letter: {exc}", "", None)
    kind = next((v.decode("utf-8", "replace") for k, v in dl.original_headers if k == "memstream-type"), None)
    return DeadLetterRow(position, at, dl.stage, dl.reason, str(dl.source_position), kind)
