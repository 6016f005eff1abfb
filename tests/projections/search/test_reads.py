"""How search reads, on real LanceDB tables: lookups by id stay inside their memory
space, a failed list leaves no query running, and the cached counts behind the entity
boost follow every write.

Search and the store read rows by id (``<id> IN (...) AND pk IN (<scoped keys>)``,
``LanceStore.ids_where``) instead of by the space predicate. Two spaces here hold the
same memory and message ids with different rows, and ids that exist in one space only:
every lookup must return the asking space's row or nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.projections.projection_helpers import DIM, T0, link, memory, positioned

from memstream.domain.events import MessageObserved, Scope
from memstream.domain.ranking import RankingWeights, entity_boost, entity_idf
from memstream.projections.search import facts as search_facts, queries as search_queries, reads as search_reads
from memstream.projections.store.lance_async import wait
from memstream.projections.search.cache import SearchCache, space_key
from memstream.projections.embedders.factory import EmbedderUnavailableError, LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.schema import MESSAGES
from memstream.projections.search.hybrid import SearchFilters, search
from memstream.projections.store.lance_store import LanceStore

EMB = LocalEmbedder(DIM)
CACHE = SearchCache()
ANN = Scope(team_id="acme", user_id="ann")
EVE = Scope(team_id="acme", user_id="eve")


def _turn(scope: Scope, message_id: str, speaker: str, text: str, session: str | None = None) -> MessageObserved:
    return MessageObserved(
        scope=scope, message_id=message_id, speaker=speaker, content=text, session_id=session,
        occurred_at=T0, recorded_at=T0,
    )


def _store(tmp_path: Path, messages: list[Any], memories: list[Any]) -> LanceStore:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    projector = Projector(store, EMB)
    projector.apply(positioned(messages, topic="test.messages"))
    projector.apply(positioned(memories))
    return store


def test_message_id_is_indexed_on_open(tmp_path: Path) -> None:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    indexed = {c for idx in store.table(MESSAGES).list_indices() for c in idx.columns}
    assert "message_id" in indexed


def test_get_by_id_returns_only_the_asking_space(tmp_path: Path) -> None:
    store = _store(
        tmp_path,
        [_turn(ANN, "t1", "Ann", "ann's turn"), _turn(EVE, "t1", "Eve", "eve's turn"),
         _turn(EVE, "t-eve", "Eve", "only in eve's space")],
        [memory(ANN, "m1", "ann's memory"), memory(EVE, "m1", "eve's memory"),
         memory(EVE, "m-eve", "only in eve's space")],
    )
    for with_optimize in (False, True):  # unindexed fragments, then through the BTrees
        if with_optimize:
            store.optimize()
        assert [r["content"] for r in store.get_memories(ANN, ["m1", "m-eve"])] == ["ann's memory"]
        assert [r["content"] for r in store.get_memories(EVE, ["m-eve", "m1"])] == ["only in eve's space", "eve's memory"]
        assert [r["content"] for r in store.get_messages(ANN, ["t-eve", "t1"])] == ["ann's turn"]
        assert [(r["user_id"], r["speaker"]) for r in store.get_messages(EVE, ["t1"])] == [("eve", "Eve")]
    where = LanceStore.ids_where(ANN, "memory_id", ["o'brien"])
    assert where == "memory_id IN ('o''brien') AND pk IN ('acme|ann|o''brien')"


def test_a_successor_id_of_another_space_is_never_pulled(tmp_path: Path) -> None:
    # Ann's "old" is superseded by "new", which exists only in Eve's space
    store = _store(
        tmp_path,
        [],
        [memory(ANN, "old", "the lighthouse keeper retired"),
         memory(ANN, "other", "groceries on saturday"),
         memory(EVE, "new", "the lighthouse keeper retired to the coast"),
         link(ANN, "new", "old", "supersedes")],
    )
    store.optimize()
    results = search(store, EMB, ANN, "lighthouse keeper", k=5, cache=CACHE)
    assert results and results[0].memory_id == "old" and results[0].superseded_by == "new"
    assert all(r.user_id == "ann" for r in results)
    assert "new" not in [r.memory_id for r in results]
    assert [r.user_id for r in search(store, EMB, EVE, "lighthouse keeper", k=5, cache=CACHE)] == ["eve"]


def test_a_turn_of_another_space_never_lends_its_speaker(tmp_path: Path) -> None:
    # Ann's memory cites turn "t1", outside any session; only Eve's space has a "t1"
    # (said by Zed): the speaker prior must not see it
    store = _store(
        tmp_path,
        [_turn(EVE, "t1", "Zed", "I collect old maps")],
        [memory(ANN, "x", "collects old maps", source_message_ids=("t1",)),
         memory(EVE, "y", "Zed collects old maps", source_message_ids=("t1",))],
    )
    store.optimize()
    ann = search(store, EMB, ANN, "What does Zed collect?", k=1, cache=CACHE)[0]
    assert ann.memory_id == "x" and ann.parts.prior == 1.0
    eve = search(store, EMB, EVE, "What does Zed collect?", k=1, cache=CACHE)[0]
    assert eve.memory_id == "y" and eve.parts.prior > 1.0  # the same turn counts in its own space


def _session_store(tmp_path: Path) -> LanceStore:
    messages, memories = [], []
    for s in ("s1", "s2"):
        for i in range(4):
            mid = f"{s}-{i}"
            messages.append(_turn(ANN, mid, "Ann" if i % 2 else "Bob", f"turn {i} of {s} about kites?", s))
            memories.append(memory(ANN, f"m-{mid}", f"kites note {i} of {s}", source_message_ids=(mid,), session_id=s))
    return _store(tmp_path, messages, memories)


@pytest.mark.parametrize("failing", ["lancedb vector list", "kept vectors read"])
def test_a_failed_list_leaves_no_query_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    store = _session_store(tmp_path)
    assert search(store, EMB, ANN, "kites", k=3, cache=CACHE)  # the space's speakers are cached now
    CACHE.vectors.clear()
    stopped: list[str] = []

    async def slow_text(*args: Any, **kwargs: Any) -> Any:
        stopped.append("asked")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.append("text")
            raise
        raise AssertionError("the BM25 list outlived its search")

    async def broken(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.1)
        raise RuntimeError("vector search failed")

    monkeypatch.setattr(search_queries, "text_query", slow_text)
    # a filter makes LanceDB search the vectors; without one the space's kept vectors serve
    filters = SearchFilters(memory_types=("episodic",)) if failing == "lancedb vector list" else None
    monkeypatch.setattr(search_queries, "vector_query" if filters else "scan", broken)
    with pytest.raises(RuntimeError, match="vector search failed"):
        search(store, EMB, ANN, "kites", k=3, filters=filters, cache=CACHE)
    # LanceDB's BM25 list: cancelled and finished before search raised; a kept space's
    # lexical list comes from its read, so LanceDB is never asked
    assert stopped == (["asked", "text"] if filters else [])


BOOST = RankingWeights(entity_weight=0.3)
"""The entity boost is off by default; these tests weigh it to see its counts."""


def test_the_counts_behind_the_entity_boost_follow_writes(tmp_path: Path) -> None:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    projector = Projector(store, EMB)
    projector.apply(positioned([memory(ANN, "z", "Zed restores old clocks", entities=[("Zed", "person")]),
                                memory(ANN, "z2", "Zed collects stamps", entities=[("Zed", "person")]),
                                memory(EVE, "e", "Zed sails", entities=[("Zed", "person")])]))

    def boost() -> float:
        hit = search(store, EMB, ANN, "What does Zed restore?", k=1, cache=CACHE, weights=BOOST)[0]
        assert hit.memory_id == "z"
        return hit.parts.entity

    def expected() -> float:
        df = store.entity_frequencies(ANN, ["zed"])["zed"]
        return entity_boost([entity_idf(df, store.count_memories(ANN))], BOOST.entity_weight)

    first = boost()
    assert first == pytest.approx(expected()) and boost() == first  # the second search uses the cached counts
    projector.apply(positioned([memory(ANN, f"f{i}", f"filler about tides {i}") for i in range(6)], start=10))
    assert store.count_memories(ANN) == 8  # more memories, as many naming Zed: a larger boost
    second = boost()
    assert second == pytest.approx(expected()) and second > first
    projector.apply(positioned([memory(ANN, "z3", "Zed again", entities=[("Zed", "person")])], start=20))
    assert store.entity_frequencies(ANN, ["zed"])["zed"] == 3  # one more naming Zed: a smaller one
    third = boost()
    assert third == pytest.approx(expected()) and third < second


def test_a_failed_query_embedding_leaves_no_query_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _session_store(tmp_path)
    assert search(store, EMB, ANN, "kites", k=3, cache=CACHE)  # the space's speakers are cached now
    stopped: list[str] = []

    async def slow_text(*args: Any, **kwargs: Any) -> Any:
        stopped.append("asked")
        try:
            await asyncio.sleep(30)  # the BM25 list starts before the query is embedded
        except asyncio.CancelledError:
            stopped.append("text")
            raise
        raise AssertionError("the BM25 list outlived its search")

    class Down:
        model_id, dim = EMB.model_id, EMB.dim

        def embed(self, texts: Any) -> Any:
            raise EmbedderUnavailableError("embedding endpoint down")

    monkeypatch.setattr(search_queries, "text_query", slow_text)
    filters = SearchFilters(memory_types=("episodic",))  # LanceDB's lists (a kept space's lexical one is in-process)
    with pytest.raises(EmbedderUnavailableError, match="endpoint down"):
        search(store, Down(), ANN, "kites", k=3, filters=filters, cache=CACHE)  # type: ignore[arg-type]
    assert stopped == ["asked", "text"]


def test_kept_vectors_are_carried_to_a_new_version_without_reading_the_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit in another space carries the kept vectors as they are; one in this
    space brings in the rows it wrote (from the step's record), and a replaced row's
    old vector is gone: the same list a read of the space at the new version gives."""
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    projector = Projector(store, LocalEmbedder(DIM))
    ann, eve = Scope(team_id="acme", user_id="ann"), Scope(team_id="acme", user_id="eve")
    projector.apply(positioned([memory(ann, f"a{i}", f"Ann kept note {i} about kites") for i in range(4)]))
    cache = SearchCache()
    assert search(store, EMB, ann, "kites", k=3, cache=cache)
    reads: list[Any] = []
    read = search_reads.read_space_vectors

    async def counting(*args: Any) -> Any:
        reads.append(args)
        return await read(*args)

    monkeypatch.setattr(search_reads, "read_space_vectors", counting)
    projector.apply(positioned([memory(eve, "e1", "Eve flies kites")], start=10))
    assert search(store, EMB, ann, "kites", k=3, cache=cache)
    projector.apply(positioned([memory(ann, "a1", "Ann sold the kites"), memory(ann, "a9", "Ann bought a kite")], start=20))
    results = search(store, EMB, ann, "Ann sold the kites", k=3, cache=cache)
    assert reads == []  # carried twice, never read again
    assert results[0].memory_id == "a1"
    key = space_key(str(store.root), ann)
    kept = cache.vectors.latest(key)
    assert kept is not None
    fresh = wait(read(store, ann, kept.version))
    assert fresh is not None and kept.with_vectors()[0] == fresh.with_vectors()[0]
    assert kept.with_vectors()[1].tobytes() == fresh.with_vectors()[1].tobytes()


