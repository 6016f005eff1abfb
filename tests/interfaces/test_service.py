"""The serving process's ``MemoryService``: the search caches it keeps are bounded."""

from __future__ import annotations

from pathlib import Path

from memstream.interfaces.service import MemoryService
from memstream.projections.search.cache import CACHE_MAX_ROWS
from memstream.projections.search.vectors import VECTORS_MAX_ROWS
from memstream.settings.model import Settings


def test_the_search_caches_are_bounded_by_the_search_modules_constants(tmp_path: Path) -> None:
    cache = MemoryService(Settings(home=tmp_path)).search_cache
    assert (cache.max_rows, cache.vectors.max_rows) == (CACHE_MAX_ROWS, VECTORS_MAX_ROWS)
    assert 0 < CACHE_MAX_ROWS < 10**6 and 0 < VECTORS_MAX_ROWS < 10**6
