"""The rows search reads (``memstream.projections.search.results.rows_of``), read from a
real LanceDB table: every column as the table holds it, with the values many rows
repeat held once, so that a serving process's row cache costs less per row."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.projections.projection_helpers import DIM, memory, positioned

from memstream.domain.events import Scope
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.schema import MEMORIES
from memstream.projections.search.results import READ_COLUMNS, rows_of
from memstream.projections.store.lance_store import LanceStore, space_where

ANN = Scope(team_id="acme", user_id="ann", agent_id="scribe")


def _read(store: LanceStore) -> list[dict]:
    table = store.table(MEMORIES).search().where(space_where(ANN)).select(list(READ_COLUMNS)).to_arrow()
    return sorted(rows_of(table, ANN), key=lambda r: r["memory_id"])


@pytest.fixture
def store(tmp_path: Path) -> LanceStore:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    events = [
        memory(ANN, f"m{i}", f"Ann met Bob in Paris, visit {i}", session_id="s1", memory_type="episodic",
               source_message_ids=(f"t{i}", "t-shared"), entities=[("Paris", "place"), ("Bob", "person")])
        for i in range(3)
    ]
    Projector(store, LocalEmbedder(DIM)).apply(positioned(events, topic="t.events"))
    return store


def test_rows_hold_the_tables_values_and_the_space(store: LanceStore) -> None:
    rows = _read(store)
    assert [r["memory_id"] for r in rows] == ["m0", "m1", "m2"]
    first = rows[0]
    assert (first["team_id"], first["user_id"], first["agent_id"]) == ("acme", "ann", "scribe")
    assert first["pk"].endswith("m0") and first["pk"] != rows[1]["pk"]
    assert first["content"] == "Ann met Bob in Paris, visit 0"
    assert (first["session_id"], first["memory_type"]) == ("s1", "episodic")
    assert first["source_message_ids"] == ("t0", "t-shared")
    assert [(e["name"], e["kind"]) for e in first["entities"]] == [("Paris", "place"), ("Bob", "person")]
    assert set(first["entity_keys"]) == {"paris", "bob"}


def test_values_rows_repeat_are_one_object_across_reads(store: LanceStore) -> None:
    a, b = _read(store), _read(store)  # two reads: Arrow makes new strings for each
    for row in (a[1], b[0], b[2]):
        for column in ("agent_id", "session_id", "memory_type", "status"):
            assert row[column] is a[0][column], column
        assert row["source_message_ids"][1] is a[0]["source_message_ids"][1]
        assert all(x is y for x, y in zip(row["entities"], a[0]["entities"]))
        assert all(x is y for x, y in zip(row["entity_keys"], a[0]["entity_keys"]))
    assert a[0]["content"] == b[0]["content"]


def test_a_shared_entity_cannot_be_changed_through_one_row(store: LanceStore) -> None:
    entity = _read(store)[0]["entities"][0]
    with pytest.raises(TypeError):
        entity["name"] = "Rome"  # type: ignore[index]
    assert _read(store)[1]["entities"][0]["name"] == "Paris"
