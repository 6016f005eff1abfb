"""The projection's log positions (``memstream.projections.store_positions``)."""

from __future__ import annotations

from pathlib import Path

from tests.projections.projection_helpers import DIM

from memstream.projections.schema import POSITIONS
from memstream.projections.store import LanceStore

def test_positions_round_trip_and_survive_reopen(tmp_path: Path) -> None:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    assert store.positions() == {}
    store.save_positions({("a.events", 0): 5, ("a.events", 2): 9, ("a.messages", 1): 3})
    store.save_positions({("a.events", 0): 6})
    reopened = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    assert reopened.positions() == {("a.events", 0): 6, ("a.events", 2): 9, ("a.messages", 1): 3}


def test_positions_are_appended_read_as_the_furthest_and_pruned(tmp_path: Path) -> None:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    for offset in (5, 9, 12):
        store.save_positions({("t", 0): offset, ("t", 1): offset * 2})
    store.save_positions({("u", 0): 3})
    assert store.positions() == {("t", 0): 12, ("t", 1): 24, ("u", 0): 3}
    digest = store.table_digest()[POSITIONS]
    assert store.table(POSITIONS).count_rows() == 7
    assert store.prune_positions() == 4
    assert store.table(POSITIONS).count_rows() == 3
    assert store.positions() == {("t", 0): 12, ("t", 1): 24, ("u", 0): 3}
    assert store.table_digest()[POSITIONS] == digest
    assert store.prune_positions() == 0
