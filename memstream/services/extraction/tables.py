"""The LanceDB table set the extractor reads (exact dedup, candidate recall, earlier
turns): opened in a thread, prefetched at start, and followed to a replay's new set."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from memstream.projections.store import TableSets
from memstream.services.shards import open_store
from memstream.settings import Settings

__all__ = ["ExtractorTables"]

log = logging.getLogger(__name__)


class ExtractorTables:
    """Opens the table set read-only-consistent (``read_consistency_interval=0``: the
    projector's writes are seen at once) and hands each store it opens to ``attach``."""

    def __init__(self, settings: Settings, attach: Callable[[Any], None]) -> None:
        self.settings = settings
        self.store: Any | None = None
        self._on_open = attach
        self._lock = asyncio.Lock()
        self._prefetch: asyncio.Task[None] | None = None

    def _attach(self, store: Any) -> None:
        self.store = store
        self._on_open(store)

    def attach(self, store: Any) -> None:
        """Use ``store`` (one passed in by a test or the bench)."""
        self._attach(store)

    def start_prefetch(self) -> None:
        self._prefetch = asyncio.create_task(self.prefetch(), name="memstream-extractor-store")

    async def stop(self) -> None:
        if self._prefetch is not None and not self._prefetch.done():
            self._prefetch.cancel()
            await asyncio.gather(self._prefetch, return_exceptions=True)

    async def prefetch(self) -> None:
        """Open the table set at start, for reading only, so the first turns do not wait
        for it. Read-only never races the projector creating the tables; if they do
        not exist yet, :meth:`ensure` opens them when the first turn needs them."""
        try:
            store = await asyncio.to_thread(
                open_store, self.settings, TableSets(self.settings.storage.root).current(),
                read_consistency_interval=timedelta(0), create=False,
            )
        except Exception as exc:  # noqa: BLE001 - not there yet: opened on first use
            log.debug("extractor: table set not opened at start (%s); opening it on first use", exc)
            return
        if self.store is None:
            self._attach(store)

    async def follow_current_set(self) -> None:
        """After a replay's swap, look memories up in the new set (the old one stays
        readable until the next replay, so a running extraction finishes on it)."""
        store = self.store
        if store is None or self._lock.locked():
            return
        current = TableSets(self.settings.storage.root).current()
        if getattr(store, "root", current) == current:
            return
        async with self._lock:
            fresh = await asyncio.to_thread(
                open_store, self.settings, current, read_consistency_interval=timedelta(0), create=False
            )
            self._attach(fresh)
            log.info("extractor: reading the replayed table set %s", current)

    async def ensure(self) -> None:
        """Open the table set now if it is not open yet (waiting for the prefetch)."""
        if self.store is not None:
            return
        async with self._lock:
            if self._prefetch is not None and not self._prefetch.done():
                await asyncio.wait([self._prefetch])
            if self.store is not None:
                return
            store = await asyncio.to_thread(
                open_store, self.settings, TableSets(self.settings.storage.root).current(),
                read_consistency_interval=timedelta(0),
            )
            self._attach(store)
