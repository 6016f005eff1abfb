"""Embeddings from any OpenAI-compatible ``/embeddings`` endpoint through the official
``openai`` client (``MEMSTREAM_EMBEDDINGS_PROVIDER=openai``), batched, with the client's retries."""

from __future__ import annotations

import base64
import binascii
import json
import threading
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from memstream.projections.embedders.api import EmbedderConfigError, EmbedderUnavailableError, checked_matrix

__all__ = ["OpenAIEmbedder"]


def _decode_base64(data: str) -> np.ndarray:
    """An embedding sent as base64 of little-endian float32 values."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise EmbedderUnavailableError(f"an embedding is not valid base64: {exc}") from None
    if len(raw) % 4:
        raise EmbedderUnavailableError(f"an embedding holds {len(raw)} bytes, not whole float32 values")
    return np.frombuffer(raw, dtype="<f4")


class _AnswerItem(msgspec.Struct):
    index: int
    embedding: bytes  # base64 in the JSON, decoded by the parser


class _Answer(msgspec.Struct):
    data: list[_AnswerItem]


_ANSWER = msgspec.json.Decoder(_Answer)


def _base64_answer(raw: bytes, count: int, dim: int) -> np.ndarray | None:
    """An embeddings answer in its usual form (``count`` base64 vectors of ``dim``
    float32 values, finite, in input order) as a writable ``(count, dim)`` float32
    matrix; ``None`` for any other answer, left to the general reader."""
    try:
        items = _ANSWER.decode(raw).data
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    width = dim * 4
    if len(items) != count or any(item.index != i or len(item.embedding) != width for i, item in enumerate(items)):
        return None
    matrix = np.frombuffer(b"".join(item.embedding for item in items), dtype="<f4").reshape(count, dim)
    if not np.isfinite(matrix).all():
        return None
    return matrix.astype(np.float32)  # a writable copy in native order


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible endpoint through the official client.

    Texts go in requests of at most ``batch_size`` inputs (512: the no-LLM extractor's
    batch of up to 500 turns is one request; OpenAI accepts 2,048; a model server pads
    and batches within a request, so fewer, larger requests cost it less a text).
    Transient failures (connection errors, 408/409/429/5xx) are retried by the client with exponential
    backoff, ``max_retries`` times; anything left raises
    :class:`EmbedderUnavailableError`. ``dimensions`` is sent only to models that
    accept it (``text-embedding-3-*``); every answer is checked for count and width.
    """

    def __init__(
        self,
        *,
        model: str,
        dim: int,
        base_url: str | None = None,
        api_key: str | None = None,
        batch_size: int = 512,
        max_retries: int = 3,
        timeout_s: float = 60.0,
        send_dimensions: bool | None = None,
    ) -> None:
        import openai

        if batch_size < 1:
            raise EmbedderConfigError("batch_size must be at least 1")
        if api_key is None:
            if base_url is None:
                raise EmbedderConfigError(
                    "the openai embedder needs MEMSTREAM_EMBEDDINGS_API_KEY "
                    "(or MEMSTREAM_EMBEDDINGS_BASE_URL for a local server)"
                )
            api_key = "unused"  # local OpenAI-compatible servers usually ignore it
        self.model_id = model
        self.dim = dim
        self.batch_size = batch_size
        self._send_dimensions = (
            model.startswith("text-embedding-3") if send_dimensions is None else send_dimensions
        )
        self._openai = openai
        # One request in flight per embedder: a local model server computes one at a time,
        # so a second request waited in its queue on the client's clock, timed out under
        # load and was sent again while its first copy was computed (texts embedded twice)
        self._one_request = threading.Lock()
        self._client = openai.OpenAI(
            base_url=base_url, api_key=api_key, max_retries=max_retries, timeout=timeout_s
        )

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        out: list[list[float]] = self.embed_array(texts).tolist()
        return out

    def embed_array(self, texts: Sequence[str]) -> np.ndarray:
        """The vectors as one float32 matrix (see :func:`embed_array`): base64 answers
        are decoded straight into it, with no Python float per value."""
        parts = [self._embed_chunk(chunk) for chunk in self._chunks(texts)]
        if not parts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _chunks(self, texts: Sequence[str]) -> list[list[str]]:
        return [list(texts[start : start + self.batch_size]) for start in range(0, len(texts), self.batch_size)]

    def _embed_chunk(self, chunk: list[str]) -> np.ndarray:
        """One request; the answer's vectors in input order as a checked
        ``(len(chunk), dim)`` float32 matrix.

        Through the client's plain ``post`` (its retries, timeouts and error types)
        with the answer's bytes as they are: ``embeddings.create`` walks every input
        through the SDK's type transforms and builds a model object per vector, which
        for a batch of hundreds of texts cost more than the request itself. The usual
        answer (base64 float32 of the right width, in input order) is read by
        ``msgspec``, which decodes the base64 in C while it parses; anything else
        (plain numbers, shuffled indexes, a malformed answer) is read by the general
        path below, which also says what is wrong."""
        if any(not t.strip() for t in chunk):
            raise EmbedderUnavailableError("cannot embed an empty text")
        body: dict[str, Any] = {"model": self.model_id, "input": chunk, "encoding_format": "base64"}
        if self._send_dimensions:
            body["dimensions"] = self.dim
        try:
            with self._one_request:
                raw: bytes = self._client.post("/embeddings", body=body, cast_to=bytes)
        except self._openai.OpenAIError as exc:
            raise EmbedderUnavailableError(
                f"embedding request to {self.model_id!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
        quick = _base64_answer(raw, len(chunk), self.dim)
        if quick is not None:
            return quick
        return self._general_answer(raw, len(chunk))

    def _general_answer(self, raw: bytes, count: int) -> np.ndarray:
        who = f"embedding model {self.model_id!r}"
        try:
            answer: Any = json.loads(raw)
            data = sorted(answer["data"], key=lambda d: int(d["index"]))
            items = [d["embedding"] for d in data]
        except (TypeError, KeyError, ValueError) as exc:
            raise EmbedderUnavailableError(f"{who} answered without embeddings: {type(exc).__name__}: {exc}") from None
        if len(items) != count:
            raise EmbedderUnavailableError(f"{who} returned {len(items)} vectors for {count} texts")
        rows: list[np.ndarray] = []
        for item in items:
            if isinstance(item, str):
                rows.append(_decode_base64(item))
            elif isinstance(item, list):
                try:
                    rows.append(np.asarray(item, dtype=np.float32))
                except (TypeError, ValueError):
                    raise EmbedderUnavailableError(f"{who} returned an embedding that is not numbers") from None
            else:
                raise EmbedderUnavailableError(f"{who} returned an embedding of type {type(item).__name__}")
        return checked_matrix(rows, count, self.dim, who)

    def __repr__(self) -> str:
        return f"OpenAIEmbedder(model_id={self.model_id!r}, dim={self.dim})"
