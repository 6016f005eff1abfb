"""The space's kept BM25 index gives the lexical list LanceDB's full-text index gives,
on real tables: the same terms (LanceDB's own index is the reference for the stop list,
stemming, folding and the word split) and, in a table holding one space, the same
scores; per space only (another space's rows never show, nor weigh in a score); and a
carried index equals one built afresh from the same rows; equal scores in memory-id
order, whatever the rows' order."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.projections.projection_helpers import DIM, T0, memory, positioned

from memstream.domain.events import Scope, SubjectForgotten
from memstream.projections.search import lexical as search_lexical
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.store.lance_async import wait
from memstream.projections.projector.projector import Projector
from memstream.projections.schema import MEMORIES
from memstream.projections.search.hybrid import search
from memstream.projections.search.cache import SearchCache, space_key, table_identity
from memstream.projections.search.lexical import STOP_STEMS, SpaceText, terms
from memstream.projections.search.queries import native, text_query
from memstream.projections.search.results import LIST_COLUMNS
from memstream.projections.search.vectors import read_space_vectors
from memstream.projections.store.lance_store import LanceStore, space_where

EMB = LocalEmbedder(DIM)
ANN = Scope(team_id="acme", user_id="ann")
EVE = Scope(team_id="acme", user_id="eve")
CONTENTS = [
    "Ann: I went hiking with my sister in the mountains last weekend!",
    "Bob: The hikers' café served crème brûlée; naïve tourists loved it.",
    "Ann: running, runs, ran: my running club meets on Tuesdays at 7",
    "Bob: snake_case and CamelCase identifiers, version 2.0.1 released",
    "Ann: the the the of and: a sentence of stop words and one lighthouse",
    "Bob: " + "x" * 45 + " is a very long token next to short ones",
    "Ann: Pottery workshop, pottery glaze and a pottery wheel",
    "Bob: Résumé written in Zürich about the Ærø ferry",
    "Ann: LGBTQ support group meeting on 7 May 2023",
    "Bob: nothing in common here",
]
QUERIES = [
    "When did Ann go hiking with her sister?",
    "pottery pottery",  # a repeated word counts again
    "cafe creme brulee naive",
    "resume zurich",
    "the of and",  # stop words only: no list
    "run runner running",
    "version 2 0 1 snake case",
    "support group May",
    "x" * 45,
    "lighthouse keeper",
]


def _project(path: Path, spaces: dict[Scope, list[str]]) -> LanceStore:
    store = LanceStore(path, embedding_dim=DIM)
    events = [
        memory(scope, f"{scope.user_id}{i}", content, session_id=f"s{i % 3}")
        for scope, contents in spaces.items()
        for i, content in enumerate(contents)
    ]
    Projector(store, EMB).apply(positioned(events))
    store.optimize_indexes()
    return store


def _kept(store: LanceStore, scope: Scope) -> SpaceText:
    kept = wait(read_space_vectors(store, scope, int(wait(native(store, MEMORIES).version()))))
    assert kept is not None
    return kept.text


def _lancedb(store: LanceStore, scope: Scope, query: str, n: int) -> dict[str, float]:
    table = wait(text_query(native(store, MEMORIES), query, space_where(scope), n, LIST_COLUMNS))
    if table is None:
        return {}
    return dict(zip(table.column("memory_id").to_pylist(), table.column("_score").to_pylist()))


def _ours(text: SpaceText, query: str, n: int) -> dict[str, float]:
    table = text.best(query, n)
    return dict(zip(table.column("memory_id").to_pylist(), table.column("_score").to_pylist()))


@pytest.mark.parametrize("query", QUERIES)
def test_in_a_table_of_one_space_the_scores_are_lancedbs(tmp_path: Path, query: str) -> None:
    store = _project(tmp_path / "lance", {ANN: CONTENTS})
    ours, theirs = _ours(_kept(store, ANN), query, 50), _lancedb(store, ANN, query, 50)
    assert ours.keys() == theirs.keys()
    for mid, score in theirs.items():
        assert ours[mid] == pytest.approx(score, rel=1e-4)
    listed = list(ours.values())
    assert listed == sorted(listed, reverse=True)


def test_the_stop_list_and_the_word_split_are_lancedbs(tmp_path: Path) -> None:
    """Each stop word (and each ordinary word beside it) alone in a memory: LanceDB's
    index finds the memory exactly when :func:`terms` keeps a term of the word."""
    words = sorted({w for w in STOP_STEMS if w.isalpha()} | {"lighthouse", "running", "ourselves", "during", "only"})
    store = _project(tmp_path / "lance", {ANN: [f"{w} zzqq" for w in words]})
    for i, word in enumerate(words):
        found = f"ann{i}" in _lancedb(store, ANN, word, 5)
        assert found == bool(terms(word)), word


def test_another_spaces_rows_neither_show_nor_weigh(tmp_path: Path) -> None:
    alone = _kept(_project(tmp_path / "alone", {ANN: CONTENTS}), ANN)
    store = _project(tmp_path / "both", {ANN: CONTENTS, EVE: [c.replace("Bob", "Eve") + " pottery" for c in CONTENTS]})
    shared = _kept(store, ANN)
    assert sorted(shared.ids.to_pylist()) == sorted(f"ann{i}" for i in range(len(CONTENTS)))
    for query in QUERIES + ["Eve pottery"]:
        assert _ours(shared, query, 50) == _ours(alone, query, 50)
    assert _ours(_kept(store, EVE), "Eve", 50)  # Eve's own words are found in Eve's space


_SCHEMA = pa.schema([
    ("memory_id", pa.string()), ("session_id", pa.string()),
    ("source_message_ids", pa.list_(pa.string())), ("content", pa.string()),
])


def _table(ids: list[str], contents: list[str]) -> pa.Table:
    columns = [ids, [f"s{len(i) % 2}" for i in ids], [[i] for i in ids], contents]
    return pa.table(columns, schema=_SCHEMA)


_VOCAB = ["pottery", "glaze", "the", "hiking", "sister", "café", "runs", "running", "island", "of"]
_doc = st.lists(st.sampled_from(_VOCAB), max_size=8).map(" ".join)


def _assert_stands_for(text: SpaceText, rows: list[tuple[str, str]]) -> None:
    """``text`` is the index of ``rows`` (in this order): the same rows and the
    same scores and lists as an index built afresh from them."""
    fresh = SpaceText.of(_table([m for m, _ in rows], [c for _, c in rows]))
    assert text.ids.to_pylist() == fresh.ids.to_pylist()
    assert text.sessions.to_pylist() == fresh.sessions.to_pylist()
    for query in ["pottery", "running sister", "cafe glaze glaze", "island of the"]:
        np.testing.assert_allclose(text.scores(query), fresh.scores(query), rtol=1e-6)
        assert text.best(query, 3).column("memory_id").to_pylist() == fresh.best(query, 3).column("memory_id").to_pylist()


_step = st.tuples(
    st.integers(0, 5),  # which earlier version the step starts from (counted back, modulo)
    st.sets(st.integers(0, 11), max_size=4),  # ids replaced
    st.lists(st.tuples(st.integers(0, 11), _doc), max_size=4, unique_by=lambda t: t[0]),  # rows written
)


@pytest.mark.parametrize("scanned", [0, 3, 4096])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.lists(_doc, min_size=0, max_size=8), steps=st.lists(_step, min_size=1, max_size=8))
def test_a_carried_index_is_the_index_of_the_rows_it_stands_for(
    monkeypatch: pytest.MonkeyPatch, scanned: int, before: list[str], steps: list[tuple[int, set[int], list[tuple[int, str]]]]
) -> None:
    """Rows written since (new, or replacing a row of the same id) come after the rest,
    as a read of the space gives them; each carried index scores as a fresh one, whether
    it appended to the storage it shares with the version it came from or (carried
    from a version another one had already been carried from, or with rows replaced)
    started storage of its own; and the versions carried before keep scoring as they
    did. ``scanned``: postings scanned before they are ordered by term
    (0: ordered at every query; the product's 4096: these are only scanned)."""
    monkeypatch.setattr(search_lexical, "_TAIL_MIN", scanned)
    versions = [(SpaceText.of(_table([f"m{i}" for i in range(len(before))], before)), list(zip(
        [f"m{i}" for i in range(len(before))], before)))]
    for back, replaced, written in steps:
        old, old_rows = versions[-1 - back % len(versions)]
        gone = {f"m{i}" for i in replaced} | {f"m{i}" for i, _ in written}
        carried = old.carried(gone, _table([f"m{i}" for i, _ in written], [c for _, c in written]))
        rows = [(m, c) for m, c in old_rows if m not in gone] + [(f"m{i}", c) for i, c in written]
        _assert_stands_for(carried, rows)
        versions.append((carried, rows))
    for text, rows in versions:
        _assert_stands_for(text, rows)


def test_a_forgotten_space_leaves_the_kept_index_at_the_same_version(tmp_path: Path) -> None:
    """The forget's delete cannot be carried (``table_changes``): the next search reads
    the space again, at the version without the rows, and its lexical list is empty."""
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    projector = Projector(store, EMB)
    projector.reader_grace = timedelta(0)
    events = [memory(s, f"{s.user_id}{i}", c) for s in (ANN, EVE) for i, c in enumerate(CONTENTS)]
    projector.apply(positioned(events))
    cache = SearchCache()
    assert search(store, EMB, ANN, "pottery glaze", k=3, cache=cache)
    assert search(store, EMB, EVE, "pottery glaze", k=3, cache=cache)
    projector.apply(positioned([SubjectForgotten(scope=ANN, key_ids=("ab" * 16,))], start=len(events)))
    assert search(store, EMB, ANN, "pottery glaze", k=3, cache=cache) == []
    version = (*table_identity(str(store.root), MEMORIES), int(wait(native(store, MEMORIES).version())))
    kept = cache.vectors.get(space_key(str(store.root), ANN), version)
    assert kept is not None and len(kept.text) == 0 and kept.text.best("pottery glaze", 10).num_rows == 0
    eve = search(store, EMB, EVE, "pottery glaze", k=3, now=T0, cache=cache)
    assert eve and eve == search(store, EMB, EVE, "pottery glaze", k=3, now=T0, cache=SearchCache())


def test_the_list_does_not_depend_on_the_spaces_row_order() -> None:
    """Rows are in the order their memories were committed (timing); equal scores are
    ordered by memory id, so two ingests of the same data give the same list."""
    contents = ["pottery glaze"] * 6 + ["pottery"] * 3 + ["hiking island"]
    ids = [f"m{i}" for i in range(len(contents))]
    rows = list(zip(ids, contents))
    for limit in (1, 3, 7, 20):
        lists = [
            SpaceText.of(_table([m for m, _ in order], [c for _, c in order])).best("pottery glaze", limit)
            .column("memory_id").to_pylist()
            for order in (rows, rows[::-1], rows[3:] + rows[:3])
        ]
        assert lists[0] == lists[1] == lists[2], (limit, lists)
        assert lists[0][: min(limit, 6)] == sorted(ids[:6])[: min(limit, 6)]
