"""LanceStore on disk: positions, schema checks, hash lookups, indexes, maintenance and
the replay digest."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from tests.projections.projection_helpers import DIM, EVENTS_TOPIC, link, memory, positioned

from memstream.domain.access import ReadScope
from memstream.domain.content import content_hash
from memstream.domain.events import Scope
from memstream.projections.embedder import LocalEmbedder
from memstream.projections.projector import Projector
from memstream.projections.schema import ENTITIES, MEMORIES, MESSAGES, POSITIONS, TABLE_NAMES
from memstream.projections.search import text_search, vector_search
from memstream.projections.store import LanceStore, ScopeRequiredError, StoreError, quote, space_where

ALICE = Scope(team_id="acme", user_id="alice")
BOB = Scope(team_id="acme", user_id="bob")
EVE = Scope(team_id="evil", user_id="alice")


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


def _data_bytes(table_dir: Path) -> bytes:
    return b"".join(f.read_bytes() for f in sorted((table_dir / "data").glob("*.lance")))


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


def test_positions_round_trip_and_survive_reopen(tmp_path: Path) -> None:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    assert store.positions() == {}
    store.save_positions({("a.events", 0): 5, ("a.events", 2): 9, ("a.messages", 1): 3})
    store.save_positions({("a.events", 0): 6})
    reopened = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    assert reopened.positions() == {("a.events", 0): 6, ("a.events", 2): 9, ("a.messages", 1): 3}


def test_find_hashes_is_scoped_and_exact_across_the_space(store: LanceStore) -> None:
    projector = Projector(store, LocalEmbedder(DIM))
    texts = [f"fact number {i}" for i in range(1_200)]  # more than one IN-list chunk
    projector.apply(positioned([memory(ALICE, f"a{i}", t) for i, t in enumerate(texts)]))
    projector.apply(positioned([memory(BOB, "b0", texts[0]), memory(EVE, "e0", "only eve")], start=1_200))
    wanted = [content_hash(t) for t in texts] + [content_hash("only eve"), content_hash("never stored")]
    found = store.find_hashes(ALICE, wanted)
    assert len(found) == 1_200
    assert found[content_hash("fact number 1199")] == "a1199"
    # normalised content: case and whitespace do not matter
    assert store.find_hashes(ALICE, [content_hash("  FACT   number 7 ")]) == {content_hash("fact number 7"): "a7"}
    assert store.find_hashes(BOB, wanted) == {content_hash(texts[0]): "b0"}
    assert store.find_hashes(Scope(team_id="evil", user_id="bob"), wanted) == {}


def test_find_hashes_in_spaces_answers_each_space_alone_in_one_query(store: LanceStore) -> None:
    # two spaces whose "team/user" strings are equal ("a/b" + "c" and "a" + "b/c")
    left, right = Scope(team_id="a/b", user_id="c"), Scope(team_id="a", user_id="b/c")
    projector = Projector(store, LocalEmbedder(DIM))
    projector.apply(
        positioned(
            [
                memory(left, "l0", "shared words"),
                memory(left, "l1", "only left asked"),
                memory(right, "r0", "only right has"),
                memory(right, "r1", "only left asked"),  # stored here, asked only by left
                memory(ALICE, "a0", "shared words"),
                memory(BOB, "b0", "bob alone"),
            ]
        )
    )
    h = content_hash
    found = store.find_hashes_in_spaces(
        {
            ReadScope("a/b", "c"): [h("shared words"), h("only left asked")],
            ReadScope("a", "b/c"): [h("shared words"), h("only right has")],
            ReadScope("acme", "alice"): [h("shared words"), h("bob alone"), ""],
            ReadScope("acme", "nobody"): [h("shared words")],
        }
    )
    assert found == {
        ReadScope("a/b", "c"): {h("shared words"): "l0", h("only left asked"): "l1"},
        ReadScope("a", "b/c"): {h("only right has"): "r0"},  # left's "shared words" is not right's
        ReadScope("acme", "alice"): {h("shared words"): "a0"},  # Bob's memory was not Alice's question
    }
    # the same answers as one space at a time
    for sc, answer in found.items():
        asked = [h("shared words"), h("only left asked"), h("only right has"), h("bob alone")]
        assert {k: v for k, v in store.find_hashes(Scope(team_id=sc.team_id, user_id=sc.user_id), asked).items()
                if k in answer} == answer
    with pytest.raises(ScopeRequiredError):
        store.find_hashes_in_spaces({ReadScope("", "alice"): [h("shared words")]})


def test_find_hashes_pinned_to_an_agent_sees_that_agent_only(store: LanceStore) -> None:
    # the extractor's exact dedup for an agent's turns: another agent's memory of the
    # same text is neither a duplicate nor an answer (it would be an oracle)
    planner = Scope(team_id="acme", user_id="alice", agent_id="planner")
    spy = Scope(team_id="acme", user_id="alice", agent_id="spy")
    Projector(store, LocalEmbedder(DIM)).apply(
        positioned([memory(planner, "p0", "the launch code is 1234"), memory(spy, "s0", "spy text")])
    )
    h = content_hash
    asked = [h("the launch code is 1234"), h("spy text")]
    assert store.find_hashes(ReadScope.pinned(spy), asked) == {h("spy text"): "s0"}
    assert store.find_hashes(ReadScope.pinned(planner), asked) == {h("the launch code is 1234"): "p0"}
    both = store.find_hashes_in_spaces({ReadScope.pinned(spy): asked, ReadScope.pinned(planner): asked})
    assert both == {
        ReadScope.pinned(spy): {h("spy text"): "s0"},
        ReadScope.pinned(planner): {h("the launch code is 1234"): "p0"},
    }
    assert store.find_hashes(planner, asked) == {h("the launch code is 1234"): "p0", h("spy text"): "s0"}


def test_find_hashes_prefers_the_current_memory(store: LanceStore) -> None:
    projector = Projector(store, LocalEmbedder(DIM))
    projector.apply(
        positioned(
            [
                memory(ALICE, "first", "same words"),
                memory(ALICE, "second", "same words"),
                link(ALICE, "first", "second", "duplicates"),
            ]
        )
    )
    assert store.find_hashes(ALICE, [content_hash("same words")]) == {content_hash("same words"): "second"}


def test_scope_is_required_for_lookups(store: LanceStore) -> None:
    with pytest.raises(ScopeRequiredError):
        store.find_hashes(None, ["x"])  # type: ignore[arg-type]
    with pytest.raises(ScopeRequiredError):
        store.get_memory(None, "x")  # type: ignore[arg-type]
    assert space_where(ALICE) == "team_id = 'acme' AND user_id = 'alice'"
    assert quote("o'brien") == "'o''brien'"
    with pytest.raises(ValueError):
        quote("nul\x00byte")


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
    assert len(mem.to_lance().get_fragments()) <= 3


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


def test_new_keys_are_appended_known_ones_merged(tmp_path: Path) -> None:
    """Rows of unseen keys take the cheap append; a key the table holds (even one
    written before the store was reopened) is updated in place, never duplicated."""
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    projector = Projector(store, LocalEmbedder(DIM))
    alice = Scope(team_id="acme", user_id="alice")
    projector.apply(positioned([memory(alice, f"m{i}", f"fact number {i}") for i in range(5)]))
    assert store.count(MEMORIES) == 5
    reopened = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    again = Projector(reopened, LocalEmbedder(DIM))
    batch = positioned(
        [memory(alice, "m2", "fact number two, restated"), memory(alice, "m9", "a new fact")], start=5
    )
    result = again.apply(batch)
    assert result.applied == 2
    assert reopened.count(MEMORIES) == 6
    assert reopened.get_memories(alice, ["m2"])[0]["content"] == "fact number two, restated"
    # the same upsert twice (a crash before the positions were saved) adds nothing
    rows = reopened.table(MEMORIES).to_arrow()
    assert reopened.upsert(MEMORIES, rows) == (0, 6)
    assert reopened.count(MEMORIES) == 6
    for name in (MEMORIES, MESSAGES, ENTITIES):
        pks = reopened.table(name).to_arrow().column("pk").to_pylist()
        assert len(pks) == len(set(pks))


_FIRST_WRITE = """
import sys, tempfile
from pathlib import Path
from tests.projections.projection_helpers import DIM, memory, positioned
from memstream.domain.events import Scope
from memstream.projections.embedder import LocalEmbedder
from memstream.projections.projector import Projector
from memstream.projections.store import LanceStore
projector = Projector(LanceStore(Path(tempfile.mkdtemp()), embedding_dim=DIM), LocalEmbedder(DIM))
before = set(sys.modules)
projector.apply(positioned([memory(Scope(team_id="t", user_id="u"), "m1", "Alice likes tea")]))
print(sorted(set(sys.modules) - before))
"""


def test_the_first_write_imports_nothing() -> None:
    """What the first batch would load on its way is loaded when the writer starts
    (``prepare_writes``), in a fresh interpreter as the worker is."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _FIRST_WRITE], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
