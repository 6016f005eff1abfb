"""The worker's garbage-collector tuning: a larger youngest generation, start-up
objects frozen; 0 leaves Python's defaults alone."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from memstream.gc_tuning import tune_gc


@pytest.fixture
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_zero_keeps_the_defaults(restore_gc: None) -> None:
    before = gc.get_threshold(), gc.get_freeze_count()
    tune_gc(0)
    assert (gc.get_threshold(), gc.get_freeze_count()) == before


def test_threshold_and_freeze(restore_gc: None) -> None:
    gen1, gen2 = gc.get_threshold()[1:]
    tune_gc(50_000)
    assert gc.get_threshold() == (50_000, gen1, gen2)
    assert gc.get_freeze_count() > 0  # start-up objects no longer scanned
