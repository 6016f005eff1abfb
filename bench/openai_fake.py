"""A scripted OpenAI-compatible HTTP server: the one fake model memstream allows.

Why it exists: memstream talks to language and embedding models only through the real
``openai`` client, and the project's rule is that tests and benchmarks exercise that
client for real, over HTTP, against a server that *behaves* like a provider (timeouts,
error statuses, garbage bodies, dropped connections, refused ``response_format``
modes). Faking the client instead would hide exactly the failures the extractor and
reflector must survive. Both the test suite (through ``tests/fakes/openai_server.py``)
and the benchmarks (``memstream bench chaos``, ``memstream bench mem0``) use this one
implementation; it lives in the package because benchmarks ship in the wheel and
cannot import from ``tests/``.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/embeddings``, ``POST /v1/rerank``
(the Jina/Cohere shape llama.cpp's server answers), ``GET /v1/models``.

Each POST endpoint is a :class:`Script`: a queue of :class:`Reply` objects
(``server.chat.push(...)``); when the queue is empty, ``script.responder`` (a function of
the request body) is asked, and with no responder the server answers 500 "unscripted"
and counts it in ``server.unscripted``. A reply is an assistant message (text or a JSON
value), an HTTP error status, a delay (longer than the client's timeout = a timeout), a
dropped connection, or raw bytes sent verbatim. ``server.down = True`` fails every
request with 503 until it is set back (an outage); ``reject_json_schema``,
``reject_json_object_schema`` (``{"type": "json_object", "schema": ...}``) and
``reject_json_object`` make the chat endpoint refuse that ``response_format`` (an older
or smaller provider) without consuming the scripted reply, with the status
``format_refusal_status`` (400; llama-cpp-python's server answers a ``json_schema`` with
a 500 whose body names the format, which 500 here imitates).

Embeddings, unless a reply scripts ``vectors``, come from ``embedder`` (any memstream
:class:`~memstream.projections.embedders.factory.Embedder`, so a second system pointed at
:attr:`OpenAICompatServer.base_url` gets exactly the vectors memstream computes) or,
without one, from :func:`hashed_embedding` (deterministic, ``embedding_dim`` floats or
the request's ``dimensions``). ``encoding_format`` "float" and "base64" are honoured.
Rerank scores, unless a reply scripts ``scores``, are :func:`overlap_score`: the share
of the query's words a document holds (a lexical stand-in, not a cross-encoder).

Every request body is recorded (``script.requests``) so a caller can check what was
asked; ``script.failures`` counts the requests not answered with a usable success
(for a benchmark's report), ``embedded_texts`` / ``embed_seconds`` what embedding cost.

Usage::

    with OpenAICompatServer() as server:
        server.chat.push_json({"scenes": []})
        settings = Settings(llm_base_url=server.base_url, ...)

    server = OpenAICompatServer(embedder, chat=flaky_model, timeout_hint_s=5.0).start()
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from memstream.projections.embedders import embed_array, warm_up

if TYPE_CHECKING:
    from memstream.projections.embedders import Embedder

__all__ = ["Reply", "Responder", "Script", "OpenAICompatServer", "hashed_embedding", "overlap_score"]


@dataclass
class Reply:
    """One scripted answer, to a chat or an embeddings request.

    ``content`` is the assistant message text (``json_value``, when given, is dumped into
    it instead); ``status`` != 200 answers an OpenAI-style error body carrying
    ``error_message``; ``delay`` seconds pass before answering (cut short when the
    server stops); ``drop`` closes the connection without an answer; ``raw`` is sent as
    the body verbatim with ``status`` (garbage, half a JSON document...). ``usage``,
    ``finish_reason`` and ``model`` override what a chat answer reports; ``vectors``
    are the embeddings an embeddings answer returns instead of computed ones.
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
    scores: list[float] | None = None
    """The relevance scores a rerank answer gives the documents, in their order."""

    def text(self) -> str | None:
        """The assistant message this reply carries."""
        if self.json_value is not None:
            return json.dumps(self.json_value)
        return self.content

    def fails(self, timeout_hint_s: float = math.inf) -> bool:
        """Whether a client sees this reply as a failure: an error status, a body that is
        not a provider answer, a dropped connection, or a delay of at least the client's
        timeout (``timeout_hint_s``; the server cannot know it otherwise)."""
        return self.status != 200 or self.raw is not None or self.drop or self.delay >= timeout_hint_s


