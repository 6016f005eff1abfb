"""The projector against real LanceDB tables: idempotence, positions, links, embeddings,
bad events, the decision ledger and entities."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from tests.projections.projection_helpers import DIM, EVENTS_TOPIC, T0, CountingEmbedder, carried, link, memory, positioned

from memstream.domain.events import (
    DecisionExpired,
    MemoryReflected,
    MessageObserved,
    OutcomeObserved,
    Scope,
)
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector, derive_view
from memstream.projections.schema import DECISIONS, ENTITIES, MEMORIES, POSITIONS, REFLECTIONS
from memstream.projections.store.lance_store import LanceStore

ALICE = Scope(team_id="acme", user_id="alice")
BOB = Scope(team_id="acme", user_id="bob")


def _stream() -> list:
    """A small mixed log of one space, links before and after their memories."""
    return [
        MessageObserved(scope=ALICE, message_id="turn-1", content="I love cheese pizza", occurred_at=T0),
        memory(ALICE, "m1", "Alice likes cheese pizza", source_message_ids=("turn-1",),
               entities=[("Alice", "person")]),
        link(ALICE, "m3", "m2", "duplicates"),
        memory(ALICE, "m2", "Alice enjoys cheese pizza a lot"),
        memory(ALICE, "m3", "Alice enjoys cheese pizza very much"),
        memory(ALICE, "m4", "Alice now prefers pepperoni pizza", entities=[("Alice", "person")]),
        link(ALICE, "m4", "m1", "supersedes"),
        memory(BOB, "m1", "Bob drives a red car"),
    ]


def _fresh(tmp_path: Path, name: str) -> tuple[LanceStore, Projector]:
    st = LanceStore(tmp_path / name, embedding_dim=DIM)
    return st, Projector(st, LocalEmbedder(DIM))


def test_apply_writes_rows_and_positions(store: LanceStore, projector: Projector) -> None:
    batch = positioned(_stream())
    result = projector.apply(batch)
    assert (result.applied, result.skipped, result.failed) == (len(batch), 0, [])
    assert store.count(MEMORIES) == 5  # alice m1..m4 + bob m1: same id, two spaces
    assert store.positions() == {(EVENTS_TOPIC, 0): len(batch)}
    assert store.get_messages(ALICE, ["turn-1"])[0]["content"] == "I love cheese pizza"
    assert store.get_memories(BOB, ["m1"])[0]["content"] == "Bob drives a red car"
    assert store.get_memories(ALICE, ["m1"])[0]["content"] == "Alice likes cheese pizza"


def test_apply_twice_and_overlapping_batches_give_identical_digests(tmp_path: Path) -> None:
    events = _stream()
    one, p_one = _fresh(tmp_path, "one")
    p_one.apply(positioned(events))
    expected = one.table_digest()

    # the same batch twice: the second is entirely below the stored position
    p_one_again = Projector(one, LocalEmbedder(DIM))
    again = p_one_again.apply(positioned(events))
    assert (again.applied, again.skipped) == (0, len(events))
    assert one.table_digest() == expected

    # overlapping batches, as a restart re-reading part of the log would deliver them
    two, p_two = _fresh(tmp_path, "two")
    batch = positioned(events)
    p_two.apply(batch[:5])
    overlap = p_two.apply(batch[2:])
    assert overlap.skipped == 3
    assert two.table_digest() == expected

    # rows written but positions lost (crash between the two writes): re-applying the
    # whole batch converges to the same state
    three, p_three = _fresh(tmp_path, "three")
    p_three.apply(batch)
    three.table(POSITIONS).delete("true")
    assert three.positions() == {}
    restarted = Projector(three, LocalEmbedder(DIM))  # a crash means a new process
    redo = restarted.apply(batch)
    assert redo.applied == len(batch)
    assert three.table_digest() == expected
    assert three.count(MEMORIES) == 5  # no duplicates


def test_old_offsets_are_skipped_per_partition(store: LanceStore, projector: Projector) -> None:
    p0 = positioned([memory(ALICE, "a", "first fact")], partition=0, start=10)
    p1 = positioned([memory(BOB, "b", "second fact")], partition=1, start=3)
    projector.apply(p0 + p1)
    assert store.positions() == {(EVENTS_TOPIC, 0): 11, (EVENTS_TOPIC, 1): 4}

    stale = positioned([memory(ALICE, "a", "rewritten below the position")], partition=0, start=5)
    newer = positioned([memory(BOB, "c", "third fact")], partition=1, start=4)
    result = projector.apply(stale + newer)
    assert (result.applied, result.skipped) == (1, 1)
    assert store.get_memories(ALICE, ["a"])[0]["content"] == "first fact"
    assert store.positions() == {(EVENTS_TOPIC, 0): 11, (EVENTS_TOPIC, 1): 5}

    # another topic has its own positions
    msgs = positioned([MessageObserved(scope=ALICE, message_id="t", content="hello")], topic="test.messages")
    projector.apply(msgs)
    assert store.positions()[("test.messages", 0)] == 1


def test_upsert_of_an_existing_memory_updates_it(store: LanceStore, projector: Projector) -> None:
    """Regression guard for lancedb #3177 / #3515: merge_insert on an existing key must
    really update, also after optimize() with scalar indexes present."""
    projector.apply(positioned([memory(ALICE, f"m{i}", f"fact number {i}") for i in range(300)]))
    assert store.ensure_indexes() == {}  # scalar and FTS indexes exist from the start
    store.optimize()
    indexed = {c for idx in store.table(MEMORIES).list_indices() for c in idx.columns}
    assert {"team_id", "user_id", "memory_id", "content_hash", "content"} <= indexed

    projector.apply(positioned([memory(ALICE, "m7", "fact number seven, corrected")], start=300))
    assert store.count(MEMORIES) == 300
    assert store.get_memories(ALICE, ["m7"])[0]["content"] == "fact number seven, corrected"

    store.optimize()
    projector.apply(positioned([memory(ALICE, "m7", "fact number seven, corrected twice")], start=301))
    assert store.count(MEMORIES) == 300
    assert store.count(MEMORIES, "memory_id = 'm7'") == 1
    assert store.get_memories(ALICE, ["m7"])[0]["content"] == "fact number seven, corrected twice"


def test_one_key_twice_in_a_batch_keeps_the_last(store: LanceStore, projector: Projector) -> None:
    batch = positioned([memory(ALICE, "x", "draft"), memory(ALICE, "x", "final version")])
    result = projector.apply(batch)
    assert result.failed == []
    assert store.count(MEMORIES) == 1
    assert store.get_memories(ALICE, ["x"])[0]["content"] == "final version"


def test_links_supersede_and_duplicate(store: LanceStore, projector: Projector) -> None:
    projector.apply(positioned(_stream()))
    m1, m2, m3, m4 = store.get_memories(ALICE, ["m1", "m2", "m3", "m4"])
    assert (m1["superseded_by"], m1["status"]) == ("m4", "superseded")
    assert (m4["superseded_by"], m4["status"]) == (None, "active")
    # duplicates: the from-memory (m3) points at its canonical memory (m2)
    assert (m3["canonical_id"], m3["status"]) == ("m2", "duplicate")
    assert (m2["canonical_id"], m2["status"]) == (None, "active")
    # the same memory id in another space is untouched
    assert store.get_memories(BOB, ["m1"])[0]["status"] == "active"


def test_contradicts_marks_the_older_memory(store: LanceStore, projector: Projector) -> None:
    projector.apply(
        positioned(
            [
                memory(ALICE, "old", "The meeting is on Monday"),
                memory(ALICE, "new", "The meeting moved to Tuesday"),
                link(ALICE, "new", "old", "contradicts"),
                link(ALICE, "new", "old", "same_entity"),
            ]
        )
    )
    old, new = store.get_memories(ALICE, ["old", "new"])
    assert old["superseded_by"] == "new"
    assert new["superseded_by"] is None


def test_link_before_memory_takes_effect_when_the_memory_arrives(store: LanceStore, projector: Projector) -> None:
    projector.apply(positioned([link(ALICE, "newer", "older", "supersedes"), link(ALICE, "dup", "canon", "duplicates")]))
    assert store.count(MEMORIES) == 0
    projector.apply(
        positioned(
            [
                memory(ALICE, "older", "Alice lives in Paris"),
                memory(ALICE, "newer", "Alice moved to Lyon"),
                memory(ALICE, "dup", "Alice lives in Lyon now"),
            ],
            start=2,
        )
    )
    older, newer, dup = store.get_memories(ALICE, ["older", "newer", "dup"])
    assert older["superseded_by"] == "newer"
    assert newer["status"] == "active"
    assert dup["canonical_id"] == "canon"


def test_latest_link_wins_and_links_never_cross_spaces(store: LanceStore, projector: Projector) -> None:
    projector.apply(
        positioned(
            [
                memory(ALICE, "a", "version one"),
                memory(ALICE, "b", "version two"),
                memory(ALICE, "c", "version three"),
                link(ALICE, "b", "a", "supersedes"),
                link(ALICE, "c", "a", "supersedes"),
                # Bob's space names Alice's memory id: it must not touch Alice's row
                link(BOB, "evil", "b", "supersedes"),
            ]
        )
    )
    a, b = store.get_memories(ALICE, ["a", "b"])
    assert a["superseded_by"] == "c"
    assert b["superseded_by"] is None


@pytest.mark.parametrize("one_batch", [False, True])
@pytest.mark.parametrize("relation", ["supersedes", "duplicates"])
def test_a_reused_link_id_gives_the_old_end_its_view_back(
    store: LanceStore, projector: Projector, one_batch: bool, relation: str
) -> None:
    """The agent's later link of the same id replaces the earlier one, ends included
    (the fold's rule): the memory the earlier link set is recomputed too."""
    events = [memory(ALICE, m, f"fact {m}") for m in ("a", "b", "c")]
    first, second = link(ALICE, "b", "a", relation, link_id="l0"), link(ALICE, "c", "b", relation, link_id="l0")
    if one_batch:
        projector.apply(positioned([*events, first, second]))
    else:
        projector.apply(positioned([*events, first]))
        projector.apply(positioned([second], start=4))
    a, b, c = store.get_memories(ALICE, ["a", "b", "c"])
    was_set = a if relation == "supersedes" else b
    now_set = b if relation == "supersedes" else c
    assert (was_set["status"], was_set["superseded_by"], was_set["canonical_id"]) == ("active", None, None)
    assert now_set["status"] == ("superseded" if relation == "supersedes" else "duplicate")
    got_a = store.get_memory(ALICE, "a")
    assert got_a is not None and got_a["links_out"] == got_a["links_in"] == []


def test_get_memory_has_links_history_and_evidence(store: LanceStore, projector: Projector) -> None:
    projector.apply(positioned(_stream()))
    got = store.get_memory(ALICE, "m1")
    assert got is not None
    assert got["history"] == {"predecessors": [], "successors": ["m4"]}
    assert [link_["from_memory_id"] for link_ in got["links_in"]] == ["m4"]
    assert [m["message_id"] for m in got["source_messages"]] == ["turn-1"]
    assert got["entities"] == [{"name": "Alice", "kind": "person"}]
    newest = store.get_memory(ALICE, "m4")
    assert newest is not None and newest["history"]["predecessors"] == ["m1"]
    assert [link_["to_memory_id"] for link_ in newest["links_out"]] == ["m1"]
    assert store.get_memory(BOB, "m4") is None
    assert store.get_memory(Scope(team_id="other", user_id="alice"), "m1") is None


def test_embedding_carried_is_used_and_others_embedded_in_one_call(
    store: LanceStore, projector: Projector, embedder: CountingEmbedder
) -> None:
    own = [float(i % 5) / 10.0 for i in range(DIM)]
    events = [
        memory(ALICE, "carried", "carried vector", embedding=carried(own, embedder.model_id)),
        memory(ALICE, "foreign", "vector of another model", embedding=carried([1.0] * 8, "other-model")),
        memory(ALICE, "plain", "no vector at all"),
    ]
    result = projector.apply(positioned(events))
    assert result.failed == []
    assert embedder.calls == [["vector of another model", "no vector at all"]]
    rows = {r["memory_id"]: r for r in store.get_memories(ALICE, ["carried", "foreign", "plain"], with_vector=True)}
    assert np.allclose(rows["carried"]["vector"], own)
    assert np.allclose(rows["plain"]["vector"], LocalEmbedder(DIM).embed(["no vector at all"])[0])
    assert {r["embedding_model"] for r in rows.values()} == {embedder.model_id}

    # a batch where everything carries a vector never calls the embedder
    projector.apply(positioned([memory(ALICE, "c2", "again", embedding=carried(own, embedder.model_id))], start=3))
    assert len(embedder.calls) == 1


def test_unprojectable_event_fails_alone(store: LanceStore, projector: Projector, embedder: CountingEmbedder) -> None:
    bad = memory(ALICE, "bad", "wrong width", embedding=carried([0.5] * (DIM + 4), embedder.model_id))
    batch = positioned([memory(ALICE, "good1", "fine"), bad, memory(ALICE, "good2", "also fine")])
    result = projector.apply(batch)
    assert result.applied == 2
    assert [(pe.event.memory_id, reason) for pe, reason in result.failed] == [  # type: ignore[attr-defined]
        ("bad", f"embedding of model {embedder.model_id!r} has dimension {DIM + 4}; the memories table holds {DIM}")
    ]
    assert result.failed[0][0] is batch[1]
    assert sorted(r["memory_id"] for r in store.get_memories(ALICE, ["good1", "bad", "good2"])) == ["good1", "good2"]
    assert store.positions() == {(EVENTS_TOPIC, 0): 3}  # the worker dead-letters it; we go on


def test_projector_refuses_an_embedder_of_another_width(store: LanceStore) -> None:
    with pytest.raises(ValueError, match="dimension"):
        Projector(store, LocalEmbedder(DIM * 2))


def test_decision_ledger_and_reflections(store: LanceStore, projector: Projector) -> None:
    deadline = T0 + timedelta(days=5)
    expired = DecisionExpired(scope=ALICE, decision_id="d1", subject="AAPL", deadline=deadline, occurred_at=deadline)
    reflected = MemoryReflected(
        scope=ALICE,
        reflection_id="r1",
        decision_id="d2",
        outcome_id="o2",
        subject="MSFT",
        rating="buy",
        decision_text="Buy MSFT ahead of earnings",
        raw_return=0.04,
        alpha=0.01,
        correct=True,
        content="The buy call on MSFT was right: it beat the market by 1%. Earnings drove it.",
        lesson="Earnings momentum carried.",
    )
    late_expiry = DecisionExpired(scope=ALICE, decision_id="d2", subject="MSFT", deadline=deadline)
    outcome = OutcomeObserved(scope=ALICE, outcome_id="o9", subject="AAPL", raw_return=0.1, horizon_days=5)
    result = projector.apply(positioned([expired, reflected, late_expiry, outcome]))
    assert result.applied == 4 and result.failed == []
    ledger = {r["decision_id"]: r for r in store.decisions_for(ALICE)}
    assert ledger["d1"]["status"] == "expired"
    assert ledger["d1"]["reason"] == "no outcome by the deadline"
    # reflected outranks a later expiry of the same decision, and keeps its fields
    assert ledger["d2"]["status"] == "reflected"
    assert (ledger["d2"]["reflection_id"], ledger["d2"]["rating"]) == ("r1", "buy")
    assert store.count(REFLECTIONS) == 1
    (ref,) = store.reflections_for(ALICE, subject="MSFT")
    assert (ref["correct"], ref["alpha"], ref["lesson"]) == (True, 0.01, "Earnings momentum carried.")
    assert store.decisions_for(BOB) == []
    assert store.count(DECISIONS) == 2


def test_entities_follow_the_latest_version_of_a_memory(store: LanceStore, projector: Projector) -> None:
    projector.apply(positioned([memory(ALICE, "e", "Alice met Bob in Paris",
                                       entities=[("Alice", "person"), ("Bob", "person"), ("Paris", "place")])]))
    assert store.memories_for_entity(ALICE, "paris") == ["e"]
    assert store.entity_frequencies(ALICE, ["ALICE", "bob", "nobody"]) == {"alice": 1, "bob": 1, "nobody": 0}
    projector.apply(positioned([memory(ALICE, "e", "Alice met Bob in Rome",
                                       entities=[("Alice", "person"), ("Rome", "place")])], start=1))
    assert store.memories_for_entity(ALICE, "Paris") == []
    assert store.memories_for_entity(ALICE, "Rome") == ["e"]
    assert store.count(ENTITIES) == 2
    assert store.memories_for_entity(BOB, "Rome") == []


def test_derive_view_is_order_independent() -> None:
    def row(link_id: str, src: str, dst: str, rel: str, off: int) -> dict:
        return {"link_id": link_id, "from_memory_id": src, "to_memory_id": dst, "relation": rel,
                "log_topic": "t", "log_partition": 0, "log_offset": off}

    links = [row("l1", "b", "a", "supersedes", 1), row("l2", "c", "a", "contradicts", 2), row("l3", "a", "z", "duplicates", 3)]
    assert derive_view("a", links) == ("c", "z", "superseded")
    assert derive_view("a", list(reversed(links))) == ("c", "z", "superseded")
    assert derive_view("z", links) == (None, None, "active")
    assert derive_view("q", [row("l4", "q", "p", "duplicates", 0)]) == (None, "p", "duplicate")


def test_positioned_event_batches_from_two_partitions_keep_their_own_order(store: LanceStore, projector: Projector) -> None:
    """Batches interleave partitions; the view must not depend on the interleaving."""
    e0 = positioned([memory(ALICE, "p", "from partition zero")], partition=0, start=7)
    e1 = positioned([memory(BOB, "p", "from partition one")], partition=1, start=2)
    projector.apply([e1[0], e0[0]])
    assert store.get_memories(ALICE, ["p"])[0]["log_offset"] == 7
    assert store.get_memories(BOB, ["p"])[0]["log_partition"] == 1
    assert store.positions() == {(EVENTS_TOPIC, 0): 8, (EVENTS_TOPIC, 1): 3}
