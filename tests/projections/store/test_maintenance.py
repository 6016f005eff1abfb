"""Indexes, compaction and the replay digest (``memstream.projections.store.maintenance``),
alone and beside the writer."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import lance

from tests.projections.projection_helpers import DIM, EVENTS_TOPIC, link, memory, positioned

from memstream.domain.events import Scope
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.schema import MEMORIES
from memstream.projections.search.hybrid import text_search, vector_search
from memstream.projections.store.lance_store import LanceStore
from memstream.projections.store.maintenance import compaction_target, replaced_versions
from memstream.settings.model import Settings

ALICE = Scope(team_id="acme", user_id="alice")


@contextmanager
def _repeated_beside(step: Callable[[], None]) -> Iterator[list[BaseException]]:
    """Run ``step`` over and over on another thread while the body runs, as the
    worker's maintenance thread runs beside its writer; yields the failure that
    stopped it, if any."""
    stop = threading.Event()
    failure: list[BaseException] = []

    def loop() -> None:
        try:
            while not stop.is_set():
                step()
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            failure.append(exc)

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        yield failure
    finally:
        stop.set()
        thread.join()


def test_full_text_finds_rows_written_after_the_index(store: LanceStore) -> None:
    emb = LocalEmbedder(DIM)
    projector = Projector(store, emb)
    projector.apply(positioned([memory(ALICE, "early", "the lighthouse keeper rowed home")]))
    store.optimize()  # folds the first row into the FTS index
    projector.apply(positioned([memory(ALICE, "late", "a lighthouse on the northern cape")], start=1))
    fts = next(i for i in store.table(MEMORIES).list_indices() if i.columns == ["content"])
    assert fts.num_unindexed_rows >= 1
    assert {r.memory_id for r in text_search(store, emb, ALICE, "lighthouse")} == {"early", "late"}
    store.optimize()
    fts = next(i for i in store.table(MEMORIES).list_indices() if i.columns == ["content"])
    assert fts.num_unindexed_rows == 0
    assert {r.memory_id for r in text_search(store, emb, ALICE, "lighthouse")} == {"early", "late"}


def test_optimize_compacts_small_writes(store: LanceStore) -> None:
    projector = Projector(store, LocalEmbedder(DIM))
    for i in range(6):
        projector.apply(positioned([memory(ALICE, f"m{i}", f"small write {i}")], start=i))
    before = len(store.table(MEMORIES).to_lance().get_fragments())
    store.optimize()
    after = len(store.table(MEMORIES).to_lance().get_fragments())
    assert before >= 6 and after == 1
    assert store.count(MEMORIES) == 6


def test_vector_index_is_built_at_the_threshold(tmp_path: Path) -> None:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM, vector_index_threshold=300)
    emb = LocalEmbedder(DIM)
    projector = Projector(store, emb)
    words = ["river", "mountain", "desert", "forest", "ocean", "valley", "island", "canyon"]
    events = [memory(ALICE, f"m{i}", f"{words[i % 8]} trip number {i} with {words[(i * 3) % 8]}") for i in range(299)]
    projector.apply(positioned(events))
    assert store.ensure_indexes() == {}
    assert not store.has_vector_index()
    projector.apply(positioned([memory(ALICE, "target", "glacier expedition with sled dogs")], start=299))
    assert store.ensure_indexes() == {MEMORIES: ["vector:IVF_PQ"]}
    assert store.has_vector_index()
    assert store.ensure_indexes() == {}  # idempotent
    hits = vector_search(store, emb, ALICE, "glacier expedition with sled dogs", k=3)
    assert hits[0].memory_id == "target"
    assert all((h.team_id, h.user_id) == ("acme", "alice") for h in hits)


def test_digest_depends_on_content_not_on_batching(tmp_path: Path) -> None:
    events = [memory(ALICE, f"m{i}", f"fact {i}") for i in range(20)] + [link(ALICE, "m1", "m0", "supersedes")]
    digests = []
    for name, cut in (("a", 21), ("b", 7), ("c", 1)):
        store = LanceStore(tmp_path / name, embedding_dim=DIM)
        projector = Projector(store, LocalEmbedder(DIM))
        batch = positioned(events)
        for i in range(0, len(batch), cut):
            projector.apply(batch[i : i + cut])
        digests.append(store.table_digest())
    assert digests[0] == digests[1] == digests[2]
    assert digests[0][MEMORIES][0] == 20

    other = LanceStore(tmp_path / "d", embedding_dim=DIM)
    changed = list(events)
    changed[5] = memory(ALICE, "m5", "a different fact")
    Projector(other, LocalEmbedder(DIM)).apply(positioned(changed))
    d = other.table_digest()
    assert d[MEMORIES] != digests[0][MEMORIES]
    assert d["links"] == digests[0]["links"]  # the very same link event
    assert d["positions"] == digests[0]["positions"]
    assert store.positions() == {(EVENTS_TOPIC, 0): 21}


def test_vector_index_builds_beside_the_writer(tmp_path: Path) -> None:
    """The worker trains IVF_PQ on its own thread while batches keep being written:
    LanceDB must accept both commits, and no row may be lost to the race."""
    import threading

    store = LanceStore(tmp_path / "lance", embedding_dim=DIM, vector_index_threshold=300)
    projector = Projector(store, LocalEmbedder(DIM))
    projector.apply(positioned([memory(ALICE, f"m{i}", f"seed memory number {i}") for i in range(3000)]))
    assert store.vector_index_due()

    failure: list[BaseException] = []

    def build() -> None:
        try:
            store.build_vector_index()
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            failure.append(exc)

    builder = threading.Thread(target=build)
    builder.start()
    written_during_build = 0
    offset = 3000
    while builder.is_alive() or written_during_build == 0:
        batch = [memory(ALICE, f"w{offset + i}", f"written while indexing {offset + i}") for i in range(50)]
        projector.apply(positioned(batch, start=offset))
        offset += 50
        if builder.is_alive():
            written_during_build += 50
    builder.join()
    assert not failure, failure
    assert written_during_build > 0
    assert store.has_vector_index() and not store.vector_index_due()
    assert store.count(MEMORIES) == offset  # every row of every batch, none twice
    assert projector.positions() == store.positions() == {(EVENTS_TOPIC, 0): offset}
    hits = vector_search(store, LocalEmbedder(DIM), ALICE, f"written while indexing {offset - 1}", k=1)
    assert hits[0].memory_id == f"w{offset - 1}"  # a row newer than the index is found


def test_index_updates_run_beside_the_writer(tmp_path: Path) -> None:
    """The worker folds new rows into the indexes on its own thread while batches
    (new memories and re-added ones) keep being written: neither may fail, and the
    indexes end up covering the rows."""
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    projector = Projector(store, LocalEmbedder(DIM))
    projector.apply(positioned([memory(ALICE, f"m{i}", f"seed memory number {i}") for i in range(500)]))
    updates: list[int] = []

    def update_indexes() -> None:
        store.optimize_indexes()
        updates.append(1)

    offset = 500
    with _repeated_beside(update_indexes) as failure:
        for round_ in range(30):
            batch = [memory(ALICE, f"w{offset + i}", f"fresh row {offset + i}") for i in range(20)]
            batch += [memory(ALICE, f"m{round_}", f"seed memory number {round_}, revised")]
            projector.apply(positioned(batch, start=offset))
            offset += len(batch)
    assert not failure, failure
    assert len(updates) >= 2  # the index updates really overlapped the writes
    assert store.count(MEMORIES) == 500 + 30 * 20  # re-added memories replaced in place
    store.optimize_indexes()
    mem = store.table(MEMORIES)
    mem.checkout_latest()
    assert all(mem.index_stats(ix.name).num_unindexed_rows == 0 for ix in mem.list_indices())
    assert [h.memory_id for h in text_search(store, None, ALICE, "revised", k=40)].count("m29") == 1


def test_compaction_runs_beside_an_appending_writer(tmp_path: Path) -> None:
    """The worker compacts on its maintenance thread while batches of new memories
    keep being appended: the writer never fails, compactions commit, and afterwards
    every row is there exactly once with few fragments left."""
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    projector = Projector(store, LocalEmbedder(DIM))
    compactions: list[int] = []

    def compact() -> None:
        try:
            compactions.append(store.compact(target_rows=1_000, refresh=False))
        except Exception as exc:  # noqa: BLE001 - only a lost race is acceptable
            if "conflict" not in str(exc).lower():
                raise

    offset = 0
    with _repeated_beside(compact) as failure:
        for _ in range(40):
            batch = [memory(ALICE, f"n{offset + i}", f"appended row {offset + i}") for i in range(25)]
            projector.apply(positioned(batch, start=offset))
            offset += len(batch)
    assert not failure, failure
    assert sum(compactions) >= 2  # compactions really committed while the writer wrote
    mem = store.table(MEMORIES)
    mem.checkout_latest()
    pks = mem.to_arrow().column("pk").to_pylist()
    assert len(pks) == len(set(pks)) == 1_000
    assert store.positions() == {(EVENTS_TOPIC, 0): 1_000}
    store.compact(target_rows=1_000)
    # Tiers of 4x (compaction_target): up to three fragments of a tier wait for a
    # fourth, and Lance merges only neighbouring fragments.
    sizes = [f.count_rows() for f in mem.to_lance().get_fragments()]
    assert len(sizes) <= 8 and max(sizes) >= 250, sizes


def test_compact_merges_small_fragments_only(tmp_path: Path) -> None:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    projector = Projector(store, LocalEmbedder(DIM))
    for i in range(12):  # twelve batches: twelve small fragments
        projector.apply(positioned([memory(ALICE, f"m{i}-{j}", f"batch {i} row {j}") for j in range(25)], start=i * 25))
    fragments = lambda: store.table(MEMORIES).to_lance().get_fragments()  # noqa: E731
    assert len(fragments()) >= 12
    assert store.compact(target_rows=100) >= 1
    sizes = sorted(f.count_rows() for f in fragments())
    assert sum(sizes) == 300 and len(sizes) <= 4  # 300 rows in fragments of about 100
    assert store.compact(target_rows=100) == 0 or len(fragments()) <= 4  # nothing left to merge
    store.optimize_indexes()
    assert [h.memory_id for h in text_search(store, None, ALICE, "batch 11 row 24", k=1)] == ["m11-24"]
    store.cleanup_versions()
    assert store.count(MEMORIES) == 300


def test_compaction_targets_grow_a_tier_once_it_holds_four_fragments() -> None:
    assert compaction_target([5, 7, 3], most=160) == 10  # tiers 10, 40, 160
    assert compaction_target([12, 15, 30, 3], most=160) == 10  # three in the 10-40 tier
    assert compaction_target([12, 15, 30, 39, 3], most=160) == 40
    assert compaction_target([40, 50, 90, 150, 12], most=160) == 160
    assert compaction_target([160, 160, 3], most=160) == 10  # full fragments are left alone


def test_compaction_leaves_a_settled_fragment_alone(tmp_path: Path) -> None:
    # A small table is not rewritten whole at each compaction: each copy would stay on
    # disk for the readers' grace (bench chaos: 2.7x a replayed shard).
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    projector = Projector(store, LocalEmbedder(DIM))
    projector.apply(positioned([memory(ALICE, f"s{j}", f"settled fact {j}") for j in range(50)]))
    for i in range(5):
        projector.apply(positioned([memory(ALICE, f"m{i}-{j}", f"batch {i} row {j}") for j in range(5)], start=50 + i * 5))
    fragments = lambda: {f.fragment_id: f.count_rows() for f in store.table(MEMORIES).to_lance().get_fragments()}  # noqa: E731
    before = fragments()
    settled = [fid for fid, n in before.items() if n == 50]
    assert len(settled) == 1 and len(before) == 6
    assert store.compact(target_rows=160) >= 1  # memories (the positions' rows may be merged too)
    after = fragments()
    assert after[settled[0]] == 50  # not rewritten
    assert sum(after.values()) == 75 and len(after) < len(before)
    assert store.count(MEMORIES) == 75


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _store(path: Path, reader_grace_s: float = 3600.0) -> LanceStore:
    settings = Settings(home=path.parent, embedding_dim=DIM, embedder="local", reader_grace_s=reader_grace_s)
    return LanceStore.from_settings(settings.storage, settings.embeddings.dim, path)


def _batches(projector: Projector, n: int, start: int = 0) -> int:
    """``n`` small batches of new memories (a version and a fragment each); the next offset."""
    offset = start
    for b in range(n):
        batch = [memory(ALICE, f"m{offset + i}", f"batch {b} fact {offset + i} about the harbor") for i in range(20)]
        projector.apply(positioned(batch, start=offset))
        offset += len(batch)
    return offset


def test_a_version_counts_as_old_from_when_it_was_replaced() -> None:
    now = time.time()
    versions = [(1, now - 600), (2, now - 400), (3, now - 5), (4, now - 1)]
    # v2 was committed long ago but was the newest until 5 s ago: a reader may be on it
    assert replaced_versions(versions, before=now - 30, below=99) == [1]
    assert replaced_versions(versions, before=now, below=99) == [1, 2, 3]  # the newest stays
    assert replaced_versions(reversed(versions), before=now, below=2) == [1]  # a handle on v2 keeps it


def test_maintenance_drops_versions_replaced_longer_ago_than_the_readers_grace(tmp_path: Path) -> None:
    """Writes over many versions, then compaction: within the readers' grace a reader
    on an older version still reads it; once the grace (the setting, made short here)
    has passed, the old versions go and the set is about the size of a replayed one."""
    live = tmp_path / "live"
    writer = _store(live)
    projector = Projector(writer, LocalEmbedder(DIM))
    end = _batches(projector, 30)
    memories = writer.table(MEMORIES)
    reader = lance.dataset(str(live / "memories.lance"), version=memories.version)  # a search under way
    assert writer.compact(target_rows=10_000) >= 1
    writer.optimize_indexes()
    assert writer.cleanup_versions() == 0  # every version was replaced within the grace
    assert reader.to_table(columns=["memory_id"]).num_rows == end
    grown = _bytes(live)

    end = _batches(projector, 1, start=end)  # the writer moves on
    writer.reader_grace = timedelta(0)  # and the grace passes
    assert writer.cleanup_versions() > 0
    assert [v["version"] for v in lance.dataset(str(live / "memories.lance")).versions()] == [memories.version]
    assert writer.count(MEMORIES) == end
    assert [h.memory_id for h in text_search(writer, None, ALICE, "fact 619 harbor", k=1)] == ["m619"]

    replayed = _store(tmp_path / "replayed", reader_grace_s=1e-6)  # nobody reads it yet
    Projector(replayed, LocalEmbedder(DIM)).apply(
        positioned([memory(ALICE, f"m{i}", f"batch {i // 20} fact {i} about the harbor") for i in range(end)])
    )
    replayed.optimize()
    assert _bytes(live) < grown / 2
    assert _bytes(live) <= 2 * _bytes(tmp_path / "replayed")


def test_cleanup_keeps_the_version_the_writer_is_on(tmp_path: Path) -> None:
    """Maintenance compacts beside the writer without moving the writer's handle; a
    cleanup after the grace must not drop that version, or the writer's next merge
    (re-added memories) reads files that are gone."""
    store = _store(tmp_path / "lance", reader_grace_s=1e-6)
    projector = Projector(store, LocalEmbedder(DIM))
    end = _batches(projector, 6)
    assert store.compact(target_rows=10_000, refresh=False) >= 1  # as the worker's maintenance does
    store.cleanup_versions()
    readded = [memory(ALICE, f"m{i}", f"fact {i}, revised") for i in range(3)]
    projector.apply(positioned(readded, start=end))
    assert store.count(MEMORIES) == end
    assert [h.memory_id for h in text_search(store, None, ALICE, "revised", k=5)].count("m1") == 1
