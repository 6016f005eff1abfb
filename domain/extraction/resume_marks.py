"""What the extractor's commit says beyond its offset: which later turns are done.

The extractor commits each partition of ``messages`` up to its oldest turn not yet
extracted. Turns after that offset may be extracted already (other sessions' windows
finish first), and without more information a restarted extractor, or the one a
rebalance hands the partition to, would extract them again as new turns: in windows
other than the first run's, so with other memories (duplicates) and other background.

So each commit carries, in Kafka's commit metadata (a string stored with the offset,
atomically), a :class:`ResumeMark`: ``end``, one past the last record read, and the
offsets in ``[commit, end)`` of the turns still *pending*. Reading from the commit,
a turn before ``end`` that is not pending was extracted: it becomes background, not
a new turn. The mark is a few run-length ranges in base 36; when it would exceed
:data:`MAX_CHARS` (the broker's ``offset.metadata.max.bytes`` is 4,096 by default),
the commit goes without it and a restart re-extracts as before (nothing is lost).

It also carries the retry budgets of the windows that failed or waited (``budgets``:
the offset of a window's first turn -> its failed attempts and when its budget
began, wall-clock), so the extractor that reads the partition next continues each
window's attempts and budget instead of starting them afresh. Commit metadata is the
consumer group's own state, written atomically with the offset it explains: no event
is added or changed for it. Budgets go first when the mark would be too long.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["ResumeMark", "WindowBudget", "MAX_CHARS", "encode_mark", "decode_mark"]

MAX_CHARS = 3_000
_PREFIX = "x1"
_PREFIX_BUDGETS = "x2"
"""A mark with budgets (an ``x1`` reader takes it for no mark: every turn pending)."""


@dataclass(frozen=True)
class WindowBudget:
    """A window's retry budget as far as it went: ``failures`` attempts failed, and the
    budget began at ``started_at`` (Unix seconds, millisecond precision)."""

    failures: int
    started_at: float


@dataclass(frozen=True)
class ResumeMark:
    """Offsets ``[commit, end)`` of a partition: ``pending`` still to extract, the
    rest done."""

    end: int
    pending: frozenset[int]
    budgets: Mapping[int, WindowBudget] = field(default_factory=dict)
    """By the offset of a window's first turn (at or after the commit)."""

    def done(self, offset: int) -> bool:
        """Whether the record at ``offset`` was extracted before this mark was made."""
        return offset < self.end and offset not in self.pending


def _b36(n: int) -> str:
    return np.base_repr(n, 36).lower()


def _runs(commit: int, offsets: list[int]) -> str:
    runs: list[str] = []
    cursor = commit
    i = 0
    while i < len(offsets):
        start = offsets[i]
        j = i
        while j + 1 < len(offsets) and offsets[j + 1] == offsets[j] + 1:
            j += 1
        runs.append(f"{_b36(start - cursor)}+{_b36(j - i + 1)}")
        cursor = offsets[j] + 1
        i = j + 1
    return ",".join(runs)


def encode_mark(
    commit: int, end: int, pending: Iterable[int], budgets: Mapping[int, WindowBudget] | None = None
) -> str:
    """The metadata for a commit at ``commit`` (``""`` when nothing after it is done
    and no window's budget is under way, or when even the mark without budgets would
    be longer than :data:`MAX_CHARS`)."""
    offsets = sorted({o for o in pending if commit <= o < end})
    kept = sorted((o, b) for o, b in (budgets or {}).items() if commit <= o < end)
    if end <= commit or (len(offsets) == end - commit and not kept):
        return ""
    head = f"{_b36(end - commit)}:{_runs(commit, offsets)}"
    if kept:
        entries = ",".join(
            f"{_b36(o - commit)}+{_b36(b.failures)}+{_b36(max(0, round(b.started_at * 1000)))}" for o, b in kept
        )
        text = f"{_PREFIX_BUDGETS}:{head}:{entries}"
        if len(text) <= MAX_CHARS:
            return text
        if len(offsets) == end - commit:
            return ""
    text = f"{_PREFIX}:{head}"
    return text if len(text) <= MAX_CHARS else ""


def decode_mark(commit: int, text: str | None) -> ResumeMark | None:
    """The mark a commit at ``commit`` carried; ``None`` for no mark or one this
    version cannot read (then every turn after the commit counts as pending and
    every window's budget starts afresh)."""
    if not text:
        return None
    prefix, _, rest = text.partition(":")
    if prefix not in (_PREFIX, _PREFIX_BUDGETS):
        return None
    try:
        parts = rest.split(":")
        if len(parts) != (3 if prefix == _PREFIX_BUDGETS else 2):
            return None
        end = commit + int(parts[0], 36)
        pending: set[int] = set()
        cursor = commit
        for run in filter(None, parts[1].split(",")):
            gap, length = (int(part, 36) for part in run.split("+", 1))
            start = cursor + gap
            pending.update(range(start, start + length))
            cursor = start + length
        budgets: dict[int, WindowBudget] = {}
        for entry in filter(None, parts[2].split(",") if len(parts) == 3 else ()):
            gap, failures, millis = (int(part, 36) for part in entry.split("+"))
            budgets[commit + gap] = WindowBudget(failures, millis / 1000)
    except ValueError:
        return None
    return ResumeMark(end, frozenset(pending), budgets)
