"""The embedder interface and registry: checked matrices (``api``) and
``build_embedder`` (``memstream.projections.embedders.factory``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pytest
from tests.fakes.openai_server import FakeOpenAI
from pydantic import SecretStr

from memstream.projections.embedders.factory import (
    EmbedderConfigError,
    EmbedderUnavailableError,
    LocalEmbedder,
    OpenAIEmbedder,
    build_embedder,
    embed_array,
)
from memstream.settings.model import Settings


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(embedding_dim=16) as server:
        yield server


def test_embed_array_is_the_vectors_as_one_float32_matrix() -> None:
    emb = LocalEmbedder(32)
    texts = ["one memory", "another one", ""]
    matrix = embed_array(emb, texts)
    assert matrix.dtype == np.float32 and matrix.shape == (3, 32)
    assert matrix.tolist() == emb.embed(texts)
    assert embed_array(emb, []).shape == (0, 32)

    class ListsOnly:
        """An embedder with only ``embed`` (the protocol's minimum)."""

        model_id, dim = "lists-only", 4

        def __init__(self, vectors: list[list[float]]) -> None:
            self.vectors = vectors

        def embed(self, texts: Sequence[str]) -> list[list[float]]:
            return self.vectors[: len(texts)]

    assert embed_array(ListsOnly([[0.5, 0.5, 0.5, 0.5]]), ["a"]).tolist() == [[0.5] * 4]
    with pytest.raises(EmbedderUnavailableError, match="2 vectors for 1 texts|1 vectors for 2 texts"):
        embed_array(ListsOnly([[0.5] * 4]), ["a", "b"])
    with pytest.raises(EmbedderUnavailableError, match="NaN or infinite"):
        embed_array(ListsOnly([[float("nan")] * 4]), ["a"])


def test_build_embedder(fake: FakeOpenAI) -> None:
    assert isinstance(build_embedder(Settings(embedder="local", embedding_dim=64).embeddings), LocalEmbedder)
    remote = build_embedder(
        Settings(embedder="openai", embedding_model="fake-embedding", embedding_dim=16,
                 embedding_base_url=fake.base_url, embedding_api_key=SecretStr("sk-test")).embeddings
    )
    assert isinstance(remote, OpenAIEmbedder) and remote.model_id == "fake-embedding"
    assert len(remote.embed(["x"])[0]) == 16
    with pytest.raises(EmbedderConfigError, match="API_KEY"):
        build_embedder(Settings(embedder="openai").embeddings)
    with pytest.raises(EmbedderConfigError, match="unknown embedder"):
        build_embedder(Settings(embedder="word2vec").embeddings)
    with pytest.raises(EmbedderConfigError, match="384"):
        build_embedder(Settings(embedder="minilm", embedding_dim=128).embeddings)
