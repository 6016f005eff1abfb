"""The search cache (``memstream.projections.search.cache.SearchCache``) on real LanceDB tables:
a warm cache returns exactly what a cold one does, sees every write (in the same
process and through a reader's own handle), never mixes memory spaces, keeps the
search's filters, and stays within its bound.

Each scenario compares a search served from the cache with the same search after
``CACHE.clear()`` (everything read again), and checks that the cache was
really used (a warm search reads no session)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from memstream.domain.events import MemoryAdded, MessageObserved, Scope
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.search import cache as search_cache
from memstream.projections.search import queries as search_queries
from memstream.projections.search import reads as search_reads
from memstream.projections.search.cache import SearchCache
from memstream.projections.search.hybrid import SearchFilters, SearchResult, search
from memstream.projections.store.lance_store import LanceStore
from tests.projections.projection_helpers import DIM, T0, link, memory, positioned

EMB = LocalEmbedder(DIM)
CACHE = SearchCache()  # what the serving process holds; cleared around each test
ANN = Scope(team_id="acme", user_id="ann")
EVE = Scope(team_id="acme", user_id="eve")
FILLER = [
    ("Ann", "The weather was lovely on the coast."),
    ("Bob", "I fixed the bicycle chain again."),
    ("Ann", "Dinner with my sister went well."),
    ("Bob", "The new office chairs arrived."),
]
QUESTION = ("Bob", "What did you take away from the pottery workshop?")
ANSWER = ("Ann", "Mostly patience, and that mistakes are part of it.")
QUERY = "What did Ann take away from the pottery workshop?"
NOW = T0 + timedelta(days=3)  # one clock for every search compared (recency)


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    CACHE.clear()
    yield
    CACHE.clear()


def _turn(scope: Scope, i: int, speaker: str, text: str, session: str = "s1") -> MessageObserved:
    when = T0 + timedelta(minutes=i)
    return MessageObserved(
        scope=scope, message_id=f"{session}-{i}", speaker=speaker, content=text, session_id=session,
        occurred_at=when, recorded_at=when,
    )


def _memory(scope: Scope, i: int, speaker: str, text: str, session: str = "s1", **fields: Any) -> MemoryAdded:
    mid = f"{session}-{i}"
    return memory(scope, f"m-{mid}", f"{speaker}: {text}", source_message_ids=(mid,), session_id=session,
                  occurred_at=T0 + timedelta(minutes=i), **fields)


class Writer:
    """A projector over a store, each table's events at growing offsets (log order)."""

    def __init__(self, store: LanceStore) -> None:
        self.store = store
        self.projector = Projector(store, EMB)
        self.offsets = {"test.messages": 0, "test.events": 0}

    def write(self, messages: Sequence[Any] = (), events: Sequence[Any] = ()) -> None:
        for topic, batch in (("test.messages", list(messages)), ("test.events", list(events))):
            if batch:
                self.projector.apply(positioned(batch, topic=topic, start=self.offsets[topic]))
                self.offsets[topic] += len(batch)

    def conversation(self, scope: Scope, turns: list[tuple[str, str]], session: str = "s1", first: int = 0,
                     **fields: Any) -> None:
        self.write(
            [_turn(scope, first + i, sp, text, session) for i, (sp, text) in enumerate(turns)],
            [_memory(scope, first + i, sp, text, session, **fields) for i, (sp, text) in enumerate(turns)],
        )


def _search(store: LanceStore, scope: Scope, query: str, **kwargs: Any) -> list[SearchResult]:
    return search(store, EMB, scope, query, now=NOW, cache=CACHE, **kwargs)


def _cold(store: LanceStore, scope: Scope, query: str, **kwargs: Any) -> list[SearchResult]:
    CACHE.clear()
    return _search(store, scope, query, **kwargs)


