"""Embedders: one small interface (``embedder_api``) and the implementations
``settings.embedder`` chooses from (:func:`build_embedder`).

Every embedder has a ``model_id`` (stored with each vector, so a vector is only reused
by the model that made it) and a ``dim`` (the width of the ``vector`` column).

* ``onnx`` (default): :class:`OnnxEmbedder`, a neural sentence-embedding model run
  offline by onnxruntime (all-MiniLM-L6-v2 with int8 compute, from a file a dependency
  ships);
* ``local``: :class:`LocalEmbedder`, feature hashing, offline and deterministic;
* ``openai``: :class:`OpenAIEmbedder`, any OpenAI-compatible endpoint;
* ``minilm``: :class:`MiniLMEmbedder`, from the optional ``minilm`` extra.
"""

from __future__ import annotations

from memstream.projections.embedder_api import (
    Embedder,
    EmbedderConfigError,
    EmbedderError,
    EmbedderUnavailableError,
    check_vectors,
    embed_array,
    embed_query,
    warm_up,
)
from memstream.projections.local_embedder import LocalEmbedder
from memstream.projections.minilm_embedder import MiniLMEmbedder
from memstream.projections.onnx_embedder import OnnxEmbedder
from memstream.projections.onnx_models import OnnxModelError, resolve_model
from memstream.projections.openai_embedder import OpenAIEmbedder
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
    "warm_up",
]


def build_embedder(settings: Settings) -> Embedder:
    """The embedder ``settings.embedder`` names ("onnx", "local", "openai", "minilm")."""
    kind = settings.embedder.strip().lower()
    if kind == "onnx":
        try:
            onnx = OnnxEmbedder(
                resolve_model(settings.onnx_model),
                threads=settings.embedding_threads,
                parallel_runs=settings.embedding_parallel_runs,
            )
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
