"""Reads of several tables as of one projected position.

The projector commits a batch table by table (turns, links, ..., memories) and saves
its positions last; a reader that queries each table at its newest version can read
the links of one batch with the memories of the batch before (a link listed that the
memory's view does not show yet). The writer publishes every table's version with
its positions (:meth:`StorePositions.published_versions`); a reader that needs
several tables to agree reads each at that version, through handles checked out
there (:meth:`StoreSnapshots.at_published`).

A published version is a version the writer's handle was on, which version cleanup
never drops while the writer is still on it (``cleanup_versions``); after a
compaction, a forget's shredding may drop it once it is older than the readers'
grace. A read that finds its version gone reads again at the versions published
since, and, when none were (an idle writer, a table compacted and cleaned since its
last batch), at the newest versions: a compaction changes no row, so those hold the
same rows unless a batch is being written right then.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, Self, TypeVar

from memstream.projections.store.positions import StorePositions

__all__ = ["StoreSnapshots", "PINNED_HANDLES"]

_R = TypeVar("_R")

PINNED_HANDLES = 24
"""Table handles kept checked out at a published version (a few per table: readers
mostly share the newest published version)."""

_ATTEMPTS = 3


class StoreSnapshots(StorePositions):
    """The tables at the versions the writer published with its latest positions."""

    def _pinned_handle(self, name: str, version: int) -> Any:
        cache, lock = self._pinned, self._pinned_lock
        with lock:
            found = cache.get((name, version))
            if found is not None:
                cache.move_to_end((name, version))
                return found
        handle = self._db.open_table(name)
        handle.checkout(version)  # this handle only; the shared one keeps following the writer
        with lock:
            cache[(name, version)] = handle
            while len(cache) > PINNED_HANDLES:
                cache.popitem(last=False)
        return handle

    def _forget_pinned(self, versions: dict[str, int]) -> None:
        with self._pinned_lock:
            for key in versions.items():
                self._pinned.pop(key, None)

    def at_versions(self, versions: dict[str, int]) -> Self:
        """This store, reading the named tables at the given versions (the others
        as usual). Read-only: a checked-out handle refuses writes."""
        view = copy.copy(self)
        view._tables = {**self._tables, **{n: self._pinned_handle(n, v) for n, v in versions.items()}}
        return view

    def at_published(self, tables: Sequence[str], read: Callable[[Self], _R]) -> _R:
        """``read(store)`` with ``tables`` at the versions the writer published with
        its latest positions (see the module doc for a version cleaned up since)."""
        last: dict[str, int] | None = None
        for _ in range(_ATTEMPTS):
            published = self.published_versions()
            versions = {n: published[n] for n in tables if n in published}
            if not versions or versions == last:
                break  # nothing published (an older set), or nothing new since the miss
            try:
                return read(self.at_versions(versions))
            except Exception:  # noqa: BLE001 - a version (or a file of it) gone: read what is published now
                self._forget_pinned(versions)
                last = versions
        return read(self)
