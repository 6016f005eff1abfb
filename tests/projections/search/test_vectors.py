"""The space's kept vectors give the vector list LanceDB's flat search gives, on real
tables: same memories, same order, same cosine distances; only the asking space's (and
pinned agent's) rows; equal distances in memory-id order, whatever the rows' order;
read again when ``memories`` moves; bounded in memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.projections.projection_helpers import DIM, memory, positioned

from memstream.domain.access import ReadScope
from memstream.domain.events import Scope
from memstream.projections.search import vectors as search_vectors
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.store.lance_async import wait
from memstream.projections.projector.projector import Projector
from memstream.projections.schema import MEMORIES
from memstream.projections.search.hybrid import SearchCache, SearchFilters, search
from memstream.projections.search.cache import space_key
from memstream.projections.search.queries import native, vector_query
from memstream.projections.search.results import LIST_COLUMNS
from memstream.projections.search.vectors import SpaceVectors, VectorCache, read_space_vectors
from memstream.projections.store.lance_store import LanceStore, space_where

EMB = LocalEmbedder(DIM)
ANN = Scope(team_id="acme", user_id="ann", agent_id="a1")
EVE = Scope(team_id="acme", user_id="eve")
TOPICS = ["kites in the wind", "sourdough starter", "the lighthouse keeper", "tide tables", "old maps",
          "a violin lesson", "pottery glaze", "night trains", "bee keeping", "chess openings"]


def _store(tmp_path: Path) -> tuple[LanceStore, Projector]:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    projector = Projector(store, EMB)
    events = [memory(ANN, f"a{i}", f"Ann wrote about {t}", session_id=f"s{i % 3}") for i, t in enumerate(TOPICS)]
    events += [memory(EVE, f"e{i}", f"Eve wrote about {t}") for i, t in enumerate(TOPICS)]
    projector.apply(positioned(events))
    return store, projector


def _version(store: LanceStore) -> int:
    return int(wait(native(store, MEMORIES).version()))


@pytest.mark.parametrize("query", ["kites", "a lighthouse on the coast", "chess and violin"])
def test_the_kept_list_is_lancedbs_flat_search(tmp_path: Path, query: str) -> None:
    store, _ = _store(tmp_path)
    kept = wait(read_space_vectors(store, ANN, _version(store)))
    assert kept is not None and sorted(kept.with_vectors()[0]) == sorted(f"a{i}" for i in range(len(TOPICS)))
    vector = EMB.embed([query])[0]
    ours = kept.nearest(vector, 4)
    theirs = wait(vector_query(native(store, MEMORIES), vector, space_where(ANN), 4, None, LIST_COLUMNS))
    assert ours.column("memory_id").to_pylist() == theirs.column("memory_id").to_pylist()
    assert ours.column("session_id").to_pylist() == theirs.column("session_id").to_pylist()
    np.testing.assert_allclose(ours.column("_distance").to_numpy(), theirs.column("_distance").to_numpy(), atol=1e-5)
    assert kept.nearest(vector, 100).num_rows == len(TOPICS)


def test_a_pinned_read_keeps_its_agents_vectors_only(tmp_path: Path) -> None:
    store, projector = _store(tmp_path)
    projector.apply(positioned([memory(Scope(team_id="acme", user_id="ann", agent_id="a2"), "b1", "kites")], start=100))
    pinned = wait(read_space_vectors(store, ReadScope.pinned(ANN), _version(store)))
    whole = wait(read_space_vectors(store, ANN, _version(store)))
    assert pinned is not None and whole is not None
    assert "b1" not in pinned.with_vectors()[0] and "b1" in whole.with_vectors()[0]


def test_search_reads_the_space_again_when_memories_move(tmp_path: Path) -> None:
    store, projector = _store(tmp_path)
    cache = SearchCache()
    assert search(store, EMB, ANN, "kites", k=3, cache=cache)
    key = space_key(str(store.root), ANN)
    first = _version(store)
    assert cache.vectors.rows() == len(TOPICS)
    projector.apply(positioned([memory(ANN, "new", "kites kites kites in the wind")], start=50))
    results = search(store, EMB, ANN, "kites kites kites in the wind", k=3, cache=cache)
    assert results[0].memory_id == "new"
    assert cache.vectors.rows() == len(TOPICS) + 1
    assert all(r.user_id == "ann" for r in results)
    assert cache.vectors.get(key, (0, 0, first)) is None  # the old version is gone


def test_a_filtered_search_leaves_the_kept_vectors_alone(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    cache = SearchCache()
    assert search(store, EMB, ANN, "kites", k=3, filters=SearchFilters(session_id="s0"), cache=cache)
    assert cache.vectors.rows() == 0


def test_a_space_larger_than_the_bound_is_left_to_lancedb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, _ = _store(tmp_path)
    monkeypatch.setattr(search_vectors, "SPACE_MAX_VECTORS", 5)
    assert wait(read_space_vectors(store, ANN, _version(store))) is None
    cache = SearchCache()
    kept = [r.memory_id for r in search(store, EMB, ANN, "kites", k=3, cache=cache)]
    assert cache.vectors.rows() == 0 and kept[0] == "a0"


def _vectors(n: int, version: int = 1) -> SpaceVectors:
    table = pa.table({
        "memory_id": [f"m{i}" for i in range(n)],
        "session_id": [None] * n,
        "source_message_ids": [[] for _ in range(n)],
        "content": [f"memory {i}" for i in range(n)],
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(np.ones(n * 4, dtype=np.float32)), 4),
    })
    return SpaceVectors.of(version, table)


def test_the_cache_keeps_its_bound_least_recently_used_first() -> None:
    cache = VectorCache(max_rows=10)
    cache.keep("a", _vectors(4))
    cache.keep("b", _vectors(4))
    assert cache.get("a", 1) is not None  # "b" is now the least recently used
    cache.keep("c", _vectors(4))
    assert cache.get("b", 1) is None and cache.get("a", 1) is not None and cache.rows() == 8
    assert cache.get("a", 2) is None  # another version is a miss
    cache.keep("huge", _vectors(11))
    assert cache.get("huge", 1) is None and cache.rows() == 8
    cache.clear()
    assert cache.rows() == 0


def test_the_list_does_not_depend_on_the_spaces_row_order() -> None:
    """Equal distances are ordered by memory id, not by the order the memories were
    committed (which depends on timing)."""
    ids = [f"m{i}" for i in range(8)]
    rng = np.random.default_rng(7)
    base = rng.normal(size=(3, 4)).astype(np.float32)
    vectors = {m: base[i % 3] for i, m in enumerate(ids)}  # three groups of equal vectors
    def space(order: list[str]) -> SpaceVectors:
        return SpaceVectors.of(1, pa.table({
            "memory_id": order,
            "session_id": [None] * len(order),
            "source_message_ids": [[] for _ in order],
            "content": [f"memory {m}" for m in order],
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate([vectors[m] for m in order])), 4),
        }))
    for limit in (1, 2, 4, 20):
        lists = [space(order).nearest(base[0], limit).column("memory_id").to_pylist()
                 for order in (ids, ids[::-1], ids[5:] + ids[:5])]
        assert lists[0] == lists[1] == lists[2], (limit, lists)


def _rows(rows: list[tuple[str, list[float] | None]]) -> pa.Table:
    """Rows as a read of the space gives them (``None``: a memory without a vector)."""
    return pa.table({
        "memory_id": [m for m, _ in rows],
        "session_id": [f"s{len(m) % 2}" for m, _ in rows],
        "source_message_ids": [[m] for m, _ in rows],
        "content": [f"memory {m}" for m, _ in rows],
        "vector": [v for _, v in rows],
    }, schema=_SCHEMA)


_SCHEMA = pa.schema([
    ("memory_id", pa.string()), ("session_id", pa.string()), ("source_message_ids", pa.list_(pa.string())),
    ("content", pa.string()), ("vector", pa.list_(pa.float32(), 4)),
])


_vector = st.one_of(st.none(), st.lists(st.sampled_from([-1.0, 0.0, 0.5, 2.0]), min_size=4, max_size=4))
_step = st.tuples(
    st.integers(0, 5),  # which earlier version the step starts from (counted back, modulo)
    st.sets(st.integers(0, 11), max_size=4),  # ids replaced
    st.lists(st.tuples(st.integers(0, 11), _vector), max_size=4, unique_by=lambda t: t[0]),  # rows written
)


@settings(max_examples=80, deadline=None)
@given(before=st.lists(_vector, max_size=8), steps=st.lists(_step, min_size=1, max_size=8))
def test_carried_vectors_are_the_vectors_of_the_rows_they_stand_for(
    before: list[list[float] | None], steps: list[tuple[int, set[int], list[tuple[int, list[float] | None]]]]
) -> None:
    """Each carried version (appended to the storage it shares with the one it came
    from, or copied) gives the nearest list of vectors read afresh, and the versions
    carried before it keep giving theirs."""
    first = [(f"m{i}", v) for i, v in enumerate(before)]
    versions = [(SpaceVectors.of(0, _rows(first)), first)]
    for back, replaced, written in steps:
        old, old_rows = versions[-1 - back % len(versions)]
        gone = {f"m{i}" for i in replaced} | {f"m{i}" for i, _ in written}
        new_rows = [(f"m{i}", v) for i, v in written]
        carried = old.carried(len(versions), gone, _rows(new_rows))
        versions.append((carried, [(m, v) for m, v in old_rows if m not in gone] + new_rows))
    for kept, rows in versions:
        fresh = SpaceVectors.of(0, _rows(rows))
        assert kept.with_vectors()[0] == fresh.with_vectors()[0]
        assert kept.with_vectors()[1].tobytes() == fresh.with_vectors()[1].tobytes()
        for query in ([1.0, 0.0, 0.0, 0.0], [0.5, -1.0, 2.0, 0.0]):
            ours, theirs = kept.nearest(query, 5), fresh.nearest(query, 5)
            assert ours.column("memory_id").to_pylist() == theirs.column("memory_id").to_pylist()
            assert ours.column("session_id").to_pylist() == theirs.column("session_id").to_pylist()
            np.testing.assert_allclose(ours.column("_distance").to_numpy(), theirs.column("_distance").to_numpy())
