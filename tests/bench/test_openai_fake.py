"""The scripted OpenAI-compatible server (:mod:`memstream.bench.openai_fake`) keeps the
promises the benchmarks build on, seen through the real ``openai`` client.

The extractor, reflector and embedder tests already exercise the scripted chat and
embedding replies; what only the benchmarks relied on is checked here: a server given a
memstream embedder serves *exactly* that embedder's vectors (``bench mem0`` feeds Mem0
the same vectors as memstream that way), a chat responder answers every unqueued
request, failures are counted by kind (``bench chaos`` reports them), and stopping the
server ends a hung request instead of leaving the client waiting.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from memstream.bench.openai_fake import OpenAICompatServer, Reply, hashed_embedding
from memstream.projections.embedders.factory import LocalEmbedder, OpenAIEmbedder


def _client(server: OpenAICompatServer, timeout: float = 10.0) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=timeout)


def _ask(client: openai.OpenAI, text: str = "hello") -> str | None:
    answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
    return answer.choices[0].message.content


def test_an_embedder_is_served_as_is_in_both_encodings() -> None:
    local = LocalEmbedder(64)
    with OpenAICompatServer(local) as server:
        assert server.embedding_model == local.model_id and server.embedding_dim == 64
        listed = {m.id for m in _client(server).models.list().data}
        assert listed == {"fake-model", local.model_id}
        texts = ["Ana lives in Porto", "Ben likes green tea", "?"]
        # OpenAIEmbedder asks for base64; the raw client below asks for floats
        remote = OpenAIEmbedder(model=local.model_id, dim=64, base_url=server.base_url, max_retries=0)
        assert np.allclose(remote.embed(texts), local.embed(texts), atol=1e-6)
        floats = _client(server).embeddings.create(model=local.model_id, input=texts, encoding_format="float")
        assert np.allclose([d.embedding for d in floats.data], local.embed(texts), atol=1e-6)
        assert [r["encoding_format"] for r in server.embeddings.requests] == ["base64", "float"]
        assert server.embedded_texts == 6 and server.embed_seconds > 0


def test_the_server_warms_its_embedder_before_it_serves() -> None:
    """A model server loads its model before it answers: the first client of the
    benchmark's server does not pay the embedder's warm-up on its clock."""
    warmed: list[bool] = []

    class Warmed(LocalEmbedder):
        def warm(self) -> None:
            warmed.append(True)

    server = OpenAICompatServer(Warmed(16))
    assert warmed == []
    with server:
        assert warmed == [True]


def test_without_an_embedder_vectors_are_hashed_at_the_asked_width() -> None:
    with OpenAICompatServer(embedding_dim=8) as server:
        client = _client(server)
        (default,) = client.embeddings.create(model="e", input="red bicycle", encoding_format="float").data
        assert np.allclose(default.embedding, hashed_embedding("red bicycle", 8), atol=1e-6)
        (wide,) = client.embeddings.create(model="e", input="red bicycle", dimensions=32, encoding_format="float").data
        assert np.allclose(wide.embedding, hashed_embedding("red bicycle", 32), atol=1e-6)
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(model="e", input=[])
        assert server.embeddings.failures == 1


def test_the_responder_answers_what_the_queue_does_not_and_failures_are_counted() -> None:
    seen: list[dict[str, Any]] = []

    def responder(body: dict[str, Any]) -> Reply:
        seen.append(body)
        return Reply(content=f"answer {len(seen)}")

    with OpenAICompatServer(chat=responder, timeout_hint_s=0.5) as server:
        client = _client(server, timeout=0.5)
        server.chat.push(Reply(content="queued"), Reply(status=500), Reply(raw=b"\x00<html>"), Reply(drop=True))
        server.chat.push(Reply(content="{}", delay=1.0))
        assert _ask(client) == "queued"
        with pytest.raises(openai.InternalServerError):
            _ask(client)
        with pytest.raises(ValueError):  # a garbage body: the client cannot decode it
            _ask(client)
        with pytest.raises(openai.APIConnectionError):  # the connection is dropped
            _ask(client)
        with pytest.raises(openai.APITimeoutError):
            _ask(client)
        assert server.chat.failures == 4 and seen == []
        assert _ask(client, "first unqueued") == "answer 1"
        assert seen[0]["messages"][0]["content"] == "first unqueued"
        assert server.chat.count == 6 and server.chat.failures == 4 and server.unscripted == 0


def test_outages_refused_formats_and_bad_bodies_fail_without_consuming_the_script() -> None:
    usage = {"prompt_tokens": 7, "completion_tokens": 3}
    with OpenAICompatServer() as server:
        client = _client(server)
        server.chat.push_json({"ok": True}, usage=usage)
        server.down = True
        with pytest.raises(openai.InternalServerError) as outage:
            _ask(client)
        assert outage.value.status_code == 503
        server.down = False
        server.reject_json_object = True
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], response_format={"type": "json_object"}
            )
        assert server.chat.pending == 1
        bad = httpx.post(f"{server.base_url}/chat/completions", content=b"{not json", timeout=10)
        assert bad.status_code == 400 and server.chat.requests[-1] == {"_unparsable": "{not json"}
        answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert answer.choices[0].message.content == '{"ok": true}'
        assert answer.usage is not None and answer.usage.total_tokens == 10
        assert usage == {"prompt_tokens": 7, "completion_tokens": 3}  # the script's dict is not written to
        with pytest.raises(openai.InternalServerError, match="unscripted"):
            _ask(client)
        assert server.unscripted == 1 and server.chat.count == 5 and server.chat.failures == 4


def test_stopping_ends_a_hung_request_instead_of_leaving_the_client_waiting() -> None:
    server = OpenAICompatServer(chat=lambda body: Reply(delay=600)).start()
    outcome: list[BaseException] = []
    client = _client(server, timeout=120.0)

    def call() -> None:
        try:
            _ask(client)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion below
            outcome.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    while server.chat.count == 0 and caller.is_alive():
        caller.join(0.05)
    server.stop()
    caller.join(60)
    assert not caller.is_alive()
    (error,) = outcome
    assert isinstance(error, openai.APIConnectionError) and not isinstance(error, openai.APITimeoutError)
    with pytest.raises(RuntimeError, match="not running"):
        server.base_url
