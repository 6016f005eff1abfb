"""Fixtures for the projection tests: a real LanceDB store under ``tmp_path``."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.projections.projection_helpers import DIM, CountingEmbedder

from memstream.projections.projector.projector import Projector
from memstream.projections.store.lance_store import LanceStore


@pytest.fixture
def store(tmp_path: Path) -> LanceStore:
    return LanceStore(tmp_path / "lance", embedding_dim=DIM)


@pytest.fixture
def embedder() -> CountingEmbedder:
    return CountingEmbedder()


@pytest.fixture
def projector(store: LanceStore, embedder: CountingEmbedder) -> Projector:
    return Projector(store, embedder)
