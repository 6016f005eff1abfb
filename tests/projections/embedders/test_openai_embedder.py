"""The OpenAI-compatible embedder, against the scripted HTTP server through the real
``openai`` client (``memstream.projections.embedders.openai_embedder``)."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from tests.fakes.openai_server import FakeOpenAI, Reply, hashed_embedding

from memstream.projections.embedders.factory import EmbedderUnavailableError, OpenAIEmbedder


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(embedding_dim=16) as server:
        yield server


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


def test_one_request_at_a_time_so_none_waits_in_the_servers_queue_on_the_clients_clock(fake: FakeOpenAI) -> None:
    in_flight: list[int] = [0]
    most: list[int] = [0]
    lock = threading.Lock()

    def slow(_body: dict[str, object]) -> Reply:
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.2)  # a model at work: a second request sent meanwhile would overlap
        with lock:
            in_flight[0] -= 1
        return Reply()

    fake.embeddings.responder = slow
    emb = OpenAIEmbedder(model="fake-embedding", dim=16, base_url=fake.base_url, max_retries=0)
    with ThreadPoolExecutor(3) as pool:
        matrices = list(pool.map(emb.embed_array, [["a", "b"], ["c"], ["d", "e"]]))
    assert [m.shape[0] for m in matrices] == [2, 1, 2]
    assert fake.embeddings.count == 3 and most[0] == 1
