"""When an extraction stops trying: the heuristic fallback's rules and its record.

The seed's rule for a failing model is "store everything, lose nothing", not "wait
forever". A window whose extraction call cannot succeed (the model refuses it, it
does not fit the context, the answer never parses) or keeps failing (timeouts, 5xx)
for ``extract_max_attempts`` attempts or ``extract_retry_budget_s`` seconds is stored
as the heuristic extractor stores turns, and its partition commits past it.

This module is the pure part of that:

* :func:`fallback_reason`: which failures of the extraction call are final at once;
* :func:`fallback_record`: the entry every fallback memory's provenance carries (the
  reason, the error, the window's new and background turn ids), which is how
  ``memstream extract --retry-failed`` finds the window again from the projection;
* :func:`retry_links`: the ``supersedes`` links from the memories a later retry
  extracts to the fallback memories made from the same turns.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from memstream.domain.events import LinkRelation, MemoryAdded, MemoryLinked, Provenance, Scope, build_event
from memstream.domain.extraction.dedup import link_id_for

__all__ = [
    "FallbackReason",
    "FALLBACK_STATUS",
    "RETRY_KEY",
    "fallback_reason",
    "fallback_record",
    "FallbackWindow",
    "fallback_windows",
    "retry_links",
]

FALLBACK_STATUS = "fallback"
"""The provenance status of a memory stored by the fallback."""
RETRY_KEY = "retry_of"
"""The key of the record entry a retry's memories carry: the fallback run's id."""


class FallbackReason(StrEnum):
    """Why a window was stored by the heuristic instead of the model (a metric label)."""

    refused = "refused"
    """A 4xx no retry can fix (content policy, bad request, auth), not 408/429."""
    context_length = "context_length"
    """The window does not fit the model's context."""
    unparseable = "unparseable"
    """The answer stayed unparsable after JSON repair and the call's own retry."""
    unusable = "unusable"
    """An answer that parses but that no retry will make usable (e.g. no memories and
    no explicit "nothing to remember")."""
    attempts = "attempts"
    """Retryable failures (timeouts, 5xx, dropped connections) ``extract_max_attempts`` times."""
    budget = "budget"
    """The retry budget ran out (``extract_retry_budget_s`` since the first attempt)."""
    declared_empty = "declared_empty"
    """The model declared the window empty although its turns plainly state facts
    (``extract_declared_empty_fallback``)."""


_CONTEXT_LENGTH = re.compile(
    r"context[_ ]length|maximum context|context window|too many tokens|prompt is too long|reduce the length",
    re.IGNORECASE,
)


def fallback_reason(kind: str, status: int | None, message: str) -> FallbackReason | None:
    """The reason to fall back at once after an extraction call failed with ``kind``
    (an :class:`memstream.llm.client.LLMError` kind), ``status`` and ``message``; ``None`` when
    a later attempt may succeed (timeout, connection, 408/429/5xx, empty answer)."""
    if _CONTEXT_LENGTH.search(message):
        return FallbackReason.context_length
    if kind == "refused":
        return FallbackReason.refused
    if kind == "parse":
        return FallbackReason.unparseable
    if kind == "unusable":
        return FallbackReason.unusable
    if status is not None and 400 <= status < 500 and status not in (408, 409, 429):
        return FallbackReason.refused
    return None


def fallback_record(
    reason: FallbackReason,
    error: str,
    *,
    run_id: str,
    attempts: int,
    window: Sequence[str],
    background: Sequence[str],
) -> dict[str, Any]:
    """The record entry of a fallback run (in each of its memories' provenance)."""
    return {
        "fallback": reason.value,
        "run": run_id,
        "error": " ".join(error.split())[:500],
        "attempts": attempts,
        "window": list(window),
        "background": list(background),
    }


@dataclass
class FallbackWindow:
    """A window stored by the fallback, read back from its memories: the run id, the
    reason, the conversation, its new and background turn ids, and the fallback
    memories made from them (``memory_id -> source turn ids``)."""

    run_id: str
    reason: str
    scope: Scope
    session_id: str | None
    window: tuple[str, ...]
    background: tuple[str, ...]
    recorded_at: Any
    memories: dict[str, tuple[str, ...]] = field(default_factory=dict)


def fallback_windows(rows: Iterable[Mapping[str, Any]], retried: Iterable[str] = ()) -> list[FallbackWindow]:
    """Group memory rows (``memory_id``, ``team_id``, ``user_id``, ``agent_id``,
    ``session_id``, ``source_message_ids``, ``provenance`` as a mapping,
    ``recorded_at``) into the fallback windows they came from, oldest first, leaving
    out rows that are not fallbacks and the runs in ``retried``."""
    skip = set(retried)
    found: dict[str, FallbackWindow] = {}
    for row in rows:
        provenance = row.get("provenance") or {}
        if provenance.get("status") != FALLBACK_STATUS:
            continue
        entry = next((d for d in provenance.get("decisions") or () if "fallback" in d and "run" in d), None)
        if entry is None or entry["run"] in skip:
            continue
        run_id = str(entry["run"])
        window = found.get(run_id)
        if window is None:
            window = found[run_id] = FallbackWindow(
                run_id,
                str(entry["fallback"]),
                Scope(team_id=row["team_id"], user_id=row["user_id"], agent_id=row["agent_id"]),
                row.get("session_id"),
                tuple(entry.get("window") or ()),
                tuple(entry.get("background") or ()),
                row.get("recorded_at"),
            )
        window.memories[row["memory_id"]] = tuple(row.get("source_message_ids") or ())
    return sorted(found.values(), key=lambda w: (str(w.recorded_at), w.run_id))


def retry_links(
    new: Sequence[MemoryAdded], fallback: Mapping[str, Sequence[str]], provenance: Provenance
) -> list[MemoryLinked]:
    """``supersedes`` links from each memory a retry extracted to every fallback memory
    sharing one of its source turns (the model's reading of those turns replaces the
    raw turn); ids are content-derived, so a repeated retry repeats the same links."""
    links: list[MemoryLinked] = []
    for memory in new:
        sources = set(memory.source_message_ids)
        for target, target_sources in fallback.items():
            if target == memory.memory_id or not sources.intersection(target_sources):
                continue
            links.append(
                build_event(
                    MemoryLinked,
                    scope=memory.scope,
                    session_id=memory.session_id,
                    correlation_id=memory.correlation_id,
                    producer=memory.producer,
                    occurred_at=memory.occurred_at,
                    link_id=link_id_for(memory.memory_id, target, LinkRelation.supersedes),
                    from_memory_id=memory.memory_id,
                    to_memory_id=target,
                    relation=LinkRelation.supersedes,
                    decided_by="rule",
                    reason="a retry of a fallback window: the model's memory replaces the stored turn",
                    provenance=provenance.model_copy(update={"input_refs": tuple(memory.source_message_ids)}),
                )
            )
    return links
