"""``memstream extract --retry-failed``: redo the windows the extractor stored by its
fallback, once the model can take them.

A window the model failed (see :mod:`memstream.domain.extraction.fallback`) was stored turn by
turn by the heuristic, and each of those memories' provenance names the run, the
reason and the window's turn ids. This service finds those windows in the projection
(:func:`find_windows`, optionally only the ones recorded since a time, leaving out
the runs a retry already redid), reads their turns back from the ``messages`` table,
runs the normal extraction on each (the model, dedup, candidate recall, judgment) and
produces, ADD-only, the memories it made plus a ``supersedes`` link from each to the
fallback memories of the same turns. A window the model still fails is reported and
left for a later retry; nothing is emitted for it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from memstream.domain.events import EventBase, Provenance, utcnow
from memstream.domain.extraction.fallback import (
    FALLBACK_STATUS,
    RETRY_KEY,
    FallbackWindow,
    fallback_windows,
    retry_links,
)
from memstream.domain.log import LogPosition
from memstream.llm import ChatModel
from memstream.projections.schema import MEMORIES
from memstream.projections.reads import turns_by_id
from memstream.services.extraction.run import EventSink, WindowInput
from memstream.services.extraction.extractor import Extractor
from memstream.settings import Settings

__all__ = ["parse_since", "find_windows", "RetryReport", "retry_windows"]

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_COLUMNS = ["memory_id", "team_id", "user_id", "agent_id", "session_id", "source_message_ids", "provenance", "recorded_at"]


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``--since``: an ISO 8601 time (UTC when it names no offset) or an age such as
    ``90m``, ``24h``, ``7d``; ``ValueError`` with a readable message otherwise."""
    match = _RELATIVE.match(text)
    if match:
        amount, unit = float(match.group(1)), match.group(2)
        return (now or utcnow()) - timedelta(**{_UNITS[unit]: amount})
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"--since {text!r} is neither an ISO time nor an age like 24h or 7d") from None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _timestamp(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")


def find_windows(store: Any, since: datetime | None = None) -> list[FallbackWindow]:
    """The fallback windows recorded (projected) since ``since`` that no retry redid
    yet, oldest first."""
    where = f"provenance LIKE '%\"status\":\"{FALLBACK_STATUS}\"%'"
    if since is not None:
        where += f" AND recorded_at >= timestamp '{_timestamp(since)}'"
    rows = store.rows(MEMORIES, where, _COLUMNS).to_pylist()
    retried = store.rows(MEMORIES, f"provenance LIKE '%\"{RETRY_KEY}\"%'", ["provenance"]).to_pylist()
    done: set[str] = set()
    for row in retried:
        for entry in json.loads(row["provenance"] or "{}").get("decisions") or ():
            if RETRY_KEY in entry:
                done.add(str(entry[RETRY_KEY]))
    for row in rows:
        row["provenance"] = json.loads(row["provenance"] or "{}")
    return fallback_windows(rows, done)


class _Collect:
    """An :class:`EventSink` that keeps the events (produced later with the links)."""

    def __init__(self) -> None:
        self.events: list[EventBase] = []

    async def send_many(self, events: Sequence[EventBase]) -> list[LogPosition]:
        self.events.extend(events)
        return []


@dataclass
class RetryReport:
    """What a retry did: windows redone, memories and links emitted, windows the
    model still failed (run id -> why) and windows whose turns are not projected."""

    windows: int = 0
    redone: int = 0
    memories: int = 0
    links: int = 0
    still_failing: dict[str, str] = field(default_factory=dict)
    missing_turns: list[str] = field(default_factory=list)


async def retry_windows(
    settings: Settings,
    store: Any,
    windows: Sequence[FallbackWindow],
    *,
    llm: ChatModel,
    embedder: Any,
    producer: EventSink,
    progress: Callable[[], None] = lambda: None,
) -> RetryReport:
    """Extract each window again with ``llm`` and produce what it made (see the
    module docstring); ``progress`` is called once per window."""
    report = RetryReport(windows=len(windows))
    for window in windows:
        turns = turns_by_id(store, window.scope, window.window)
        if not turns:
            report.missing_turns.append(window.run_id)
            progress()
            continue
        background = turns_by_id(store, window.scope, window.background)
        sink = _Collect()
        extractor = Extractor(settings, llm, embedder, store, sink)
        mark = {RETRY_KEY: window.run_id}
        (outcome,) = await extractor.run_windows(
            [WindowInput(window.scope, window.session_id, turns, background, record=(mark,))]
        )
        if not outcome.ok or outcome.fallback is not None:
            report.still_failing[window.run_id] = outcome.failure or f"fallback again ({outcome.fallback})"
            progress()
            continue
        provenance = Provenance(
            method="rule",
            output_refs=tuple(m.memory_id for m in outcome.memories),
            decisions=(mark,),
            note=f"retry of the fallback run {window.run_id} ({window.reason})",
        )
        links = retry_links(outcome.memories, window.memories, provenance)
        events = [*sink.events, *links]
        if events:
            await producer.send_many(events)
        report.redone += 1
        report.memories += len(outcome.memories)
        report.links += len(outcome.links) + len(links)
        progress()
    return report
