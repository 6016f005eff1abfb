"""Reads of several tables as of one projected position
(``memstream.projections.store.snapshot``): a memory read while the writer is half-way
through a batch answers as of the batch before, links and view together."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from tests.projections.projection_helpers import DIM, EVENTS_TOPIC, link, memory, positioned

from memstream.domain.events import Scope
from memstream.projections.projector.projector import Projector
from memstream.projections.projector.rows import arrow_table, link_row
from memstream.projections.schema import LINKS, MEMORIES
from memstream.projections.store.lance_store import LanceStore

ALICE = Scope(team_id="acme", user_id="alice")


def _reader(root: Path) -> LanceStore:
    """A reader beside the writer, as the API opens the set."""
    return LanceStore(root, embedding_dim=DIM, read_consistency_interval=timedelta(0), create=False)


def _answer(store: LanceStore) -> tuple[str, list[str]]:
    got = store.get_memory(ALICE, "a")
    assert got is not None
    return got["status"], [lk["link_id"] for lk in got["links_in"]]


def test_a_memory_read_mid_batch_answers_as_of_the_last_saved_position(
    store: LanceStore, projector: Projector, tmp_path: Path
) -> None:
    projector.apply(positioned([memory(ALICE, "a", "old fact"), memory(ALICE, "b", "new fact")]))
    reader = _reader(tmp_path / "lance")
    assert _answer(reader) == ("active", [])
    # The next batch is half-written: its link is committed, the view and positions not yet.
    newer = link(ALICE, "b", "a", "supersedes", link_id="l0")
    store.upsert(LINKS, arrow_table(LINKS, DIM, [link_row(newer, (EVENTS_TOPIC, 0, 2))]))
    assert store.count(LINKS) == 1 and reader.count(LINKS) == 1  # the newest version has it
    assert _answer(reader) == ("active", [])  # not the link without the view it sets
    projector.apply(positioned([newer], start=2))
    assert _answer(reader) == ("superseded", ["l0"])


def test_a_published_version_cleaned_up_since_is_read_at_the_newest(
    store: LanceStore, projector: Projector, tmp_path: Path
) -> None:
    projector.apply(positioned([memory(ALICE, "a", "old fact"), memory(ALICE, "b", "new fact"),
                                link(ALICE, "b", "a", "supersedes", link_id="l0")]))
    published = store.published_versions()[MEMORIES]
    # maintenance beside the idle writer commits (no row changes), then every older
    # version is dropped (a forget's shredding may, once they pass the readers' grace)
    for name in (MEMORIES, LINKS):
        ds = store.table(name).to_lance()
        ds.delete("pk = 'no such row'")
        ds = ds.checkout_version(ds.latest_version)
        ds.cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
    reader = _reader(tmp_path / "lance")
    assert published not in [v["version"] for v in reader.table(MEMORIES).list_versions()]
    assert _answer(reader) == ("superseded", ["l0"])


def test_pinned_handles_are_bounded_and_the_shared_handles_follow_the_writer(
    store: LanceStore, projector: Projector, tmp_path: Path
) -> None:
    reader = _reader(tmp_path / "lance")
    for i in range(12):
        projector.apply(positioned([memory(ALICE, f"m{i}", f"fact {i}")], start=i))
        assert reader.get_memory(ALICE, f"m{i}") is not None
    assert len(reader._pinned) <= 24
    assert reader.count(MEMORIES) == 12  # the shared handle is not checked out anywhere
