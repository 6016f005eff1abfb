"""Which keys a table certainly does not hold yet: a Bloom filter over its ``pk``s.

Why: LanceDB's ``merge_insert`` (the idempotent upsert every table is written with)
joins the new rows against every key already stored, so its cost grows with the
table, many times a plain ``add`` (docs/benchmarks-history.md). Nearly every row the
projector writes is new.
The filter answers "certainly absent" for those (``add``), and "maybe present" for
the rest (a re-added id, a batch re-applied after a crash, a false positive), which
keep the idempotent ``merge_insert``. A wrong "absent" is impossible: every key that
was ever written is in the filter (it is loaded from the table, and extended only
after a write committed), and a Bloom filter has no false negatives.

The filter lives in memory only (Python's ``hash`` seeds it per process, via
``rbloom``); it is rebuilt from the table when a store opens and whenever it has
taken in more keys than it was sized for (false positives would grow: still correct,
only slower).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rbloom import Bloom

__all__ = ["KeyFilter"]

_MIN_CAPACITY = 1_000_000
_FALSE_POSITIVE_RATE = 0.01


class KeyFilter:
    """A Bloom filter over a table's keys, sized for twice its current rows."""

    def __init__(self, keys: Iterable[str], count: int) -> None:
        self.capacity = max(_MIN_CAPACITY, 2 * count)
        self._bloom = Bloom(self.capacity, _FALSE_POSITIVE_RATE)
        self.items = 0
        self.add(keys)

    @property
    def full(self) -> bool:
        """Past its size: rebuild it (from the table) for the promised error rate."""
        return self.items > self.capacity

    def absent(self, keys: Sequence[str]) -> list[bool]:
        """Per key: True when the table certainly does not hold it."""
        bloom = self._bloom
        return [key not in bloom for key in keys]

    def add(self, keys: Iterable[str]) -> None:
        """Record keys just written (call only after their write committed)."""
        keys = list(keys)
        self._bloom.update(keys)
        self.items += len(keys)