def test_a_space_counted_whole_answers_later_names_as_a_fresh_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small space's entity names are counted whole at the first miss: a name asked
    later is answered without a read, with what a fresh count gives (0 for a name no
    memory of the space carries, whichever other space carries it)."""
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    Projector(store, EMB).apply(positioned([
        memory(ANN, "z", "Zed restores old clocks", entities=[("Zed", "person")]),
        memory(ANN, "z2", "Zed and Uma collect stamps", entities=[("Zed", "person"), ("Uma", "person")]),
        memory(EVE, "e", "Ivo sails", entities=[("Ivo", "person")]),
    ]))
    cache = SearchCache()
    versions = wait(search_reads.read_versions(store))
    assert wait(search_facts.entity_stats(cache, store, ANN, ["Zed"], versions[0], versions[2])) == ({"zed": 2}, 2)
    scans: list[str] = []
    scan = search_queries.scan

    async def counted_scan(table: Any, where: str, *args: Any, **kwargs: Any) -> Any:
        scans.append(where)
        return await scan(table, where, *args, **kwargs)

    monkeypatch.setattr(search_queries, "scan", counted_scan)
    later = wait(search_facts.entity_stats(cache, store, ANN, ["Uma", "Ivo"], versions[0], versions[2]))
    assert scans == []  # counted whole at the first miss
    monkeypatch.setattr(search_queries, "scan", scan)
    fresh = wait(search_facts.entity_stats(SearchCache(), store, ANN, ["Uma", "Ivo"]))
    assert later == fresh == ({"uma": 1, "ivo": 0}, 2)
    assert store.entity_frequencies(ANN, ["uma", "ivo"]) == {"uma": 1, "ivo": 0}
