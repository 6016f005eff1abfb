"""Forgetting a subject in the projection: rows gone from every table and from the files."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

from tests.projections.projection_helpers import memory, positioned

from memstream.domain.events import MessageObserved, Scope, SubjectForgotten
from memstream.projections.projector.forget import SCOPED_TABLES, delete_subject, shred_deleted_rows, subject_where
from memstream.projections.projector.projector import Projector
from memstream.projections.store.lance_store import LanceStore

NO_READERS = timedelta(0)  # no other process reads these tables: no version need wait
ALICE = Scope(team_id="acme", user_id="alice")
BOB = Scope(team_id="acme", user_id="bob")
GLOBEX = Scope(team_id="globex", user_id="alice")


def _files_holding(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def _rows(store: LanceStore, scope: Scope) -> dict[str, list[dict]]:  # type: ignore[type-arg]
    where = subject_where(scope.team_id, scope.user_id)
    return {name: sorted(store.table(name).search().where(where).limit(None).to_list(), key=lambda r: r["pk"]) for name in SCOPED_TABLES}


def _project(projector: Projector, canary: str) -> None:
    events = []
    for n, scope in enumerate((ALICE, BOB, GLOBEX)):
        who = scope.user_id + scope.team_id
        for i in range(5):
            events.append(memory(scope, f"{who}-m{i}", f"{canary}-{who} note {i} about Lyon", entities=[("Lyon", "place")]))
            events.append(MessageObserved(scope=scope, message_id=f"{who}-t{i}", content=f"{canary}-{who} said {i}"))
    projector.apply(positioned(events))


def test_forgetting_a_user_leaves_no_row_and_no_byte_and_others_untouched(
    store: LanceStore, projector: Projector, tmp_path: Path
) -> None:
    canary = f"zq{uuid.uuid4().hex[:10]}"
    _project(projector, canary)
    store.ensure_base_indexes()
    store.optimize()
    before_bob, before_globex = _rows(store, BOB), _rows(store, GLOBEX)
    alice_needle = f"{canary}-aliceacme".encode()
    assert _files_holding(tmp_path / "lance", alice_needle)

    deleted = delete_subject(store, "acme", "alice")
    assert deleted["memories"] == 5 and deleted["messages"] == 5 and deleted["entities"] == 5
    shred_deleted_rows(store, grace=NO_READERS)

    assert all(rows == [] for rows in _rows(store, ALICE).values())
    assert not _files_holding(tmp_path / "lance", alice_needle)
    assert _rows(store, BOB) == before_bob and _rows(store, GLOBEX) == before_globex
    assert _files_holding(tmp_path / "lance", f"{canary}-bobacme".encode())


def test_forgetting_a_team_deletes_every_user_of_it(store: LanceStore, projector: Projector) -> None:
    _project(projector, "c")
    before = _rows(store, GLOBEX)
    delete_subject(store, "acme")
    shred_deleted_rows(store, grace=NO_READERS)
    assert all(rows == [] for rows in _rows(store, ALICE).values())
    assert all(rows == [] for rows in _rows(store, BOB).values())
    assert _rows(store, GLOBEX) == before
    assert delete_subject(store, "acme") == dict.fromkeys(SCOPED_TABLES, 0)  # twice: nothing left


def test_the_projector_deletes_a_subject_when_it_reaches_its_subject_forgotten(
    store: LanceStore, projector: Projector, tmp_path: Path
) -> None:
    canary = f"zq{uuid.uuid4().hex[:10]}"
    _project(projector, canary)
    before_bob = _rows(store, BOB)
    projector.reader_grace = NO_READERS
    late = memory(ALICE, "aliceacme-late", f"{canary}-aliceacme written in the same batch, before")
    forgotten = SubjectForgotten(scope=ALICE, key_ids=("ab" * 16,))
    result = projector.apply(positioned([late, forgotten], start=100))
    assert result.applied == 2 and not result.failed
    assert all(rows == [] for rows in _rows(store, ALICE).values())
    assert _rows(store, BOB) == before_bob
    assert not _files_holding(tmp_path / "lance", f"{canary}-aliceacme".encode())
    assert projector.positions()[("test.events", 0)] == 102


def test_a_forget_covers_what_precedes_it_in_its_topic_and_nothing_after(store: LanceStore, projector: Projector) -> None:
    projector.reader_grace = NO_READERS
    events = positioned([
        memory(ALICE, "before", "written before the forget"),
        SubjectForgotten(scope=ALICE, key_ids=("ab" * 16,)),
        memory(ALICE, "after", "written after the forget, same batch"),
    ])
    turns = positioned([
        MessageObserved(scope=ALICE, message_id="t-before", content="said before"),
        SubjectForgotten(scope=ALICE, key_ids=("ab" * 16,)),
        MessageObserved(scope=ALICE, message_id="t-after", content="said after"),
    ], topic="test.messages")
    projector.apply(events + turns)
    rows = _rows(store, ALICE)
    assert [r["memory_id"] for r in rows["memories"]] == ["after"]
    assert [r["message_id"] for r in rows["messages"]] == ["t-after"]
