"""``memstream.projections.search.table_changes`` on real LanceDB tables: what a step between
two versions changed, per memory space, from Lance's record of each commit."""

from __future__ import annotations

from pathlib import Path

from tests.projections.projection_helpers import DIM, link, memory, positioned

from memstream.domain.events import Scope
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.schema import MEMORIES
from memstream.projections.store.lance_store import LanceStore
from memstream.projections.search.table_changes import TableChanges

ANN = Scope(team_id="acme", user_id="ann")
EVE = Scope(team_id="acme", user_id="eve")


def _setup(tmp_path: Path) -> tuple[LanceStore, Projector, TableChanges]:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    feed = TableChanges(str(tmp_path / "lance" / "memories.lance"), "memory_id", "session_id")
    return store, Projector(store, LocalEmbedder(DIM)), feed


def _version(store: LanceStore) -> int:
    return int(store.table(MEMORIES).version)


def test_appends_and_upserts_name_their_rows_and_sessions(tmp_path: Path) -> None:
    store, projector, feed = _setup(tmp_path)
    projector.apply(positioned([memory(ANN, "a1", "the keeper", session_id="s1"), memory(EVE, "e1", "maps")]))
    v1 = _version(store)
    projector.apply(positioned([memory(ANN, "a2", "the island", session_id="s2")], start=2))
    v2 = _version(store)
    changes = feed.between(v1, v2)
    assert changes is not None and changes.of("acme", "eve") is None
    ann = changes.of("acme", "ann")
    assert ann is not None and ann.ids == {"a2"} and ann.sessions == {"s2"}
    # a supersession rewrites the old row (an upsert): both ids are named
    projector.apply(positioned([link(ANN, "a2", "a1", "supersedes")], start=3))
    v3 = _version(store)
    ann = feed.between(v2, v3).of("acme", "ann")  # type: ignore[union-attr]
    assert ann is not None and "a1" in ann.ids
    union = feed.between(v1, v3)
    assert union is not None and {"a1", "a2"} <= union.of("acme", "ann").ids  # type: ignore[union-attr]
    assert feed.between(v3, v3) is not None and feed.between(v3, v3).of("acme", "ann") is None  # type: ignore[union-attr]


def test_compaction_and_index_updates_change_nothing(tmp_path: Path) -> None:
    store, projector, feed = _setup(tmp_path)
    for i in range(4):
        projector.apply(positioned([memory(ANN, f"a{i}", f"turn {i}", session_id="s1")], start=i))
    before = _version(store)
    assert store.compact(target_rows=1_000) >= 1
    store.optimize_indexes()
    after = _version(store)
    assert after > before
    changes = feed.between(before, after)
    assert changes is not None and changes.of("acme", "ann") is None


def test_a_compaction_of_indexed_fragments_changes_nothing(tmp_path: Path) -> None:
    # Lance records which indexes such a compaction remapped, and pylance 14 fails to
    # read that record back (a TypeError): the step was "cannot be told" and every
    # reader's caches of the table were dropped at every compaction
    store, projector, feed = _setup(tmp_path)
    for i in range(4):
        projector.apply(positioned([memory(ANN, f"a{i}", f"turn {i}", session_id="s1")], start=i))
    store.optimize_indexes()
    before = _version(store)
    assert store.compact(target_rows=1_000) >= 1
    after = _version(store)
    assert after > before
    changes = feed.between(before, after)
    assert changes is not None and changes.of("acme", "ann") is None
    projector.apply(positioned([memory(ANN, "a9", "after the compaction", session_id="s2")], start=9))
    later = feed.between(before, _version(store))
    assert later is not None and later.of("acme", "ann") is not None
    assert later.of("acme", "ann").ids == {"a9"}  # type: ignore[union-attr]


def test_a_delete_cannot_be_told(tmp_path: Path) -> None:
    store, projector, feed = _setup(tmp_path)
    projector.apply(positioned([memory(ANN, "a1", "the keeper"), memory(ANN, "a2", "the island")]))
    before = _version(store)
    store.table(MEMORIES).delete("memory_id = 'a1'")
    assert feed.between(before, _version(store)) is None
    assert feed.between(_version(store), before) is None  # backwards: never


def test_with_row_columns_a_step_keeps_the_rows_as_written_last(tmp_path: Path) -> None:
    store, projector, _ = _setup(tmp_path)
    feed = TableChanges(str(tmp_path / "lance" / "memories.lance"), "memory_id", "session_id", ("content",))
    projector.apply(positioned([memory(ANN, "a1", "the keeper")]))
    v1 = _version(store)
    projector.apply(positioned([memory(ANN, "a2", "the island"), memory(EVE, "e1", "maps")], start=1))
    projector.apply(positioned([link(ANN, "a2", "a1", "supersedes")], start=3))
    v3 = _version(store)
    ann = feed.between(v1, v3).of("acme", "ann")  # type: ignore[union-attr]
    assert ann is not None and ann.rows is not None
    assert sorted(ann.rows.column("memory_id").to_pylist()) == ["a1", "a2"]  # once each, the last copy
    assert set(ann.rows.column("user_id").to_pylist()) == {"ann"}
    eve = feed.between(v1, v3).of("acme", "eve")  # type: ignore[union-attr]
    assert eve is not None and eve.rows is not None and eve.rows.column("content").to_pylist() == ["maps"]


def test_without_read_a_step_not_read_yet_cannot_be_told(tmp_path: Path) -> None:
    store, projector, feed = _setup(tmp_path)
    projector.apply(positioned([memory(ANN, "a1", "the keeper", session_id="s1")]))
    v1 = _version(store)
    projector.apply(positioned([memory(ANN, "a2", "the island", session_id="s2")], start=1))
    v2 = _version(store)
    assert feed.between(v1, v2, read=False) is None  # never waits on a read
    read = feed.between(v1, v2)
    kept = feed.between(v1, v2, read=False)
    assert read is not None and kept is not None
    assert kept.of("acme", "ann") == read.of("acme", "ann")


def test_a_feed_following_many_versions_keeps_its_lance_cache_bounded(tmp_path: Path) -> None:
    # each step checks out a version: Lance's default cache (1 GiB) kept every manifest
    store, projector, _ = _setup(tmp_path)
    bound = 256 << 10
    feed = TableChanges(str(tmp_path / "lance" / "memories.lance"), "memory_id", "session_id", metadata_cache_bytes=bound)
    start = _version(store)
    for i in range(120):
        projector.apply(positioned([memory(ANN, f"a{i}", f"turn {i}", session_id="s1")], start=i))
        changes = feed.between(start, _version(store))
        assert changes is not None and f"a{i}" in changes.of("acme", "ann").ids  # type: ignore[union-attr]
    assert 0 < feed.cache_bytes() <= bound
