"""Search filters (``memstream.projections.search.filters``) on real LanceDB tables: type,
session, agent and time (point, interval, creation time)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from tests.projections.projection_helpers import DIM, T0, memory, positioned

from memstream.domain.events import MemoryType, Scope
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.search.hybrid import SearchFilters, SearchResult, search
from memstream.projections.store.lance_store import LanceStore

EMB = LocalEmbedder(DIM)


ALICE = Scope(team_id="acme", user_id="alice")


def _project(tmp_path: Path, events: list) -> LanceStore:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    Projector(store, EMB).apply(positioned(events))
    return store


def _ids(results: list[SearchResult]) -> list[str]:
    return [r.memory_id for r in results]


def test_filters_type_session_agent(tmp_path: Path) -> None:
    bot = Scope(team_id="acme", user_id="alice", agent_id="bot")
    store = _project(
        tmp_path,
        [
            memory(ALICE, "p", "prefers tea over coffee", memory_type="persona", session_id="s1"),
            memory(bot, "w", "coffee machine repair task", memory_type="work_task", session_id="s2"),
            memory(ALICE, "e", "had coffee with Bob", memory_type="episodic", session_id="s2"),
        ],
    )
    q = "coffee"
    assert set(_ids(search(store, EMB, ALICE, q))) == {"p", "w", "e"}
    assert _ids(search(store, EMB, ALICE, q, filters=SearchFilters(memory_types=(MemoryType.persona,)))) == ["p"]
    assert set(_ids(search(store, EMB, ALICE, q, filters=SearchFilters(session_id="s2")))) == {"w", "e"}
    assert _ids(search(store, EMB, ALICE, q, filters=SearchFilters(agent_id="bot"))) == ["w"]
    assert _ids(search(store, EMB, ALICE, q, filters=SearchFilters(agent_id="bot", session_id="s1"))) == []


def test_time_filter_point_interval_and_created_at(tmp_path: Path) -> None:
    day = timedelta(days=1)
    store = _project(
        tmp_path,
        [
            memory(ALICE, "point", "trip note point", timestamp=T0),
            memory(ALICE, "span", "trip note span", timestamp_start=T0 - 10 * day, timestamp_end=T0 - 5 * day),
            memory(ALICE, "open", "trip note open ended", timestamp_start=T0 + 20 * day),
            memory(ALICE, "plain", "trip note plain", occurred_at=T0 + 2 * day),
        ],
    )

    def window(lo: datetime | None, hi: datetime | None) -> set[str]:
        return set(_ids(search(store, EMB, ALICE, "trip note", filters=SearchFilters(time_from=lo, time_to=hi))))

    assert window(T0 - day, T0 + day) == {"point"}
    assert window(T0 - 6 * day, T0 - 6 * day) == {"span"}  # inside the interval
    assert window(T0 - 30 * day, T0 - 9 * day) == {"span"}  # overlaps its start
    assert window(T0 + 1 * day, T0 + 3 * day) == {"plain"}  # no event time: created_at
    assert window(T0 + 21 * day, T0 + 22 * day) == {"open"}  # no end: still going on
    assert window(T0 + 400 * day, None) == {"open"}
    assert window(T0 + 19 * day, T0 + 19 * day) == set()  # before it started
    assert window(None, T0) == {"point", "span"}
    with pytest.raises(ValueError):
        SearchFilters(time_from=datetime(2024, 1, 1))  # naive
    with pytest.raises(ValueError):
        SearchFilters(time_from=T0, time_to=T0 - day)
