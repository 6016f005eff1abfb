"""The embedder interface: what every embedder offers, its errors, and the checked
ways the projector and search call one (:func:`embed_array`, :func:`embed_query`).

Embedding failures are never blamed on an event: a memory's content is validated when
the event is, so an error from the model is a configuration or availability problem,
and the projector lets it propagate (the worker retries) instead of dead-lettering.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = [
    "Embedder",
    "EmbedderError",
    "EmbedderConfigError",
    "EmbedderUnavailableError",
    "check_vectors",
    "checked_matrix",
    "embed_array",
    "embed_query",
    "warm_up",
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


def checked_matrix(rows: Sequence[np.ndarray], count: int, dim: int, who: str) -> np.ndarray:
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


def warm_up(embedder: Embedder) -> None:
    """Let the embedder load what its first batch call would otherwise load on that
    call's clock (the ONNX embedder's side-by-side session); a no-op for embedders
    without a ``warm`` method. For processes about to embed batches: a worker at its
    start, a model server before it serves."""
    warm = getattr(embedder, "warm", None)
    if warm is not None:
        warm()
