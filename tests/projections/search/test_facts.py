"""The space facts ranking reads beside the candidates: a read that waited for a log
position never takes one read before the view reached it."""

from __future__ import annotations

import time
from pathlib import Path

from tests.projections.projection_helpers import DIM, CountingEmbedder, positioned

from memstream.domain.events import MessageObserved, Scope
from memstream.projections.projector.projector import Projector
from memstream.projections.search.cache import READ_NOT_BEFORE, SearchCache
from memstream.projections.search.facts import space_speakers
from memstream.projections.store.lance_store import LanceStore

ALICE = Scope(team_id="acme", user_id="alice")


def test_a_read_that_waited_for_a_position_sees_the_speaker_it_waited_for(tmp_path: Path) -> None:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    projector = Projector(store, CountingEmbedder())
    cache = SearchCache()
    projector.apply(positioned([MessageObserved(scope=ALICE, message_id="t1", speaker="Zed", content="hi")]))
    assert space_speakers(cache, store, ALICE) == {"Zed"}
    projector.apply(positioned([MessageObserved(scope=ALICE, message_id="t2", speaker="Quinn", content="yo")], start=1))
    assert space_speakers(cache, store, ALICE) == {"Zed"}  # kept for a while: fine for a read that waits for nothing
    token = READ_NOT_BEFORE.set(time.monotonic())  # what MemoryService.wait_for sets once the position is reached
    try:
        assert space_speakers(cache, store, ALICE) == {"Zed", "Quinn"}
    finally:
        READ_NOT_BEFORE.reset(token)
