"""The serving process's ``MemoryService``: what its settings bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from memstream.interfaces.service import MemoryService
from memstream.settings.model import SEARCH_CACHE_ROWS, SEARCH_CACHE_VECTORS, Settings


def test_the_search_caches_take_their_bounds_from_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMSTREAM_STORAGE_SEARCH_CACHE_ROWS", "1234")
    monkeypatch.setenv("MEMSTREAM_STORAGE_SEARCH_CACHE_VECTORS", "567")
    cache = MemoryService(Settings(home=tmp_path)).search_cache
    assert (cache.max_rows, cache.vectors.max_rows) == (1234, 567)
    monkeypatch.delenv("MEMSTREAM_STORAGE_SEARCH_CACHE_ROWS")
    monkeypatch.delenv("MEMSTREAM_STORAGE_SEARCH_CACHE_VECTORS")
    cache = MemoryService(Settings(home=tmp_path)).search_cache
    assert (cache.max_rows, cache.vectors.max_rows) == (SEARCH_CACHE_ROWS, SEARCH_CACHE_VECTORS)
