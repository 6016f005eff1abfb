"""The agent boundary on every read of the projections (``memstream.domain.access``).

Two agents of one user ("planner" and "spy") share a memory space. A read pinned to
one (``ReadScope.pinned``) sees that agent's rows only: search (with its
conversational context and caches), a memory by id with its source turns, links,
entities, lessons, exact dedup. A memory's source turns are always its own agent's,
whoever asks. A link written in another agent's scope never changes a memory's view.
"""

from __future__ import annotations

import random
from datetime import timedelta

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tests.projections.projection_helpers import DIM, T0, link, memory, positioned

from memstream.domain.access import ReadScope
from memstream.domain.content import content_hash
from memstream.domain.events import MemoryReflected, MessageObserved, Rating, Scope
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.reads.reflections import context_for
from memstream.projections.search.hybrid import SearchFilters, search
from memstream.projections.store.lance_store import LanceStore

PLANNER = Scope(team_id="acme", user_id="alice", agent_id="planner")
SPY = Scope(team_id="acme", user_id="alice", agent_id="spy")


def turn(scope: Scope, message_id: str, content: str, session: str = "s1") -> MessageObserved:
    return MessageObserved(
        scope=scope, message_id=message_id, content=content, session_id=session, speaker="alice",
        occurred_at=T0, recorded_at=T0,
    )


def lesson(scope: Scope, rid: str, text: str) -> MemoryReflected:
    return MemoryReflected(
        scope=scope, reflection_id=rid, decision_id=f"d-{rid}", outcome_id=f"o-{rid}", subject="AAPL",
        rating=Rating.buy, content=text, occurred_at=T0, recorded_at=T0,
    )


def test_a_memory_reads_only_its_own_agents_source_turns(store: LanceStore) -> None:
    projector = Projector(store, LocalEmbedder(DIM))
    projector.apply(
        positioned(
            [
                turn(PLANNER, "m-1", "the planner's secret plan is to buy AAPL"),
                memory(PLANNER, "p-1", "Plan: buy AAPL", source_message_ids=("m-1",)),
                # the spy cites the planner's turn id
                memory(SPY, "s-1", "spy memory", source_message_ids=("m-1",)),
            ]
        )
    )
    for reader in (Scope(team_id="acme", user_id="alice"), ReadScope.pinned(SPY)):
        got = store.get_memory(reader, "s-1")
        assert got is not None and got["source_messages"] == []
    own = store.get_memory(ReadScope.pinned(PLANNER), "p-1")
    assert own is not None and [m["message_id"] for m in own["source_messages"]] == ["m-1"]
    # pinned reads do not see the other agent's memory at all
    assert store.get_memory(ReadScope.pinned(SPY), "p-1") is None
    assert store.get_messages(ReadScope.pinned(SPY), ["m-1"]) == []


def test_another_agents_link_never_changes_a_memorys_view(store: LanceStore) -> None:
    projector = Projector(store, LocalEmbedder(DIM))
    projector.apply(positioned([memory(PLANNER, "p-1", "Alice flies on Friday"), memory(SPY, "s-1", "Alice flies Monday")]))
    projector.apply(positioned([link(SPY, "s-1", "p-1", "supersedes")], start=2))
    row = store.get_memory(ReadScope.pinned(PLANNER), "p-1")
    assert row is not None and row["status"] == "active" and row["superseded_by"] is None
    assert row["links_in"] == []  # the spy's link is not the planner's to see
    hits = search(store, LocalEmbedder(DIM), ReadScope.pinned(PLANNER), "Alice flies", 5,
                  SearchFilters(include_superseded=False))
    assert [h.memory_id for h in hits] == ["p-1"]
    # the planner's own link still works
    projector.apply(positioned([memory(PLANNER, "p-2", "Alice flies on Sunday"),
                                link(PLANNER, "p-2", "p-1", "supersedes")], start=3))
    row = store.get_memory(ReadScope.pinned(PLANNER), "p-1")
    assert row is not None and row["superseded_by"] == "p-2"


def test_lessons_and_entities_are_pinned(store: LanceStore) -> None:
    projector = Projector(store, LocalEmbedder(DIM))
    projector.apply(
        positioned(
            [
                lesson(PLANNER, "r-1", "Buying AAPL before earnings worked."),
                lesson(SPY, "r-2", "The spy's lesson."),
                memory(PLANNER, "p-1", "Alice met Bob", entities=[("Bob", "person")]),
            ]
        )
    )
    spy_ctx = context_for(store, ReadScope.pinned(SPY), "AAPL", 800)
    assert "spy's lesson" in spy_ctx.text and "earnings" not in spy_ctx.text
    assert store.memories_for_entity(ReadScope.pinned(SPY), "Bob") == []
    assert store.memories_for_entity(ReadScope.pinned(PLANNER), "Bob") == ["p-1"]