Responder = Callable[[dict[str, Any]], Reply]
"""Answers one request body when no queued reply is left (called from server threads)."""


@dataclass
class Script:
    """The scripted behaviour of one endpoint: a queue, then a responder, else 500."""

    replies: deque[Reply] = field(default_factory=deque)
    responder: Responder | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _failures: int = field(default=0, init=False, repr=False)

    def push(self, *replies: Reply) -> Script:
        """Queue ``replies``, answered in order before the responder is asked."""
        with self.lock:
            self.replies.extend(replies)
        return self

    def push_json(self, value: Any, **kwargs: Any) -> Script:
        """Queue an assistant message holding ``value`` as JSON."""
        return self.push(Reply(json_value=value, **kwargs))

    def push_text(self, text: str, **kwargs: Any) -> Script:
        """Queue an assistant message holding ``text``."""
        return self.push(Reply(content=text, **kwargs))

    def push_error(self, status: int = 500, message: str = "scripted error", **kwargs: Any) -> Script:
        """Queue an OpenAI-style error answer with ``status``."""
        return self.push(Reply(status=status, error_message=message, **kwargs))

    def clear(self) -> None:
        """Drop the queued replies (the responder stays)."""
        with self.lock:
            self.replies.clear()

    @property
    def pending(self) -> int:
        """Queued replies not yet answered."""
        with self.lock:
            return len(self.replies)

    @property
    def count(self) -> int:
        """Requests received (answered or failed)."""
        with self.lock:
            return len(self.requests)

    @property
    def failures(self) -> int:
        """Requests not answered with a usable success (see :meth:`Reply.fails`), plus
        outages, unscripted requests, refused formats and malformed requests."""
        with self.lock:
            return self._failures

    def record(self, body: dict[str, Any]) -> None:
        """Record a request that will not consume a reply (an outage, a bad body)."""
        with self.lock:
            self.requests.append(body)

    def record_failure(self) -> None:
        """Count one failed request."""
        with self.lock:
            self._failures += 1

    def next_reply(self, body: dict[str, Any]) -> Reply | None:
        """Record ``body`` and return its answer: the next queued reply, else the
        responder's, else ``None`` (unscripted)."""
        with self.lock:
            self.requests.append(body)
            if self.replies:
                return self.replies.popleft()
        if self.responder is not None:
            return self.responder(body)
        return None

    def put_back(self, reply: Reply) -> None:
        """Return an unused ``reply`` to the head of the queue."""
        with self.lock:
            self.replies.appendleft(reply)


_WORD = re.compile(r"\w+", re.UNICODE)


def hashed_embedding(text: str, dim: int) -> list[float]:
    """A deterministic bag-of-words unit vector of ``dim`` floats: texts sharing words
    are close, the same text gives the same vector in every process."""
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


_WORD = re.compile(r"[a-z0-9]+")


def overlap_score(query: str, document: str) -> float:
    """The share of the query's distinct words (lower-cased) that ``document`` holds."""
    wanted = set(_WORD.findall(query.lower()))
    return len(wanted & set(_WORD.findall(document.lower()))) / len(wanted) if wanted else 0.0


