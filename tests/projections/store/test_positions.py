"""The projection's log positions (``memstream.projections.store.positions``)."""

from __future__ import annotations

from pathlib import Path

from tests.projections.projection_helpers import DIM

from memstream.projections.schema import MEMORIES, POSITIONS, TABLE_NAMES
from memstream.projections.store.lance_store import LanceStore

_LOG_ROWS = "topic NOT LIKE 'lance:%'"


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
    assert store.count(POSITIONS, _LOG_ROWS) == 7
    assert store.prune_positions() == 4
    assert store.count(POSITIONS, _LOG_ROWS) == 3
    assert store.positions() == {("t", 0): 12, ("t", 1): 24, ("u", 0): 3}
    assert store.table_digest()[POSITIONS] == digest
    assert store.prune_positions() == 0


def test_a_save_publishes_the_versions_the_writer_left_each_table_at(tmp_path: Path) -> None:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    assert store.published_versions() == {}  # a set written before versions were published
    store.save_positions({("t", 0): 1})
    written = {n: int(store.table(n).version) for n in TABLE_NAMES if n != POSITIONS}
    assert store.published_versions() == written
    store.table(MEMORIES).delete("pk = 'none'")  # a commit (a new version) with no row
    store.save_positions({("t", 0): 2})
    store.save_positions({("t", 0): 3})  # nothing moved: no version row
    assert store.published_versions() == {**written, MEMORIES: written[MEMORIES] + 1}
    assert store.count(POSITIONS, "topic LIKE 'lance:%'") == len(written) + 1
    assert store.positions() == {("t", 0): 3}  # versions are no log positions
    assert store.positions_table().column("topic").to_pylist() == ["t"]
    reopened = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    assert reopened.published_versions() == store.published_versions()
