"""Shared builders for the extraction tests: turns, windows, answers, drafts, candidates."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from memstream.domain.events import MemoryType, MessageObserved, Scope
from memstream.domain.extraction.drafts import MemoryDraft
from memstream.domain.extraction.judgment import Candidate
from memstream.domain.extraction.window import build_window

SCOPE = Scope(team_id="acme", user_id="ana", agent_id="bot")
T0 = datetime(2024, 5, 8, 15, 30, tzinfo=timezone.utc)  # a Wednesday


def turn(mid: str, content: str, *, minutes: int = 0, speaker: str | None = "Ana", role: str = "user") -> MessageObserved:
    return MessageObserved(
        scope=SCOPE,
        session_id="s1",
        message_id=mid,
        role=role,  # type: ignore[arg-type]
        speaker=speaker,
        content=content,
        occurred_at=T0 + timedelta(minutes=minutes),
    )


def window(*contents: str, background: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    bg = [turn(f"b{i}", c, minutes=-10 + i) for i, c in enumerate(background)]
    new = [turn(f"m{i}", c, minutes=i) for i, c in enumerate(contents)]
    return build_window(SCOPE, "s1", new, bg, max_background=5)


def memory(content: str, sources: list[Any], **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "content": content,
        "type": "persona",
        "priority": 70,
        "source_ids": sources,
        "timestamp": None,
        "timestamp_start": None,
        "timestamp_end": None,
        "entities": [],
    }
    out.update(extra)
    return out


def answer(*memories: dict[str, Any], ids: list[str] | None = None, title: str = "Food") -> dict[str, Any]:
    return {"scenes": [{"title": title, "message_ids": ids or [], "memories": list(memories)}]}


def draft(content: str, sources: tuple[str, ...] = ("m0",), priority: int = 50, **kw: Any) -> MemoryDraft:
    return MemoryDraft(
        content=content,
        memory_type=kw.pop("memory_type", MemoryType.persona),
        priority=priority,
        source_message_ids=sources,
        occurred_at=kw.pop("occurred_at", T0),
        **kw,
    )


def cand(mid: str, content: str) -> Candidate:
    return Candidate(memory_id=mid, content=content, memory_type="persona", when=T0 - timedelta(days=3))
