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
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

__all__ = ["ResumeMark", "MAX_CHARS", "encode_mark", "decode_mark"]

MAX_CHARS = 3_000
_PREFIX = "x1"


@dataclass(frozen=True)
class ResumeMark:
    """Offsets ``[commit, end)`` of a partition: ``pending`` still to extract, the
    rest done."""

    end: int
    pending: frozenset[int]

    def done(self, offset: int) -> bool:
        """Whether the record at ``offset`` was extracted before this mark was made."""
        return offset < self.end and offset not in self.pending


def _b36(n: int) -> str:
    return np.base_repr(n, 36).lower()


def encode_mark(commit: int, end: int, pending: Iterable[int]) -> str:
    """The metadata for a commit at ``commit`` (``""`` when nothing after it is done,
    or when the mark would be longer than :data:`MAX_CHARS`)."""
    offsets = sorted({o for o in pending if commit <= o < end})
    if end <= commit or len(offsets) == end - commit:
        return ""
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
    text = f"{_PREFIX}:{_b36(end - commit)}:{','.join(runs)}"
    return text if len(text) <= MAX_CHARS else ""


def decode_mark(commit: int, text: str | None) -> ResumeMark | None:
    """The mark a commit at ``commit`` carried; ``None`` for no mark or one this
    version cannot read (then every turn after the commit counts as pending)."""
    if not text or not text.startswith(_PREFIX + ":"):
        return None
    try:
        _, end_text, runs_text = text.split(":", 2)
        end = commit + int(end_text, 36)
        pending: set[int] = set()
        cursor = commit
        for run in filter(None, runs_text.split(",")):
            gap, length = (int(part, 36) for part in run.split("+", 1))
            start = cursor + gap
            pending.update(range(start, start + length))
            cursor = start + length
    except ValueError:
        return None
    return ResumeMark(end, frozenset(pending))
