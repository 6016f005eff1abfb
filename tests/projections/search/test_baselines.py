"""The baselines (``memstream.projections.search.baselines``) report their own scores."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.projections.projection_helpers import DIM, memory, positioned

from memstream.domain.events import Scope
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.search.hybrid import SearchResult, rrf_search, text_search, vector_search
from memstream.projections.store.lance_store import LanceStore

EMB = LocalEmbedder(DIM)


ALICE = Scope(team_id="acme", user_id="alice")


def _project(tmp_path: Path, events: list) -> LanceStore:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    Projector(store, EMB).apply(positioned(events))
    return store


def _ids(results: list[SearchResult]) -> list[str]:
    return [r.memory_id for r in results]


def test_baselines_report_their_own_scores(tmp_path: Path) -> None:
    store = _project(tmp_path, [memory(ALICE, "x", "kayak rental by the lake"), memory(ALICE, "y", "tax forms")])
    v = vector_search(store, EMB, ALICE, "kayak rental", k=1)
    assert _ids(v) == ["x"] and v[0].parts.text is None and v[0].score == pytest.approx(v[0].parts.vector)
    t = text_search(store, EMB, ALICE, "kayak", k=5)
    assert _ids(t) == ["x"] and t[0].parts.vector is None and t[0].score > 0
    r = rrf_search(store, EMB, ALICE, "kayak rental", k=2)
    assert r[0].memory_id == "x" and r[0].parts.fused == pytest.approx(1.0)
    # the extractor passes its own vector for candidate recall
    vec = EMB.embed(["tax forms"])[0]
    assert _ids(vector_search(store, EMB, ALICE, "", k=1, vector=vec)) == ["y"]
