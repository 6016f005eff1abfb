"""The owner check's kept id -> agent maps (``search_owners.MemoryOwners``), on real
LanceDB tables: whatever the projector commits between checks (memories of several
agents in several spaces, an id written again, compactions, index updates, deletes),
a kept map answers exactly as a query of the table at the same version, and a space's
map never answers for another space's ids."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.projections.projection_helpers import DIM, memory, positioned

from memstream.domain.access import ReadScope
from memstream.domain.events import Scope
from memstream.projections.search import queries as search_queries
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.schema import MEMORIES
from memstream.projections.search.cache import SearchCache
from memstream.projections.search.owners import MemoryOwners
from memstream.projections.store.lance_store import LanceStore, quote

EMB = LocalEmbedder(DIM)
SPACES = (("acme", "ann"), ("acme", "eve"), ("globex", "ann"))
AGENTS = ("a1", "a2")
IDS = tuple(f"m{i}" for i in range(6))


class Log:
    def __init__(self, store: LanceStore) -> None:
        self.store = store
        self.projector = Projector(store, EMB)
        self.offset = 0

    def add(self, space: int, agent: int, memory_id: str) -> None:
        team, user = SPACES[space]
        scope = Scope(team_id=team, user_id=user, agent_id=AGENTS[agent])
        event = memory(scope, memory_id, f"{memory_id} by {AGENTS[agent]}: the garden and the maps")
        self.projector.apply(positioned([event], start=self.offset))
        self.offset += 1


def _expected(reader: LanceStore, space: int, memory_id: str) -> str | None:
    team, user = SPACES[space]
    return reader.memory_owner(ReadScope(team, user, None), memory_id)


def _check(owners: MemoryOwners, reader: LanceStore) -> None:
    for space, (team, user) in enumerate(SPACES):
        for agent in AGENTS:  # a writer's scope names its agent: the check sees every agent's ids
            scope = Scope(team_id=team, user_id=user, agent_id=agent)
            for memory_id in IDS:
                assert owners.owner(reader, scope, memory_id) == _expected(reader, space, memory_id)


_action = st.one_of(
    st.tuples(st.just("add"), st.integers(0, len(SPACES) - 1), st.integers(0, 1), st.sampled_from(IDS)),
    st.tuples(st.just("delete"), st.integers(0, len(SPACES) - 1), st.sampled_from(IDS)),
    st.tuples(st.just("compact")),
    st.tuples(st.just("indexes")),
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=st.lists(_action, min_size=1, max_size=8))
def test_a_kept_owner_map_answers_as_the_table_at_the_same_version(
    tmp_path_factory: pytest.TempPathFactory, actions: list[tuple[Any, ...]]
) -> None:
    path = tmp_path_factory.mktemp("owners")
    log = Log(LanceStore(path / "lance", embedding_dim=DIM))
    reader = LanceStore(path / "lance", embedding_dim=DIM, read_consistency_interval=timedelta(0), create=False)
    owners = MemoryOwners(SearchCache())
    log.add(0, 0, "m0")
    _check(owners, reader)
    for action in actions:
        if action[0] == "add":
            log.add(action[1], action[2], action[3])
        elif action[0] == "delete":
            team, user = SPACES[action[1]]
            where = f"team_id = {quote(team)} AND user_id = {quote(user)} AND memory_id = {quote(action[2])}"
            log.store.table(MEMORIES).delete(where)
        elif action[0] == "compact":
            log.store.compact()
        else:
            log.store.optimize_indexes()
        _check(owners, reader)


def test_a_commit_is_carried_into_the_map_without_reading_the_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Log(LanceStore(tmp_path / "lance", embedding_dim=DIM))
    owners = MemoryOwners(SearchCache())
    scans: list[str] = []
    scan = search_queries.scan

    async def counting(table: Any, where: str, columns: Any, limit: int | None = None) -> Any:
        scans.append(where)
        return await scan(table, where, columns, limit)

    monkeypatch.setattr(search_queries, "scan", counting)
    ann = Scope(team_id="acme", user_id="ann", agent_id="a2")
    log.add(0, 0, "m0")
    assert owners.owner(log.store, ann, "m0") == "a1"
    assert len(scans) == 1  # the space read once
    log.add(1, 0, "m1")  # another space
    log.add(0, 1, "m2")  # this space, another agent
    assert owners.owner(log.store, ann, "m2") == "a2"
    assert owners.owner(log.store, ann, "m1") is None  # eve's id is not in ann's space
    assert len(scans) == 1


def test_a_space_larger_than_kept_is_asked_per_check(tmp_path: Path) -> None:
    log = Log(LanceStore(tmp_path / "lance", embedding_dim=DIM))
    for i in range(4):
        log.add(0, i % 2, f"m{i}")
    owners = MemoryOwners(SearchCache(), max_ids=20)  # a space may keep 2 ids
    ann = Scope(team_id="acme", user_id="ann", agent_id="a1")
    assert [owners.owner(log.store, ann, f"m{i}") for i in range(5)] == ["a1", "a2", "a1", "a2", None]
