"""A small OpenAI-compatible HTTP server for tests: the only fake memstream allows.

The code under test talks to it through the real ``openai`` client over real HTTP, so
timeouts, status codes, malformed bodies and the client's own parsing are exercised
exactly as against a real endpoint. Each test scripts what the "model" answers.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/embeddings``, ``GET /v1/models``.

Chat answers come from a queue of :class:`Reply` objects (``server.chat.push(...)``);
when the queue is empty, ``server.chat.responder`` (a function of the request body) is
asked, and with no responder the server answers 500 "unscripted" and counts it in
``server.unscripted``. A reply can be: a JSON value or text as the assistant message, an
HTTP error status, a delay (longer than the client's timeout = a timeout), a dropped
connection, or raw bytes (garbage). ``server.down = True`` makes every request fail
with 503 until it is set back, to simulate an outage.

Embeddings are deterministic by default (a hashed bag of words, L2-normalised, of
``embedding_dim`` floats), honour ``encoding_format`` ("float" or "base64") and can be
scripted the same way through ``server.embeddings``.

Usage (as a pytest fixture in the test module)::

    from tests.fakes.openai_server import FakeOpenAI  # the repo root is on pytest's pythonpath

    @pytest.fixture
    def fake_llm():
        with FakeOpenAI() as server:
            yield server

    def test_x(fake_llm):
        fake_llm.chat.push_json({"scenes": []})
        settings = Settings(llm_base_url=fake_llm.base_url, ...)

Requests are recorded (``server.chat.requests``, ``server.embeddings.requests``) so a
test can check what was asked, e.g. which ``response_format`` was sent.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

__all__ = ["Reply", "Script", "FakeOpenAI", "fake_llm", "hashed_embedding"]


@dataclass
class Reply:
    """One scripted answer.

    ``content`` is the assistant message text (``json_value`` is dumped into it when
    given); ``status`` != 200 answers an OpenAI-style error body instead; ``delay``
    seconds pass before answering; ``drop`` closes the connection without an answer;
    ``raw`` is sent as the body verbatim (garbage, half a JSON document...).
    """

    content: str | None = None
    json_value: Any = None
    status: int = 200
    delay: float = 0.0
    drop: bool = False
    raw: bytes | None = None
    usage: dict[str, int] | None = None
    finish_reason: str = "stop"
    model: str | None = None
    error_message: str = "scripted error"
    vectors: list[list[float]] | None = None

    def text(self) -> str | None:
        if self.json_value is not None:
            return json.dumps(self.json_value)
        return self.content


@dataclass
class Script:
    """The scripted behaviour of one endpoint: a queue, then a responder, else 500."""

    replies: deque[Reply] = field(default_factory=deque)
    responder: Callable[[dict[str, Any]], Reply] | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def push(self, *replies: Reply) -> "Script":
        with self.lock:
            self.replies.extend(replies)
        return self

    def push_json(self, value: Any, **kwargs: Any) -> "Script":
        return self.push(Reply(json_value=value, **kwargs))

    def push_text(self, text: str, **kwargs: Any) -> "Script":
        return self.push(Reply(content=text, **kwargs))

    def push_error(self, status: int = 500, message: str = "scripted error", **kwargs: Any) -> "Script":
        return self.push(Reply(status=status, error_message=message, **kwargs))

    def clear(self) -> None:
        with self.lock:
            self.replies.clear()

    @property
    def pending(self) -> int:
        with self.lock:
            return len(self.replies)

    @property
    def count(self) -> int:
        with self.lock:
            return len(self.requests)

    def _next(self, body: dict[str, Any]) -> Reply | None:
        with self.lock:
            self.requests.append(body)
            if self.replies:
                return self.replies.popleft()
        if self.responder is not None:
            return self.responder(body)
        return None


_WORD = re.compile(r"\w+", re.UNICODE)


def hashed_embedding(text: str, dim: int) -> list[float]:
    """A deterministic bag-of-words vector: texts sharing words are close."""
    vec = [0.0] * dim
    for word in _WORD.findall(text.lower()):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        slot = int.from_bytes(digest[:4], "little") % dim
        vec[slot] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vec))
    if norm == 0.0:
        vec[0] = 1.0
        return vec
    return [v / norm for v in vec]


def _approx_tokens(text: str) -> int:
    return max(1, len(text) // 4)


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        return

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # the client gave up (timeout): nothing to answer

    def _error(self, status: int, message: str) -> None:
        body = {"error": {"message": message, "type": "fake_error", "code": status}}
        self._send(status, json.dumps(body).encode())

    def _read_body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_unparsable": raw.decode("utf-8", "replace")}
        return body if isinstance(body, dict) else {"_body": body}

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        fake = self.server.fake
        if self.path.rstrip("/").endswith("/models"):
            self._send(200, json.dumps({"object": "list", "data": [{"id": fake.model, "object": "model"}]}).encode())
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        fake = self.server.fake
        body = self._read_body()
        path = self.path.split("?")[0].rstrip("/")
        if path.endswith("/chat/completions"):
            script, answer = fake.chat, self._chat
        elif path.endswith("/embeddings"):
            script, answer = fake.embeddings, self._embeddings
        else:
            self._error(404, f"no route {self.path}")
            return
        if fake.down:
            with script.lock:
                script.requests.append(body)
            self._error(503, "the fake endpoint is down")
            return
        reply = script._next(body)
        if reply is None:
            with fake._lock:
                fake.unscripted += 1
            self._error(500, "unscripted request")
            return
        if reply.delay > 0 and fake._stopping.wait(reply.delay):
            return
        if reply.drop:
            self.close_connection = True
            try:
                self.connection.shutdown(2)
            except OSError:
                pass
            return
        if reply.raw is not None:
            self._send(reply.status, reply.raw)
            return
        if reply.status != 200:
            self._error(reply.status, reply.error_message)
            return
        answer(body, reply)

    def _chat(self, body: dict[str, Any], reply: Reply) -> None:
        fake = self.server.fake
        fmt = body.get("response_format") or {}
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if (kind == "json_schema" and fake.reject_json_schema) or (
            kind == "json_object" and fake.reject_json_object
        ):
            # Refusing the format does not consume the scripted reply: put it back.
            with fake.chat.lock:
                fake.chat.replies.appendleft(reply)
            self._error(400, f"response_format {kind} is not supported")
            return
        text = reply.text()
        prompt = " ".join(
            str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict)
        )
        usage = reply.usage or {
            "prompt_tokens": _approx_tokens(prompt),
            "completion_tokens": _approx_tokens(text or ""),
        }
        usage.setdefault("total_tokens", usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0))
        payload = {
            "id": f"chatcmpl-fake-{fake.chat.count}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": reply.model or body.get("model") or fake.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": reply.finish_reason,
                }
            ],
            "usage": usage,
        }
        self._send(200, json.dumps(payload).encode())

    def _embeddings(self, body: dict[str, Any], reply: Reply) -> None:
        fake = self.server.fake
        inputs = body.get("input")
        texts = [inputs] if isinstance(inputs, str) else list(inputs or [])
        dim = int(body.get("dimensions") or fake.embedding_dim)
        vectors = reply.vectors or [hashed_embedding(str(t), dim) for t in texts]
        b64 = body.get("encoding_format") == "base64"
        data = []
        for i, vec in enumerate(vectors):
            value: Any = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode() if b64 else vec
            data.append({"object": "embedding", "index": i, "embedding": value})
        tokens = sum(_approx_tokens(str(t)) for t in texts)
        payload = {
            "object": "list",
            "data": data,
            "model": body.get("model") or fake.embedding_model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        self._send(200, json.dumps(payload).encode())


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: "FakeOpenAI"


class FakeOpenAI:
    """The scripted endpoint; start with ``with FakeOpenAI() as server`` or ``start()``."""

    def __init__(
        self,
        *,
        model: str = "fake-model",
        embedding_model: str = "fake-embedding",
        embedding_dim: int = 384,
    ) -> None:
        self.model = model
        self.embedding_model = embedding_model
        self.embedding_dim = embedding_dim
        self.chat = Script()
        self.embeddings = Script(responder=lambda body: Reply())
        self.reject_json_schema = False
        self.reject_json_object = False
        self.down = False
        self.unscripted = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the fake server is not running")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """What ``llm_base_url`` / ``embedding_base_url`` should be set to."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "FakeOpenAI":
        if self._server is not None:
            return self
        self._stopping.clear()
        server = _Server(("127.0.0.1", 0), _Handler)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-openai", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()  # cut scripted delays short
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "FakeOpenAI":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAI]:
    """A running :class:`FakeOpenAI` for one test (import this name into a test module
    to use it as a fixture)."""
    with FakeOpenAI() as server:
        yield server
