"""Opening a table set (``memstream.projections.store.tables``): tables created or checked,
readers that create nothing, text storage."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from tests.projections.projection_helpers import DIM, memory, positioned

from memstream.domain.content import content_hash
from memstream.domain.events import Scope
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.schema import MEMORIES, TABLE_NAMES
from memstream.projections.search.hybrid import text_search
from memstream.projections.store.lance_store import LanceStore, StoreError

ALICE = Scope(team_id="acme", user_id="alice")


def _data_bytes(table_dir: Path) -> bytes:
    return b"".join(f.read_bytes() for f in sorted((table_dir / "data").glob("*.lance")))


def test_tables_exist_and_reopen(tmp_path: Path) -> None:
    root = tmp_path / "lance"
    LanceStore(root, embedding_dim=DIM)
    again = LanceStore(root, embedding_dim=DIM)
    assert sorted(p.name for p in root.iterdir()) == sorted(f"{t}.lance" for t in TABLE_NAMES)
    assert all(again.count(t) == 0 for t in TABLE_NAMES)
    with pytest.raises(StoreError, match="32-dimension"):
        LanceStore(root, embedding_dim=DIM * 2)


def test_a_reader_opens_an_existing_table_set_without_creating_anything(tmp_path: Path) -> None:
    root = tmp_path / "lance"
    with pytest.raises(StoreError, match="no table"):
        LanceStore(root, embedding_dim=DIM, create=False)
    assert not root.exists()  # nothing created, not even the directory
    writer = LanceStore(root, embedding_dim=DIM)
    Projector(writer, LocalEmbedder(DIM)).apply(positioned([memory(ALICE, "a1", "Alice likes tea")]))
    indexes = {t: [i.name for i in writer.table(t).list_indices()] for t in TABLE_NAMES}
    reader = LanceStore(root, embedding_dim=DIM, create=False)
    assert reader.find_hashes(ALICE, [content_hash("Alice likes tea")]) == {content_hash("Alice likes tea"): "a1"}
    assert {t: [i.name for i in reader.table(t).list_indices()] for t in TABLE_NAMES} == indexes
    with pytest.raises(StoreError, match="32-dimension"):
        LanceStore(root, embedding_dim=DIM * 2, create=False)


def test_a_table_its_writer_is_still_creating_reads_as_missing_and_the_writer_finishes_it(tmp_path: Path) -> None:
    # LanceDB lists a table's directory before its first version exists: a reader
    # opening then gets "not yet", not LanceDB's own error (CI saw that race once).
    root = tmp_path / "lance"
    (root / f"{MEMORIES}.lance").mkdir(parents=True)
    with pytest.raises(StoreError, match=f"no table {MEMORIES} yet"):
        LanceStore(root, embedding_dim=DIM, create=False)
    writer = LanceStore(root, embedding_dim=DIM)
    Projector(writer, LocalEmbedder(DIM)).apply(positioned([memory(ALICE, "a1", "Alice likes tea")]))
    assert LanceStore(root, embedding_dim=DIM, create=False).count(MEMORIES) == 1


def test_tables_store_their_text_uncompressed(tmp_path: Path) -> None:
    """The tables are created with every string column uncompressed (the projector
    writes at the rate of the log; compressing the texts doubled the cost of a write),
    and Lance honours it: the written text is in the data files as it is (compressed,
    none of them would be: Lance compresses these 2,000 texts by default)."""
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    for name in TABLE_NAMES:
        strings = [f for f in store.table(name).schema if f.type == "string"]
        assert strings and all((f.metadata or {}).get(b"lance-encoding:compression") == b"none" for f in strings), name
    text = "Alice keeps her grandmother's recipe for plum dumplings in a blue tin"
    memories = [memory(ALICE, f"m{i}", f"{text} number {i:04d}") for i in range(2000)]
    Projector(store, LocalEmbedder(DIM)).apply(positioned(memories))
    written = _data_bytes(tmp_path / "lance" / f"{MEMORIES}.lance")
    assert all(f"{text} number {i:04d}".encode() in written for i in range(2000))


def test_a_table_set_created_with_compressed_text_is_still_written_and_read(tmp_path: Path) -> None:
    """Tables created before the text was stored uncompressed keep their format."""
    import lancedb
    import pyarrow as pa

    from memstream.projections.schema import schema_for

    root = tmp_path / "lance"
    db = lancedb.connect(str(root))
    for name in TABLE_NAMES:
        plain = pa.schema([f.remove_metadata() for f in schema_for(name, DIM)])
        db.create_table(name, schema=plain)
    store = LanceStore(root, embedding_dim=DIM)
    assert all(f.metadata is None for f in store.table(MEMORIES).schema)
    emb = LocalEmbedder(DIM)
    Projector(store, emb).apply(positioned([memory(ALICE, "a1", "Alice likes tea")]))
    assert [r.memory_id for r in text_search(store, emb, ALICE, "tea")] == ["a1"]


def test_a_reader_following_many_commits_keeps_lancedbs_caches_bounded(tmp_path: Path) -> None:
    # each commit is a version with its own manifest: a reader that reads after every one
    # of them cached them all (LanceDB's default bound is 1 GiB)
    root = tmp_path / "lance"
    writer = LanceStore(root, embedding_dim=DIM)
    projector = Projector(writer, LocalEmbedder(DIM))
    bound = 256 << 10
    reader = LanceStore(
        root, embedding_dim=DIM, create=False, read_consistency_interval=timedelta(0), metadata_cache_bytes=bound
    )
    for i in range(120):
        projector.apply(positioned([memory(ALICE, f"a{i}", f"Alice note {i}")], start=i))
        assert reader.count(MEMORIES) == i + 1
    assert 0 < reader.cache_bytes() <= 2 * bound  # the cache evicts approximately; unbounded: 6.5 MB here


def test_a_reader_following_index_updates_keeps_lancedbs_index_cache_bounded(tmp_path: Path) -> None:
    # every index update (the worker's maintenance, every 10 s) is a new index: a reader
    # searching after each one kept every old one under LanceDB's default bound, 6 GiB
    root = tmp_path / "lance"
    writer = LanceStore(root, embedding_dim=DIM)
    projector = Projector(writer, LocalEmbedder(DIM))
    readers = {
        bound: LanceStore(
            root, embedding_dim=DIM, create=False, read_consistency_interval=timedelta(0),
            metadata_cache_bytes=1 << 20, index_cache_bytes=bound,
        )
        for bound in (6 << 30, 128 << 10)
    }
    sizes: dict[int, list[int]] = {bound: [] for bound in readers}
    for i in range(60):
        projector.apply(positioned([memory(ALICE, f"a{i}", f"Alice note {i} about plum dumplings")], start=i))
        writer.optimize_indexes()
        for bound, reader in readers.items():
            assert len(text_search(reader, None, ALICE, "dumplings", k=100)) == i + 1  # the FTS index
            assert reader.memory_owner(ALICE, f"a{i}") is not None  # the BTree on memory_id
            sizes[bound].append(reader.cache_bytes())
    unbounded, bounded = sizes[6 << 30], sizes[128 << 10]
    assert unbounded[-1] - unbounded[19] > 256 << 10  # old indexes pile up
    assert bounded[-1] - bounded[19] < 64 << 10  # evicted: flat from the bound on
