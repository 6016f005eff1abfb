"""Priority in ranking: it orders near-equals and never outweighs relevance; --explain
shows it. Real LanceDB tables on disk, the local embedder."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.projections.projection_helpers import DIM, memory, positioned
from typer.testing import CliRunner

from memstream.domain.events import Scope
from memstream.domain.priority import PRIORITY_WEIGHT, priority_factor
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.search.hybrid import search
from memstream.projections.store.lance_store import LanceStore

EMB = LocalEmbedder(DIM)
ALICE = Scope(team_id="acme", user_id="alice")


def _project(tmp_path: Path, events: list) -> LanceStore:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    Projector(store, EMB).apply(positioned(events))
    return store


@given(st.integers(-50, 150), st.integers(-50, 150))
def test_the_factor_is_small_bounded_and_ordered(a: int, b: int) -> None:
    fa, fb = priority_factor(a), priority_factor(b)
    assert 1 - PRIORITY_WEIGHT <= fa <= 1 + PRIORITY_WEIGHT
    assert (fa < fb) == (min(100, max(0, a)) < min(100, max(0, b)))
    assert priority_factor(50) == priority_factor(None) == 1.0


def test_priority_orders_equally_relevant_memories(tmp_path: Path) -> None:
    store = _project(
        tmp_path,
        [
            memory(ALICE, "aside", "answer in French when asked about the invoices", priority=10),
            memory(ALICE, "instruction", "answer in French when asked about the invoices ", priority=90),
        ],
    )
    results = search(store, EMB, ALICE, "answer in French invoices")
    assert [r.memory_id for r in results] == ["instruction", "aside"]
    assert results[0].parts.priority == pytest.approx(1.04) and results[1].parts.priority == pytest.approx(0.96)


def test_priority_never_outweighs_relevance(tmp_path: Path) -> None:
    store = _project(
        tmp_path,
        [
            memory(ALICE, "relevant", "the standing desk order ships on Friday", priority=0),
            memory(ALICE, "important", "always cc the finance team on orders", priority=100),
        ],
    )
    results = search(store, EMB, ALICE, "when does the standing desk order ship")
    assert results[0].memory_id == "relevant"


def test_explain_shows_the_priority_factor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from memstream.cli import app
    from memstream.settings.model import get_settings

    _project(tmp_path, [memory(ALICE, "m", "answer in French about invoices", priority=90)])
    monkeypatch.setenv("MEMSTREAM_EMBEDDINGS_PROVIDER", "local")  # the lexical embedder at the tables' small width
    monkeypatch.setenv("MEMSTREAM_EMBEDDINGS_DIM", str(DIM))
    get_settings.cache_clear()
    try:
        base = ["search", "French invoices", "--team", "acme", "--user", "alice", "--lance-dir", str(tmp_path / "lance")]
        result = CliRunner().invoke(app, [*base, "--explain"])
    finally:
        get_settings.cache_clear()  # no later test may see these settings
    assert result.exit_code == 0, result.output
    assert "priority 90 x1.040" in result.output
