"""The search cache carried across table versions (``SearchCache.space_cache`` with
``memstream.projections.search.table_changes``), on real LanceDB tables.

The property: whatever the projector commits between searches (new turns and
memories in new or cached sessions, in this space or another, supersessions,
compactions, index updates), a search served from the carried cache returns exactly
what a fresh, cache-less search returns at the same table version (scores to float32
rounding: a kept vector's similarity can differ in its last bit with the row's place
in the matrix, which a compaction changes), and no entry ever
holds another space's row. And the point of carrying: a commit in one space leaves
another space's cached sessions in place, and a commit into a cached session brings
its rows into it (the next search reads no session)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.projections.projection_helpers import DIM, T0, link, memory, positioned

from memstream.domain.events import MemoryAdded, MessageObserved, Scope
from memstream.projections.search import queries as search_queries
from memstream.projections.search.cache import SearchCache, space_key
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.search.hybrid import SearchResult, search
from memstream.projections.store.lance_async import wait
from memstream.projections.schema import MEMORIES
from memstream.projections.search.reads import read_versions
from memstream.projections.search.results import READ_COLUMNS, ScoreParts, rows_of
from memstream.projections.search.turns import SessionMemories
from memstream.projections.store.lance_store import LanceStore, space_where

EMB = LocalEmbedder(DIM)
CACHE = SearchCache()
SPACES = (
    Scope(team_id="acme", user_id="ann"),
    Scope(team_id="acme", user_id="eve"),  # same team, another user
    Scope(team_id="globex", user_id="ann"),  # same user id, another team
)
WORDS = ("pottery", "workshop", "keeper", "island", "coffee", "train", "sister", "garden", "maps", "clocks")
QUERIES = ("What did Ann take from the pottery workshop?", "Who keeps the island lighthouse?", "garden coffee")
NOW = T0 + timedelta(days=3)


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    CACHE.clear()
    yield
    CACHE.clear()


class Log:
    """A projector over a store; turns and memories at growing offsets, with the
    memory ids written so far per space (for supersessions)."""

    def __init__(self, store: LanceStore) -> None:
        self.store = store
        self.projector = Projector(store, EMB)
        self.offsets = {"t.messages": 0, "t.events": 0}
        self.n = 0
        self.written: dict[Scope, list[str]] = {s: [] for s in SPACES}

    def _apply(self, topic: str, events: list[Any]) -> None:
        self.projector.apply(positioned(events, topic=topic, start=self.offsets[topic]))
        self.offsets[topic] += len(events)

    def turns(self, scope: Scope, session: str, words: list[int]) -> None:
        """One turn per word index, each with a memory drawn from it."""
        turns, memories = [], []
        for w in words:
            self.n += 1
            text = f"{('Ann', 'Bob')[self.n % 2]}: the {WORDS[w]} and the {WORDS[(w + self.n) % len(WORDS)]}"
            mid = f"{session}-{self.n}"
            when = T0 + timedelta(minutes=self.n)
            turns.append(MessageObserved(scope=scope, message_id=mid, speaker=("Ann", "Bob")[self.n % 2],
                                         content=text, session_id=session, occurred_at=when, recorded_at=when))
            memories.append(memory(scope, f"m-{mid}", text, source_message_ids=(mid,), session_id=session,
                                   occurred_at=when))
            self.written[scope].append(f"m-{mid}")
        self._apply("t.messages", turns)
        self._apply("t.events", memories)

    def supersede(self, scope: Scope, which: int) -> None:
        if not self.written[scope]:
            return
        old = self.written[scope][which % len(self.written[scope])]
        self.n += 1
        new: MemoryAdded = memory(scope, f"new-{self.n}", f"Ann: the {WORDS[self.n % len(WORDS)]} changed")
        self.written[scope].append(new.memory_id)
        self._apply("t.events", [new, link(scope, new.memory_id, old, "supersedes")])


def _search(store: LanceStore, scope: Scope, query: str) -> list[SearchResult]:
    return search(store, EMB, scope, query, k=6, now=NOW, cache=CACHE)


def _without_scores(found: dict[Any, list[SearchResult]]) -> dict[Any, list[SearchResult]]:
    """The results with every score zeroed (a score's absence kept)."""
    def bare(r: SearchResult) -> SearchResult:
        parts = {k: None if v is None else 0.0 for k, v in dataclasses.asdict(r.parts).items()}
        return dataclasses.replace(r, score=0.0, parts=ScoreParts(**parts))
    return {key: [bare(r) for r in results] for key, results in found.items()}


def _scores(found: dict[Any, list[SearchResult]]) -> list[float]:
    return [
        v for results in found.values() for r in results
        for v in (r.score, *dataclasses.asdict(r.parts).values()) if v is not None
    ]


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def _check_isolation(root: str) -> None:
    for scope in SPACES:
        entry = CACHE.entry_of(root, scope)
        if entry is None:
            continue
        rows = [r for r in entry.memories.values() if r is not None]
        assert {(r["team_id"], r["user_id"]) for r in rows} <= {(scope.team_id, scope.user_id)}
        for ids in entry.session_memories.values():
            assert all(isinstance(entry.memories.get(m), dict) for m in ids.memory_ids)


def _lexical_lists(root: str, log: Log) -> dict[tuple[Scope, str], list[tuple[str, float]]]:
    """Each space's kept BM25 list of each query (as the last search kept it); the
    index holds the space's memories, every one and no other."""
    lists = {}
    for scope in SPACES:
        kept = CACHE.vectors.latest(space_key(root, scope))
        assert kept is not None
        assert sorted(kept.text.ids.to_pylist()) == sorted(log.written[scope])
        for query in QUERIES:
            table = kept.text.best(query, 60)
            lists[(scope, query)] = list(zip(table.column("memory_id").to_pylist(), table.column("_score").to_pylist()))
    return lists


_space = st.integers(0, len(SPACES) - 1)
_action = st.one_of(
    st.tuples(st.just("turns"), _space, st.integers(0, 2), st.lists(st.integers(0, len(WORDS) - 1), min_size=1,
                                                                      max_size=3)),
    st.tuples(st.just("supersede"), _space, st.integers(0, 50)),
    st.tuples(st.just("compact")),
    st.tuples(st.just("indexes")),
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=st.lists(_action, min_size=1, max_size=6))
def test_a_carried_cache_answers_as_a_fresh_search_at_the_same_version(
    tmp_path_factory: pytest.TempPathFactory, actions: list[tuple[Any, ...]]
) -> None:
    CACHE.clear()
    path = tmp_path_factory.mktemp("carry")
    log = Log(LanceStore(path / "lance", embedding_dim=DIM))
    reader = LanceStore(path / "lance", embedding_dim=DIM, read_consistency_interval=timedelta(0), create=False)
    for scope in SPACES:
        log.turns(scope, "s0", [0, 1, 2, 3])
    root = str(reader.root)
    for action in actions:
        for scope in SPACES:  # warm every space at the current version
            for query in QUERIES:
                _search(reader, scope, query)
        if action[0] == "turns":
            log.turns(SPACES[action[1]], f"s{action[2]}", list(action[3]))
        elif action[0] == "supersede":
            log.supersede(SPACES[action[1]], action[2])
        elif action[0] == "compact":
            log.store.compact()
        else:
            log.store.optimize_indexes()
        warm = {(s, q): _search(reader, s, q) for s in SPACES for q in QUERIES}
        _check_isolation(root)
        carried = _lexical_lists(root, log)
        CACHE.clear()
        cold = {(s, q): _search(reader, s, q) for s in SPACES for q in QUERIES}
        assert _without_scores(warm) == _without_scores(cold)
        assert all(map(_close, _scores(warm), _scores(cold)))
        assert carried == _lexical_lists(root, log)  # the kept BM25 indexes too, scores and all
        for (scope, _), results in warm.items():
            assert all((r.team_id, r.user_id) == (scope.team_id, scope.user_id) for r in results)


def test_a_commit_in_one_space_leaves_another_spaces_sessions_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Log(LanceStore(tmp_path / "lance", embedding_dim=DIM))
    ann, eve = SPACES[0], SPACES[1]
    log.turns(ann, "s0", [0, 1, 2, 3, 4])
    log.turns(eve, "s0", [5, 6, 7])
    reads: list[str] = []
    scan = search_queries.scan

    async def counting(table: Any, where: str, columns: Any, limit: int | None = None) -> Any:
        if "session_id IN" in where:
            reads.append(where)
        return await scan(table, where, columns, limit)

    monkeypatch.setattr(search_queries, "scan", counting)
    first = _search(log.store, ann, QUERIES[0])
    assert reads  # cold: the session was read
    reads.clear()
    log.turns(eve, "s0", [8, 9])  # new versions of both tables, none of Ann's rows
    assert _search(log.store, ann, QUERIES[0]) == first
    assert reads == []  # carried: Ann's sessions are still cached
    assert CACHE.stats()["change_steps"] >= 2  # each table's step, kept to carry by (the metrics' gauge)
    log.turns(ann, "s0", [0])  # Ann's session grows: brought forward with the rows written
    after = _search(log.store, ann, QUERIES[0])
    assert reads == []
    assert after == _cold(log.store, ann, QUERIES[0])
    assert len(reads) == 2  # the cold search read the session's turns and its memories


def _cold(store: LanceStore, scope: Scope, query: str) -> list[SearchResult]:
    CACHE.clear()
    return _search(store, scope, query)


def test_rows_read_before_a_commit_are_filed_in_the_entry_it_moved_on_to(tmp_path: Path) -> None:
    """A search slower than the commits beside it: what it read at the old version is
    filed in the newer entry, without what the commits in between wrote."""
    log = Log(LanceStore(tmp_path / "lance", embedding_dim=DIM))
    ann = SPACES[0]
    log.turns(ann, "s0", [0, 1, 2])
    log.turns(ann, "s1", [3, 4])
    root = str(log.store.root)
    old_m, old_t, _ = wait(read_versions(log.store))
    old = CACHE.space_cache(root, ann, old_m, old_t)
    rows = rows_of(log.store.rows(MEMORIES, space_where(ann), list(READ_COLUMNS)), ann)  # read at the old version
    sessions = {s: SessionMemories([r for r in rows if r["session_id"] == s]) for s in ("s0", "s1")}
    log.turns(ann, "s1", [5])  # a commit into s1 meanwhile, and another search carries the entry
    new_m, new_t, _ = wait(read_versions(log.store))
    new = CACHE.space_cache(root, ann, new_m, new_t)
    assert new is not old
    CACHE.add_memories(old, old_m, rows, ["m-nowhere"], sessions)
    assert set(new.session_memories) == {"s0"}  # s1 changed: left out
    assert {r["memory_id"] for r in rows} <= {m for m, r in new.memories.items() if r is not None}
    assert new.memories.get("m-nowhere", "missing") is None  # still absent at the new version
    for query in QUERIES:
        warm = _search(log.store, ann, query)
        assert warm == _cold(log.store, ann, query)
