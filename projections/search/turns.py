"""The L0 turns and session rows that conversation-aware search reads: who spoke,
where each turn sits in the log, and which memories each turn was drawn into."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memstream.domain.ranking import is_question

__all__ = ["Turn", "Line", "SessionTurns", "SessionMemories", "step"]

Line = list[tuple[int, str]]
"""A session's turns on one partition in log order: ``(offset, message_id)``, sorted."""


class Turn:
    """The L0 turn a memory was drawn from: who said it, where it sits in the log.
    Whether it asks something is worked out only for the turns that need it (a
    search looks at a few turns of each session it reads) and then kept."""

    __slots__ = ("message_id", "session_id", "partition", "offset", "speaker", "_content", "_question")

    def __init__(
        self, message_id: str, session_id: str | None, partition: int, offset: int, speaker: str | None, content: str
    ) -> None:
        self.message_id = message_id
        self.session_id = session_id
        self.partition = partition
        self.offset = offset
        self.speaker = speaker
        self._content = content
        self._question: bool | None = None

    @property
    def content(self) -> str:
        return self._content

    @property
    def question(self) -> bool:
        if self._question is None:
            self._question = is_question(self._content)
        return self._question

    @property
    def line_key(self) -> tuple[str | None, int]:
        """The line of the log this turn is on: its session on its partition."""
        return (self.session_id, self.partition)


def step(line: Sequence[tuple[int, str]], turn: Turn, forward: bool) -> str | None:
    """The message id of the turn before (or after) ``turn`` on its ``line``, if any.
    Turns that share an offset (written without a log position) count as one place."""
    i = bisect.bisect_left(line, turn.offset, key=_offset_of)
    if forward:
        j = i + 1 if i < len(line) and line[i][0] == turn.offset else i
        return line[j][1] if j < len(line) else None
    return line[i - 1][1] if i > 0 else None


def _offset_of(entry: tuple[int, str]) -> int:
    return entry[0]


class SessionTurns:
    """Every turn of one session (``messages`` rows with that ``session_id``), by
    message id, on its lines in log order, and who spoke in it. Immutable once built."""

    __slots__ = ("turns", "lines", "speakers")

    def __init__(self, turns: Iterable[Turn]) -> None:
        self.turns: dict[str, Turn] = {t.message_id: t for t in turns}
        lines: dict[tuple[str | None, int], Line] = {}
        for t in self.turns.values():
            lines.setdefault(t.line_key, []).append((t.offset, t.message_id))
        for line in lines.values():
            line.sort()
        self.lines = lines
        self.speakers = frozenset(t.speaker for t in self.turns.values() if t.speaker)


class SessionMemories:
    """Every memory of one session (``memories`` rows with that ``session_id``, in the
    read's order), and which of them each turn was drawn into. Immutable once built."""

    __slots__ = ("memory_ids", "citing")

    def __init__(self, rows: Iterable[Mapping[str, Any]]) -> None:
        ids: list[str] = []
        citing: dict[str, list[str]] = {}
        for row in rows:
            mid = row["memory_id"]
            ids.append(mid)
            for source in dict.fromkeys(row.get("source_message_ids") or ()):
                citing.setdefault(source, []).append(mid)
        self.memory_ids: tuple[str, ...] = tuple(ids)
        self.citing: dict[str, tuple[str, ...]] = {m: tuple(v) for m, v in citing.items()}