def _approx_tokens(text: str) -> int:
    """About four characters a token: enough for usage figures to be plausible."""
    return max(1, len(text) // 4)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: the headers and the body go out as two writes; with Nagle on, a
    # small body waits for the client's delayed ACK of the headers, about 40 ms per
    # request on a kept-alive connection (measured: 44 ms for one embedding instead
    # of 2 ms), which real providers do not cost and which swamped search latency.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        return

    def _send(self, status: int, body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client gave up (a timeout): nothing to answer

    def _hang_up(self) -> None:
        """Close the connection without an answer (the client sees it dropped)."""
        self.close_connection = True
        try:
            self.connection.shutdown(2)
        except OSError:
            pass

    def _error(self, status: int, message: str) -> None:
        kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
        body = {"error": {"message": message, "type": kind, "code": status}}
        self._send(status, json.dumps(body).encode())

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        fake = self.server.fake
        if fake._stopping.is_set():  # a kept-alive connection outlives serve_forever
            self._hang_up()
            return
        if self.path.split("?")[0].rstrip("/").endswith("/models"):
            data = [{"id": name, "object": "model"} for name in dict.fromkeys((fake.model, fake.embedding_model))]
            self._send(200, json.dumps({"object": "list", "data": data}).encode())
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        fake = self.server.fake
        if fake._stopping.is_set():  # a kept-alive connection outlives serve_forever
            self._hang_up()
            return
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""  # read first: the connection is kept alive
        path = self.path.split("?")[0].rstrip("/")
        if path.endswith("/chat/completions"):
            script, answer = fake.chat, self._chat
        elif path.endswith("/embeddings"):
            script, answer = fake.embeddings, self._embeddings
        elif path.endswith("/rerank"):
            script, answer = fake.rerank, self._rerank
        else:
            self._error(404, f"no route {self.path}")
            return
        try:
            parsed = json.loads(raw or b"{}")
        except ValueError:
            script.record({"_unparsable": raw.decode("utf-8", "replace")})
            script.record_failure()
            self._error(400, "body is not JSON")
            return
        body: dict[str, Any] = parsed if isinstance(parsed, dict) else {"_body": parsed}
        if fake.down:
            script.record(body)
            script.record_failure()
            self._error(503, "the fake endpoint is down")
            return
        reply = script.next_reply(body)
        if reply is None:
            with fake._lock:
                fake.unscripted += 1
            script.record_failure()
            self._error(500, "unscripted request")
            return
        if reply.fails(fake.timeout_hint_s):
            script.record_failure()
        if (reply.delay > 0 and fake._stopping.wait(reply.delay)) or reply.drop:
            self._hang_up()  # stopping cuts a scripted delay short: no answer comes
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
        with_schema = isinstance(fmt, dict) and "schema" in fmt
        if (
            (kind == "json_schema" and fake.reject_json_schema)
            or (kind == "json_object" and with_schema and fake.reject_json_object_schema)
            or (kind == "json_object" and not with_schema and fake.reject_json_object)
        ):
            fake.chat.put_back(reply)  # refusing the format does not consume the scripted reply
            fake.chat.record_failure()
            status = fake.format_refusal_status
            if status >= 500:  # the shape of llama-cpp-python's validation error
                self._error(status, f"[{{'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
                            f"'msg': \"Input should be 'text' or 'json_object'\", 'input': '{kind}'}}]")
            else:
                self._error(status, f"response_format {kind} is not supported")
            return
        text = reply.text()
        prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict))
        usage = dict(reply.usage) if reply.usage is not None else {
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
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reply.finish_reason}
            ],
            "usage": usage,
        }
        self._send(200, json.dumps(payload).encode())

    def _embeddings(self, body: dict[str, Any], reply: Reply) -> None:
        fake = self.server.fake
        inputs = body.get("input")
        texts = [inputs] if isinstance(inputs, str) else list(inputs or [])
        if not texts or not all(isinstance(t, str) for t in texts):
            fake.embeddings.record_failure()
            self._error(400, "input must be a string or a non-empty list of strings")
            return
        vectors: Sequence[Sequence[float]]
        if reply.vectors is not None:
            vectors = reply.vectors
        else:
            vectors = fake.embed(texts, int(body.get("dimensions") or fake.embedding_dim))
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for i, vec in enumerate(vectors):
            value: Any = (
                base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode()
                if as_base64
                else [float(x) for x in vec]
            )
            data.append({"object": "embedding", "index": i, "embedding": value})
        tokens = sum(_approx_tokens(t) for t in texts)
        payload = {
            "object": "list",
            "data": data,
            "model": body.get("model") or fake.embedding_model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        self._send(200, json.dumps(payload).encode())


    def _rerank(self, body: dict[str, Any], reply: Reply) -> None:
        fake = self.server.fake
        query, documents = body.get("query"), body.get("documents")
        if not isinstance(query, str) or not isinstance(documents, list) or not all(isinstance(d, str) for d in documents):
            fake.rerank.record_failure()
            self._error(400, "query must be a string and documents a list of strings")
            return
        scores = reply.scores if reply.scores is not None else [overlap_score(query, d) for d in documents]
        ranked = sorted(range(len(scores)), key=lambda i: -scores[i])[: int(body.get("top_n") or len(scores))]
        results = [{"index": i, "relevance_score": scores[i]} for i in ranked]
        self._send(200, json.dumps({"model": body.get("model") or fake.model, "results": results}).encode())


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: OpenAICompatServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (a timeout, a scripted dropped connection) is not an
        error worth a traceback on stderr; anything else still is."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class OpenAICompatServer:
    """The scripted endpoint on 127.0.0.1 (a free port), served from a background thread.

    ``embedder`` computes unscripted embeddings (else :func:`hashed_embedding`); ``chat``
    is the chat endpoint's responder (``server.chat.responder``), asked when no reply is
    queued. ``model`` and ``embedding_model`` (default: the embedder's ``model_id``) are
    the names ``/v1/models`` lists and answers report when a request names none;
    ``embedding_dim`` (default: the embedder's ``dim``, else 384) is the width of hashed
    vectors. ``timeout_hint_s`` is the clients' timeout, so that a scripted delay at
    least that long counts as a failure. Start with ``with OpenAICompatServer() as
    server`` or ``start()``.
    """

    def __init__(
        self,
        embedder: Embedder | None = None,
        chat: Responder | None = None,
        *,
        model: str = "fake-model",
        embedding_model: str | None = None,
        embedding_dim: int | None = None,
        timeout_hint_s: float = math.inf,
    ) -> None:
        self.embedder = embedder
        self.model = model
        self.embedding_model = embedding_model or (embedder.model_id if embedder is not None else "fake-embedding")
        self.embedding_dim = embedding_dim or (embedder.dim if embedder is not None else 384)
        self.timeout_hint_s = timeout_hint_s
        self.chat = Script(responder=chat)
        self.embeddings = Script(responder=lambda body: Reply())
        self.rerank = Script(responder=lambda body: Reply())
        self.reject_json_schema = False
        self.reject_json_object_schema = False
        self.reject_json_object = False
        self.format_refusal_status = 400
        self.down = False
        self.unscripted = 0
        self.embedded_texts = 0
        self.embed_seconds = 0.0
        self._lock = threading.Lock()
        self._embed_lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def embed(self, texts: list[str], dim: int) -> Sequence[Sequence[float]]:
        """Unscripted embeddings of ``texts``: the embedder's (one call at a time, as a
        model server would run them), else hashed vectors of ``dim`` floats. The
        embedder's answer is its float32 matrix (:func:`memstream.projections.embedders.factory.embed_array`;
        rows written out as they are, not through Python floats: the server is on the
        clock of every benchmark that embeds through it)."""
        start = time.perf_counter()
        vectors: Sequence[Sequence[float]]
        if self.embedder is not None:
            with self._embed_lock:
                vectors = cast(Sequence[Sequence[float]], embed_array(self.embedder, texts))
        else:
            vectors = [hashed_embedding(t, dim) for t in texts]
        with self._lock:
            self.embed_seconds += time.perf_counter() - start
            self.embedded_texts += len(texts)
        return vectors

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the fake OpenAI server is not running")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """What ``llm_base_url`` / ``embedding_base_url`` should be set to."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> OpenAICompatServer:
        """Listen and serve (a no-op while already serving)."""
        if self._server is not None:
            return self
        if self.embedder is not None:
            warm_up(self.embedder)  # as a model server loads its model before it serves
        self._stopping.clear()
        server = _Server(("127.0.0.1", 0), _Handler)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="openai-fake", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; scripted delays still running end at once without an answer."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> OpenAICompatServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