class SessionReads:
    """Counts the session reads search issues (a warm cache issues none)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        scan = search_queries.scan

        async def counting(table: Any, where: str, columns: Any, limit: int | None = None) -> Any:
            if "session_id IN" in where:
                self.count += 1
            return await scan(table, where, columns, limit)

        monkeypatch.setattr(search_queries, "scan", counting)


def test_a_warm_search_reads_no_session_and_returns_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = Writer(LanceStore(tmp_path / "lance", embedding_dim=DIM))
    w.conversation(ANN, FILLER + [QUESTION, ANSWER] + FILLER)
    reads = SessionReads(monkeypatch)
    first = _search(w.store, ANN, QUERY, k=5)
    assert reads.count == 2  # the session's turns and memories, read once
    again = _search(w.store, ANN, QUERY, k=5)
    assert reads.count == 2 and CACHE.cached_rows() > 0
    assert again == first == _cold(w.store, ANN, QUERY, k=5)
    assert "m-s1-5" in [r.memory_id for r in first]  # the answer, through the question before it


def test_a_turn_added_to_a_cached_session_is_seen(tmp_path: Path) -> None:
    w = Writer(LanceStore(tmp_path / "lance", embedding_dim=DIM))
    w.conversation(ANN, FILLER + [QUESTION])
    before = _search(w.store, ANN, QUERY, k=3)
    assert _search(w.store, ANN, QUERY, k=3) == before  # the session is cached now
    # the answer arrives after the question: only the session's new turn links them
    w.conversation(ANN, [ANSWER] + FILLER, first=5)
    after = _search(w.store, ANN, QUERY, k=3)
    answer = [r for r in after if r.memory_id == "m-s1-5"]
    assert answer and answer[0].parts.context > 0.0
    assert after == _cold(w.store, ANN, QUERY, k=3)


def test_a_reader_handle_sees_the_writers_commits(tmp_path: Path) -> None:
    w = Writer(LanceStore(tmp_path / "lance", embedding_dim=DIM))
    w.conversation(ANN, FILLER + [QUESTION])
    reader = LanceStore(tmp_path / "lance", embedding_dim=DIM, read_consistency_interval=timedelta(0))
    assert _search(reader, ANN, QUERY, k=3) == _search(reader, ANN, QUERY, k=3)
    w.conversation(ANN, [ANSWER] + FILLER, first=5)
    after = _search(reader, ANN, QUERY, k=3)
    assert "m-s1-5" in [r.memory_id for r in after]
    assert after == _cold(reader, ANN, QUERY, k=3)


def test_a_cached_row_that_changed_is_read_again(tmp_path: Path) -> None:
    w = Writer(LanceStore(tmp_path / "lance", embedding_dim=DIM))
    w.write(events=[memory(ANN, "old", "the lighthouse keeper lives on the island"),
                    memory(ANN, "other", "groceries on saturday")])
    first = _search(w.store, ANN, "lighthouse keeper", k=3)
    assert first[0].memory_id == "old" and first[0].superseded_by is None
    assert _search(w.store, ANN, "lighthouse keeper", k=3) == first  # both rows cached: the lists read ids
    w.write(events=[memory(ANN, "new", "the keeper moved to the mainland"), link(ANN, "new", "old", "supersedes")])
    after = _search(w.store, ANN, "lighthouse keeper", k=3)
    by_id = {r.memory_id: r for r in after}
    assert by_id["old"].superseded_by == "new"  # not the cached copy from before the link
    assert after[0].memory_id == "new"  # the successor is pulled in and ranks first
    assert after == _cold(w.store, ANN, "lighthouse keeper", k=3)


def test_spaces_never_share_what_is_cached(tmp_path: Path) -> None:
    # the same message, memory and session ids in both spaces; different words and speakers
    w = Writer(LanceStore(tmp_path / "lance", embedding_dim=DIM))
    w.conversation(ANN, FILLER + [QUESTION, ANSWER])
    w.conversation(EVE, [("Zed", "I collect old maps of the pottery district."),
                         ("Kim", "Zed also restores old clocks."), ("Zed", "Pottery is next.")])
    for _ in range(2):  # cold, then warm, alternating spaces
        for scope, query in ((ANN, QUERY), (EVE, "What does Zed collect?"), (ANN, "What does Zed collect?"),
                             (EVE, QUERY)):
            results = _search(w.store, scope, query, k=5)
            assert results and all(r.user_id == scope.user_id for r in results)
            if scope == ANN:
                assert all(not r.content.startswith(("Zed", "Kim")) for r in results)
                if query != QUERY:  # Zed speaks in Eve's space only: no speaker prior here
                    assert all(r.parts.prior <= 1.0 for r in results)  # (a question turn scores 0.7)
            else:
                assert all(r.content.startswith(("Zed", "Kim")) for r in results)
    for scope in (ANN, EVE):
        entry = CACHE.entry_of(str(w.store.root), scope)
        assert entry is not None
        rows = [r for r in entry.memories.values() if r is not None]
        assert rows and {(r["team_id"], r["user_id"]) for r in rows} == {(scope.team_id, scope.user_id)}
        speakers = {t.speaker for s in entry.session_turns.values() for t in s.turns.values()}
        assert speakers == ({"Ann", "Bob"} if scope == ANN else {"Zed", "Kim"})
    warm = [_search(w.store, s, q, k=5) for s, q in ((ANN, QUERY), (EVE, "What does Zed collect?"))]
    assert warm[0] == _cold(w.store, ANN, QUERY, k=5)
    assert warm[1] == _cold(w.store, EVE, "What does Zed collect?", k=5)


def test_filters_hold_with_a_warm_cache(tmp_path: Path) -> None:
    # the question was kept by agent "a2", the answer by "a1": with the filter on
    # "a2", the answer must not join as the question's neighbour
    w = Writer(LanceStore(tmp_path / "lance", embedding_dim=DIM))
    a1 = Scope(team_id="acme", user_id="ann", agent_id="a1")
    a2 = Scope(team_id="acme", user_id="ann", agent_id="a2")
    w.conversation(a2, FILLER + [QUESTION])
    w.conversation(a1, [ANSWER] + FILLER, first=5)
    unfiltered = _search(w.store, ANN, QUERY, k=3)  # warms the cache with every session row
    assert "m-s1-5" in [r.memory_id for r in unfiltered]
    only_a2 = SearchFilters(agent_id="a2")
    filtered = _search(w.store, ANN, QUERY, k=10, filters=only_a2)
    assert filtered and all(r.agent_id == "a2" for r in filtered)
    assert filtered == _cold(w.store, ANN, QUERY, k=10, filters=only_a2)


def test_the_lists_read_only_ids_or_whole_rows_with_the_same_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = Writer(LanceStore(tmp_path / "lance", embedding_dim=DIM))
    w.conversation(ANN, FILLER + [QUESTION, ANSWER] + FILLER)
    w.write(events=[memory(ANN, "loose", "a pottery workshop voucher, no session")])
    results = {}
    for whole in (True, False):
        CACHE.clear()
        monkeypatch.setattr(CACHE, "lists_need_rows", lambda root, scope, whole=whole: whole)
        results[whole] = [_search(w.store, ANN, QUERY, k=8) for _ in range(2)]
    assert results[True] == results[False]
    assert "loose" in [r.memory_id for r in results[False][0]]


def test_the_cache_stays_within_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = Writer(LanceStore(tmp_path / "lance", embedding_dim=DIM))
    w.conversation(ANN, FILLER + [QUESTION, ANSWER] + FILLER)
    w.conversation(EVE, FILLER + [QUESTION, ANSWER])
    expected = {s: _cold(w.store, s, QUERY, k=4) for s in (ANN, EVE)}
    CACHE.clear()
    monkeypatch.setattr(CACHE, "max_rows", 30)
    root = str(w.store.root)
    for scope in (ANN, EVE, ANN, EVE):
        assert _search(w.store, scope, QUERY, k=4) == expected[scope]
        assert CACHE.cached_rows() <= 30
        held = [e for e in (CACHE.entry_of(root, s) for s in (ANN, EVE)) if e is not None]
        assert CACHE.cached_rows() == sum(e.size for e in held) > 0
    assert CACHE.entry_of(str(w.store.root), ANN) is None  # the least recently searched went
    monkeypatch.setattr(CACHE, "max_rows", 5)  # one space alone exceeds it: not kept
    assert _search(w.store, ANN, QUERY, k=4) == expected[ANN]
    assert CACHE.cached_rows() <= 5


def test_a_session_read_cut_short_is_used_but_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = Writer(LanceStore(tmp_path / "lance", embedding_dim=DIM))
    w.conversation(ANN, FILLER + [QUESTION, ANSWER] + FILLER)
    monkeypatch.setattr(search_reads, "MAX_TURNS", 4)
    cut = _search(w.store, ANN, QUERY, k=5)
    entry = CACHE.entry_of(str(w.store.root), ANN)
    assert entry is not None and not entry.session_turns and not entry.session_memories
    assert _search(w.store, ANN, QUERY, k=5) == cut == _cold(w.store, ANN, QUERY, k=5)


def test_a_swapped_in_table_set_never_passes_for_the_old_one(tmp_path: Path) -> None:
    # a replay swaps whole directories in; the new set counts its versions from 1 again
    live = tmp_path / "lance"
    Writer(LanceStore(live, embedding_dim=DIM)).conversation(ANN, FILLER)
    root = str(live)
    old = {t: search_cache.table_identity(root, t) for t in ("memories", "messages")}
    live.rename(tmp_path / "lance.old")
    Writer(LanceStore(live, embedding_dim=DIM)).conversation(ANN, [QUESTION])
    new = {t: search_cache.table_identity(root, t) for t in ("memories", "messages")}
    assert old["memories"] != new["memories"] and old["messages"] != new["messages"]
    entry = CACHE.space_cache(root, ANN, (*old["memories"], 3), (*old["messages"], 3))
    CACHE.add_memories(entry, (*old["memories"], 3), [{"memory_id": "m-s1-0", "content": "from the old set"}])
    assert entry.memories
    same_numbers = CACHE.space_cache(root, ANN, (*new["memories"], 3), (*new["messages"], 3))
    assert same_numbers is not entry and not same_numbers.memories
