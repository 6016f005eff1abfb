"""The reference model's rules, one by one, on hand-written logs (the oracle must be
right before the stateful test may trust it)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from memstream.domain.access import ReadScope
from memstream.domain.events import (
    DecisionExpired,
    DecisionRecorded,
    Entity,
    MemoryAdded,
    MemoryLinked,
    MemoryReflected,
    MessageObserved,
    OutcomeObserved,
    Scope,
    SubjectForgotten,
    build_event,
)
from memstream.domain.fold import fold

A = Scope(team_id="t1", user_id="alice", agent_id="a1")
A2 = Scope(team_id="t1", user_id="alice", agent_id="a2")
B = Scope(team_id="t1", user_id="bob", agent_id="a1")
C = Scope(team_id="t2", user_id="alice", agent_id="a1")
ALICE = ReadScope("t1", "alice")
LATER = datetime(2030, 1, 1, tzinfo=timezone.utc)


def mem(scope: Scope, mid: str, text: str = "", **kw: object) -> MemoryAdded:
    return build_event(MemoryAdded, scope=scope, memory_id=mid, content=text or f"{mid} fact", **kw)  # type: ignore[return-value]


def link(scope: Scope, lid: str, frm: str, to: str, relation: str = "supersedes") -> MemoryLinked:
    return build_event(  # type: ignore[return-value]
        MemoryLinked, scope=scope, link_id=lid, from_memory_id=frm, to_memory_id=to, relation=relation
    )


def forget(scope: Scope, whole_team: bool = False) -> SubjectForgotten:
    return build_event(SubjectForgotten, scope=scope, whole_team=whole_team)  # type: ignore[return-value]


def test_a_forget_removes_what_came_before_it_and_keeps_what_comes_after() -> None:
    state = fold([mem(A, "m1"), mem(B, "m1"), forget(A), mem(A, "m2"), build_event(MessageObserved, scope=A, message_id="t", content="hi")])
    assert set(state.memories(ALICE)) == {"m2"}
    assert state.turns(ALICE) == {"t": "hi"}
    assert set(state.memories(ReadScope("t1", "bob"))) == {"m1"}  # another space untouched
    assert state.forgotten == [("t1", "alice")]


def test_a_whole_team_forget_empties_every_space_of_the_team_only() -> None:
    state = fold([mem(A, "m1"), mem(B, "m2"), mem(C, "m3"), forget(A, whole_team=True), mem(B, "m4")])
    assert state.memories(ALICE) == {}
    assert set(state.memories(ReadScope("t1", "bob"))) == {"m4"}
    assert set(state.memories(ReadScope("t2", "alice"))) == {"m3"}


def test_an_id_belongs_to_its_first_agent_until_the_space_is_forgotten() -> None:
    state = fold([mem(A, "m1", "first"), mem(A2, "m1", "taken"), mem(A, "m1", "rewritten")])
    got = state.memory(ALICE, "m1")
    assert got is not None and (got.agent_id, got.content) == ("a1", "rewritten")
    state = fold([forget(A), mem(A2, "m1", "new life")], into=state)
    got = state.memory(ALICE, "m1")
    assert got is not None and (got.agent_id, got.content) == ("a2", "new life")


def test_turn_ids_are_owned_the_same_way() -> None:
    state = fold([
        build_event(MessageObserved, scope=A, message_id="t1", content="mine"),
        build_event(MessageObserved, scope=A2, message_id="t1", content="theirs"),
    ])
    assert state.turns(ALICE) == {"t1": "mine"}
    assert state.turns(ReadScope("t1", "alice", "a2")) == {}


def test_the_view_comes_from_the_memorys_own_agents_links_latest_first() -> None:
    state = fold([
        link(A, "l0", "m2", "m1"),  # before its memories: still counts
        mem(A, "m1"), mem(A, "m2"), mem(A, "m3"),
        link(A2, "l1", "m3", "m1"),  # another agent's link never supersedes
        link(A, "l2", "m3", "m1", "contradicts"),
        link(A, "l3", "m2", "m3", "duplicates"),
    ])
    m1, m3 = state.memory(ALICE, "m1"), state.memory(ALICE, "m3")
    assert m1 is not None and (m1.status, m1.superseded_by) == ("superseded", "m3")
    assert m1.links_in == ("l0", "l1", "l2")
    assert m3 is not None and m3.status == "active" and m3.links_in == ("l3",) and m3.links_out == ("l1", "l2")
    m2 = state.memory(ALICE, "m2")
    assert m2 is not None and (m2.status, m2.canonical_id) == ("duplicate", "m3")
    pinned = state.memory(ReadScope("t1", "alice", "a1"), "m1")
    assert pinned is not None and pinned.links_in == ("l0", "l2")  # a2's link is not a1's to see


def test_a_reused_link_id_replaces_the_agents_earlier_link_ends_included() -> None:
    state = fold([mem(A, "m1"), mem(A, "m2"), mem(A, "m3"), link(A, "l0", "m2", "m1"), link(A, "l0", "m3", "m2")])
    m1, m2 = state.memory(ALICE, "m1"), state.memory(ALICE, "m2")
    assert m1 is not None and (m1.status, m1.superseded_by, m1.links_in) == ("active", None, ())
    assert m2 is not None and (m2.status, m2.superseded_by, m2.links_in) == ("superseded", "m3", ("l0",))
    assert state.links(ALICE) == {("a1", "l0"): ("m3", "m2", "supersedes")}


def test_another_agents_link_and_decision_of_the_same_id_are_other_rows() -> None:
    deadline = LATER + timedelta(days=5)
    d = dict(decision_id="d1", subject="ACME", rating="buy", decision_text="buy it", deadline=deadline)
    state = fold([
        mem(A, "m1"), mem(A, "m2"), link(A, "l0", "m2", "m1"), link(A2, "l0", "m1", "m2"),
        build_event(DecisionRecorded, scope=A, **d),
        build_event(MemoryReflected, scope=A, reflection_id="r1", outcome_id="o1", content="It rose.",
                    **{k: d[k] for k in ("decision_id", "subject", "rating")}),
        build_event(DecisionRecorded, scope=A2, **d),
    ])
    assert state.links(ALICE) == {("a1", "l0"): ("m2", "m1", "supersedes"), ("a2", "l0"): ("m1", "m2", "supersedes")}
    m1 = state.memory(ALICE, "m1")
    assert m1 is not None and (m1.status, m1.links_in, m1.links_out) == ("superseded", ("l0",), ("l0",))
    assert state.decisions(ALICE) == {("a1", "d1"): "reflected", ("a2", "d1"): "pending"}


def test_a_read_sees_its_space_and_a_pinned_read_its_agent_only() -> None:
    state = fold([mem(A, "m1", "alice a1"), mem(A2, "m2"), mem(B, "m1", "bob"), mem(C, "m1", "other team")])
    assert set(state.memories(ALICE)) == {"m1", "m2"}
    assert set(state.memories(ReadScope("t1", "alice", "a2"))) == {"m2"}
    assert state.memory(ReadScope("t1", "alice", "a2"), "m1") is None
    assert state.memory(ReadScope("t1", "bob"), "m1").content == "bob"  # type: ignore[union-attr]
    assert state.memory(ReadScope("t2", "alice"), "m1").content == "other team"  # type: ignore[union-attr]
    assert state.memory(ReadScope("t3", "alice"), "m1") is None


def test_evidence_is_the_memorys_own_agents_turns() -> None:
    state = fold([
        build_event(MessageObserved, scope=A, message_id="t1", content="a1 said"),
        build_event(MessageObserved, scope=A2, message_id="t2", content="a2 said"),
        mem(A, "m1", source_message_ids=("t1", "t2", "t1", "missing")),
    ])
    got = state.memory(ReadScope("t1", "alice", "a1"), "m1")
    assert got is not None and got.source_messages == (("t1", "a1 said"),)


def test_a_decision_only_moves_up_and_a_lesson_is_kept() -> None:
    deadline = LATER + timedelta(days=5)
    d = dict(decision_id="d1", subject="ACME")
    state = fold([
        build_event(DecisionRecorded, scope=A, rating="buy", decision_text="buy it", deadline=deadline, **d),
        build_event(OutcomeObserved, scope=A, outcome_id="o1", raw_return=0.1, horizon_days=5, decision_id="d1", subject="ACME"),
        build_event(MemoryReflected, scope=A, reflection_id="r1", outcome_id="o1", rating="buy", content="It rose.", **d),
        build_event(DecisionExpired, scope=A, deadline=deadline, **d),
    ])
    assert state.decisions(ALICE) == {("a1", "d1"): "reflected"}
    assert state.lessons(ALICE, "ACME") == {"r1": "It rose."}
    assert state.lessons(ALICE, "OTHER") == {}
    assert state.lessons(ReadScope("t1", "alice", "a2")) == {}


def test_entities_by_normalised_name_oldest_write_first() -> None:
    state = fold([
        mem(A, "m1", entities=(Entity(name="Alice Smith", kind="person"),)),
        mem(A2, "m2", entities=(Entity(name="ALICE  smith"),)),
        mem(A, "m3"),
    ])
    assert state.entity(ALICE, "alice smith") == ["m1", "m2"]
    assert state.entity(ReadScope("t1", "alice", "a2"), "Alice Smith") == ["m2"]
    assert state.entity(ALICE, "   ") == []


_ids = st.sampled_from(["m1", "m2", "m3"])
_scopes = st.sampled_from([A, A2, B])
def _safe_link(scope: Scope, lid: str, frm: str, to: str) -> MemoryLinked | MemoryAdded:
    return link(scope, lid, frm, to) if frm != to else mem(scope, frm)


_events = st.one_of(
    st.builds(mem, _scopes, _ids),
    st.builds(_safe_link, _scopes, st.sampled_from(["l1", "l2"]), _ids, _ids),
    st.builds(forget, _scopes),
)


@given(st.lists(_events, max_size=12), st.integers(0, 12))
def test_folding_in_two_parts_equals_folding_at_once(events: list, cut: int) -> None:  # type: ignore[type-arg]
    whole = fold(events)
    parts = fold(events[cut:], into=fold(events[:cut]))
    for scope in (ALICE, ReadScope("t1", "alice", "a2"), ReadScope("t1", "bob")):
        assert whole.memories(scope) == parts.memories(scope)
        assert whole.links(scope) == parts.links(scope)


def test_a_forget_of_an_unknown_space_is_recorded_and_changes_nothing_else() -> None:
    state = fold([mem(A, "m1"), forget(Scope(team_id="t1", user_id="carol"))])
    assert set(state.memories(ALICE)) == {"m1"} and state.forgotten == [("t1", "carol")]