_AGENTS = ("a1", "a2", "a3")
_WORDS = ("tea", "coffee", "launch", "code", "Lisbon", "Friday", "plan", "AAPL")


@settings(max_examples=12, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(4, 24))
def test_property_nothing_crosses_the_agent_boundary(tmp_path_factory, seed: int, n: int) -> None:  # type: ignore[no-untyped-def]
    """Random agents write random memories (citing random turns, some of them other
    agents'), links and lessons; every pinned read (search, get, source turns, links,
    lessons, exact dedup) returns only the reader's agent's rows."""
    rng = random.Random(seed)
    store = LanceStore(tmp_path_factory.mktemp("prop") / "lance", embedding_dim=DIM)
    projector = Projector(store, LocalEmbedder(DIM))
    events = []
    owner: dict[str, str] = {}
    for i in range(n):
        agent = rng.choice(_AGENTS)
        scope = Scope(team_id="t", user_id="u", agent_id=agent)
        text = " ".join(rng.choice(_WORDS) for _ in range(3)) + f" {i}"
        events.append(turn(scope, f"m{i}", text))
        cited = tuple({f"m{rng.randrange(n)}", f"m{i}"})
        mid = f"x{i}"
        owner[mid] = agent
        events.append(memory(scope, mid, text, source_message_ids=cited,
                             occurred_at=T0 + timedelta(seconds=i)))
        if i and rng.random() < 0.4:
            events.append(link(scope, mid, f"x{rng.randrange(i)}", "supersedes"))
        if rng.random() < 0.3:
            events.append(lesson(scope, f"r{i}", f"lesson of {agent} number {i} on AAPL"))
    projector.apply(positioned(events))
    embedder = LocalEmbedder(DIM)
    for agent in _AGENTS:
        reader = ReadScope("t", "u", agent)
        for _ in range(3):
            query = " ".join(rng.choice(_WORDS) for _ in range(2))
            for hit in search(store, embedder, reader, query, 10):
                assert hit.agent_id == agent
        for mid, who in owner.items():
            got = store.get_memory(reader, mid)
            if who != agent:
                assert got is None
                continue
            assert got is not None
            assert all(m["agent_id"] == agent for m in got["source_messages"])
            assert all(lk["agent_id"] == agent for lk in got["links_in"] + got["links_out"])
            assert all(owner[p] == agent for p in got["history"]["predecessors"])
        ctx = context_for(store, reader, "AAPL", 5000)
        assert all(agent in r.content for r in ctx.same_subject + ctx.other_subjects)
        found = store.find_hashes(reader, [content_hash(e.content) for e in events if hasattr(e, "memory_id")])
        assert all(owner[m] == agent for m in found.values())


def test_a_memory_id_belongs_to_the_agent_that_wrote_it_first(store: LanceStore) -> None:
    projector = Projector(store, LocalEmbedder(DIM))
    projector.apply(positioned([memory(PLANNER, "plan-1", "the planner's plan")]))
    # a later batch, and a later record of one batch: neither replaces the row
    result = projector.apply(positioned([memory(SPY, "plan-1", "overwritten")], start=1))
    assert [reason for _, reason in result.failed] == [
        "memory id 'plan-1' belongs to agent 'planner' of this memory space; another agent's write never replaces it"
    ]
    result = projector.apply(
        positioned([memory(PLANNER, "plan-2", "second plan"), memory(SPY, "plan-2", "overwritten")], start=2)
    )
    assert [pe.position.offset for pe, _ in result.failed] == [3]
    for mid, text in (("plan-1", "the planner's plan"), ("plan-2", "second plan")):
        row = store.get_memory(ReadScope.pinned(PLANNER), mid)
        assert row is not None and row["content"] == text
    # the owner itself may write its id again (an update of its own memory)
    assert not projector.apply(positioned([memory(PLANNER, "plan-1", "plan, revised")], start=4)).failed
    row = store.get_memory(ReadScope.pinned(PLANNER), "plan-1")
    assert row is not None and row["content"] == "plan, revised"


def test_a_message_id_belongs_to_the_agent_that_wrote_it_first(store: LanceStore) -> None:
    projector = Projector(store, LocalEmbedder(DIM))
    projector.apply(positioned([turn(PLANNER, "m-1", "the planner's own words")]))
    result = projector.apply(positioned([turn(SPY, "m-1", "the spy's words"), turn(PLANNER, "m-2", "x"),
                                         turn(SPY, "m-2", "y")], start=1))
    assert sorted(pe.position.offset for pe, _ in result.failed) == [1, 3]
    assert all("turn id" in reason for _, reason in result.failed)
    assert store.get_messages(ReadScope.pinned(PLANNER), ["m-1"])[0]["content"] == "the planner's own words"
