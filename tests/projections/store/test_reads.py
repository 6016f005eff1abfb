"""Scoped lookups (``memstream.projections.store.reads``): exact dedup by hash, and no
lookup without a scope."""

from __future__ import annotations

import pytest
from tests.projections.projection_helpers import DIM, link, memory, positioned

from memstream.domain.access import ReadScope
from memstream.domain.content import content_hash
from memstream.domain.events import Scope
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.store.lance_store import LanceStore, ScopeRequiredError, quote, space_where

ALICE = Scope(team_id="acme", user_id="alice")


BOB = Scope(team_id="acme", user_id="bob")


EVE = Scope(team_id="evil", user_id="alice")


def test_find_hashes_is_scoped_and_exact_across_the_space(store: LanceStore) -> None:
    projector = Projector(store, LocalEmbedder(DIM))
    texts = [f"fact number {i}" for i in range(1_200)]  # more than one IN-list chunk
    projector.apply(positioned([memory(ALICE, f"a{i}", t) for i, t in enumerate(texts)]))
    projector.apply(positioned([memory(BOB, "b0", texts[0]), memory(EVE, "e0", "only eve")], start=1_200))
    wanted = [content_hash(t) for t in texts] + [content_hash("only eve"), content_hash("never stored")]
    found = store.find_hashes(ALICE, wanted)
    assert len(found) == 1_200
    assert found[content_hash("fact number 1199")] == "a1199"
    # normalised content: case and whitespace do not matter
    assert store.find_hashes(ALICE, [content_hash("  FACT   number 7 ")]) == {content_hash("fact number 7"): "a7"}
    assert store.find_hashes(BOB, wanted) == {content_hash(texts[0]): "b0"}
    assert store.find_hashes(Scope(team_id="evil", user_id="bob"), wanted) == {}


def test_find_hashes_in_spaces_answers_each_space_alone_in_one_query(store: LanceStore) -> None:
    # two spaces whose "team/user" strings are equal ("a/b" + "c" and "a" + "b/c")
    left, right = Scope(team_id="a/b", user_id="c"), Scope(team_id="a", user_id="b/c")
    projector = Projector(store, LocalEmbedder(DIM))
    projector.apply(
        positioned(
            [
                memory(left, "l0", "shared words"),
                memory(left, "l1", "only left asked"),
                memory(right, "r0", "only right has"),
                memory(right, "r1", "only left asked"),  # stored here, asked only by left
                memory(ALICE, "a0", "shared words"),
                memory(BOB, "b0", "bob alone"),
            ]
        )
    )
    h = content_hash
    found = store.find_hashes_in_spaces(
        {
            ReadScope("a/b", "c"): [h("shared words"), h("only left asked")],
            ReadScope("a", "b/c"): [h("shared words"), h("only right has")],
            ReadScope("acme", "alice"): [h("shared words"), h("bob alone"), ""],
            ReadScope("acme", "nobody"): [h("shared words")],
        }
    )
    assert found == {
        ReadScope("a/b", "c"): {h("shared words"): "l0", h("only left asked"): "l1"},
        ReadScope("a", "b/c"): {h("only right has"): "r0"},  # left's "shared words" is not right's
        ReadScope("acme", "alice"): {h("shared words"): "a0"},  # Bob's memory was not Alice's question
    }
    # the same answers as one space at a time
    for sc, answer in found.items():
        asked = [h("shared words"), h("only left asked"), h("only right has"), h("bob alone")]
        assert {k: v for k, v in store.find_hashes(Scope(team_id=sc.team_id, user_id=sc.user_id), asked).items()
                if k in answer} == answer
    with pytest.raises(ScopeRequiredError):
        store.find_hashes_in_spaces({ReadScope("", "alice"): [h("shared words")]})


def test_find_hashes_pinned_to_an_agent_sees_that_agent_only(store: LanceStore) -> None:
    # the extractor's exact dedup for an agent's turns: another agent's memory of the
    # same text is neither a duplicate nor an answer (it would be an oracle)
    planner = Scope(team_id="acme", user_id="alice", agent_id="planner")
    spy = Scope(team_id="acme", user_id="alice", agent_id="spy")
    Projector(store, LocalEmbedder(DIM)).apply(
        positioned([memory(planner, "p0", "the launch code is 1234"), memory(spy, "s0", "spy text")])
    )
    h = content_hash
    asked = [h("the launch code is 1234"), h("spy text")]
    assert store.find_hashes(ReadScope.pinned(spy), asked) == {h("spy text"): "s0"}
    assert store.find_hashes(ReadScope.pinned(planner), asked) == {h("the launch code is 1234"): "p0"}
    both = store.find_hashes_in_spaces({ReadScope.pinned(spy): asked, ReadScope.pinned(planner): asked})
    assert both == {
        ReadScope.pinned(spy): {h("spy text"): "s0"},
        ReadScope.pinned(planner): {h("the launch code is 1234"): "p0"},
    }
    assert store.find_hashes(planner, asked) == {h("the launch code is 1234"): "p0", h("spy text"): "s0"}


def test_find_hashes_prefers_the_current_memory(store: LanceStore) -> None:
    projector = Projector(store, LocalEmbedder(DIM))
    projector.apply(
        positioned(
            [
                memory(ALICE, "first", "same words"),
                memory(ALICE, "second", "same words"),
                link(ALICE, "first", "second", "duplicates"),
            ]
        )
    )
    assert store.find_hashes(ALICE, [content_hash("same words")]) == {content_hash("same words"): "second"}


def test_scope_is_required_for_lookups(store: LanceStore) -> None:
    with pytest.raises(ScopeRequiredError):
        store.find_hashes(None, ["x"])  # type: ignore[arg-type]
    with pytest.raises(ScopeRequiredError):
        store.get_memory(None, "x")  # type: ignore[arg-type]
    assert space_where(ALICE) == "team_id = 'acme' AND user_id = 'alice'"
    assert quote("o'brien") == "'o''brien'"
    with pytest.raises(ValueError):
        quote("nul\x00byte")


def test_memory_owner_names_the_agent_within_the_space_only(store: LanceStore) -> None:
    planner = Scope(team_id="acme", user_id="alice", agent_id="planner")
    projector = Projector(store, LocalEmbedder(DIM))
    projector.apply(positioned([memory(planner, "m1", "planner's fact"), memory(BOB, "m2", "bob's fact")]))
    whole_space = ReadScope(team_id="acme", user_id="alice")
    assert store.memory_owner(whole_space, "m1") == "planner"
    assert store.memory_owner(ReadScope("acme", "alice", "spy"), "m1") is None  # a read pinned to another agent
    assert store.memory_owner(whole_space, "m2") is None  # bob's space, not alice's
    assert store.memory_owner(EVE, "m1") is None
    assert store.memory_owner(whole_space, "never-stored") is None
