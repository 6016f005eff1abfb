"""Embedders: one small interface (``api``) and the implementations
``embeddings.provider`` chooses from (:func:`build_embedder`).

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

from memstream.projections.embedders.api import (
    Embedder,
    EmbedderConfigError,
    EmbedderError,
    EmbedderUnavailableError,
    check_vectors,
    embed_array,
    embed_query,
    warm_up,
)
from memstream.projections.embedders.local_embedder import LocalEmbedder
from memstream.projections.embedders.minilm_embedder import MiniLMEmbedder
from memstream.projections.embedders.onnx_embedder import OnnxEmbedder
from memstream.projections.embedders.onnx_models import BUILTIN_MODEL, OnnxModelError, resolve_model
from memstream.projections.embedders.openai_embedder import OpenAIEmbedder
from memstream.settings import EmbeddingSettings

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


OPENAI_DEFAULT_MODEL = "text-embedding-3-small"
"""The ``openai`` provider's model when ``embeddings.model`` is unset."""


def build_embedder(config: EmbeddingSettings) -> Embedder:
    """The embedder ``config.provider`` names ("onnx", "local", "openai", "minilm")."""
    kind = config.provider.strip().lower()
    if kind == "onnx":
        try:
            onnx = OnnxEmbedder(resolve_model(config.model or BUILTIN_MODEL))
        except OnnxModelError as exc:
            raise EmbedderConfigError(str(exc)) from None
        if onnx.dim != config.dim:
            raise EmbedderConfigError(
                f"{onnx.model_id} makes {onnx.dim}-dimension vectors; MEMSTREAM_EMBEDDINGS_DIM is {config.dim}"
            )
        return onnx
    if kind == "local":
        return LocalEmbedder(config.dim)
    if kind == "openai":
        key = config.api_key.get_secret_value() if config.api_key else None
        return OpenAIEmbedder(model=config.model or OPENAI_DEFAULT_MODEL, dim=config.dim, base_url=config.base_url, api_key=key)
    if kind == "minilm":
        if config.dim != MiniLMEmbedder.DIM:
            raise EmbedderConfigError(
                f"all-MiniLM-L6-v2 makes {MiniLMEmbedder.DIM}-dimension vectors; MEMSTREAM_EMBEDDINGS_DIM is {config.dim}"
            )
        return MiniLMEmbedder()
    raise EmbedderConfigError(
        f"unknown embedder {config.provider!r} (choose onnx, local, openai or minilm)"
    )
