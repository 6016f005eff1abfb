"""Text to vectors: the :class:`Embedder` interface and its checked calls
(``api``), the implementations (``onnx_embedder``, the default, with its pinned model
files in ``onnx_models`` and their build in ``onnx_build``; ``local_embedder``,
``openai_embedder``, ``minilm_embedder``) and :func:`build_embedder` (``factory``),
which picks one from the settings."""

from __future__ import annotations

from memstream.projections.embedders.api import Embedder, EmbedderError, embed_array, embed_query, warm_up
from memstream.projections.embedders.factory import build_embedder
from memstream.projections.embedders.local_embedder import LocalEmbedder

__all__ = [
    "Embedder",
    "EmbedderError",
    "LocalEmbedder",
    "build_embedder",
    "embed_array",
    "embed_query",
    "warm_up",
]
