"""The newest dead letters, for the console's operations page: read from the end of
each partition of the dead-letter topic, parsed with ``parse_dead_letter`` (their
reason, stage and source position), never the whole topic."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone

from aiokafka import AIOKafkaConsumer, TopicPartition

from memstream.settings import Settings
from memstream.streams.admin import topic_partitions
from memstream.streams.connect import kafka_options
from memstream.streams.deadletter import NotADeadLetter, parse_dead_letter
from memstream.services.pending_view import FETCH_WAIT_MS
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


async def recent_dead_letters(settings: Settings, *, limit: int = 25, offset: int = 0) -> DeadLetterPage:
    """Dead letters newest first: the last ``offset + limit`` records of every
    partition are read and merged by time, and the page ``[offset, offset+limit)``."""
    topic = Topics.from_settings(settings).dead_letter
    want = offset + limit + 1
    consumer = AIOKafkaConsumer(**kafka_options(settings), group_id=None, enable_auto_commit=False,
                                client_id="memstream-console-dead-letters", fetch_max_wait_ms=FETCH_WAIT_MS)
    await consumer.start()
    page = DeadLetterPage()
    try:
        found = await topic_partitions(settings.bootstrap_servers, [topic], client_id="memstream-console-dead-letters")
        tps = [TopicPartition(topic, p) for p in sorted(found.get(topic, ()))]
        if not tps:
            return page
        consumer.assign(tps)
        begins, ends = await consumer.beginning_offsets(tps), await consumer.end_offsets(tps)
        page.total = sum(ends[tp] - begins[tp] for tp in tps)
        rows: list[DeadLetterRow] = []
        for tp in tps:
            start = max(begins[tp], ends[tp] - want)
            consumer.seek(tp, start)
            while await consumer.position(tp) < ends[tp]:
                for r in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, ()):
                    if r.offset >= ends[tp]:
                        continue
                    rows.append(_row(r))
        rows.sort(key=lambda r: r.at, reverse=True)
        page.by_reason = Counter((r.stage, _reason_kind(r.reason)) for r in rows)
        page.rows = rows[offset : offset + limit]
        page.has_more = len(rows) > offset + limit
        return page
    finally:
        await consumer.stop()


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
