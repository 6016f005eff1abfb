"""The offline hashing embedder (``memstream.projections.embedders.local_embedder``)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.domain.content import normalize_content
from memstream.projections.embedders import local_embedder
from memstream.projections.embedders.factory import Embedder, EmbedderConfigError, LocalEmbedder
from memstream.projections.embedders.local_embedder import _slot


def _cos(a: list[float], b: list[float]) -> float:
    return float(np.dot(a, b))


def test_local_embedder_is_deterministic_normalised_and_lexical() -> None:
    emb = LocalEmbedder(384)
    assert isinstance(emb, Embedder)
    assert emb.model_id == "memstream-hash-v1-384" and emb.dim == 384
    texts = [
        "I love hiking in the mountains",
        "She loves hiking mountain trails",
        "Quarterly revenue grew five percent",
        "",
    ]
    a, b, c, empty = emb.embed(texts)
    assert len(a) == 384 and all(isinstance(x, float) for x in a)
    assert np.linalg.norm(a) == pytest.approx(1.0, abs=1e-5)
    # never a zero vector (it has no cosine similarity): punctuation-only and empty
    # texts still get a deterministic unit vector
    marks = emb.embed(["???"])[0]
    for v in (empty, marks):
        assert np.linalg.norm(v) == pytest.approx(1.0, abs=1e-5)
    assert emb.embed(["?!?"])[0] != marks
    assert _cos(a, b) > 0.3 > abs(_cos(a, c))
    # the same text gives the same vector in another process (no salted hash)
    code = "from memstream.projections.embedders.factory import LocalEmbedder; print(LocalEmbedder(384).embed(['I love hiking in the mountains'])[0][:8])"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert other.strip() == str(a[:8])
    # case and whitespace do not matter (the content normal form)
    assert emb.embed(["I  LOVE hiking in the Mountains"])[0] == a
    assert LocalEmbedder(64).embed(["x"])[0] != emb.embed(["x"])[0][:64]
    with pytest.raises(EmbedderConfigError):
        LocalEmbedder(4)


_STOP = frozenset(
    """a an and are as at be been but by can could did do does for from had has have he
    her hers him his i if in into is it its me my no not of on or our ours she so than
    that the their them then there these they this those to us was we were what when
    where which who whom why will with would you your yours""".split()
)


_WEIGHTS = {"w": 1.0, "b": 0.6, "c": 0.3}


def _reference_vector(text: str, dim: int) -> list[float]:
    """The local embedder by its definition (the class docstring), one feature at a
    time: vectors must not change while the model id stays ``v1``, however the
    implementation is made faster."""

    def stem(word: str) -> str:
        if len(word) <= 4 or word.isdigit():
            return word
        for suffix in ("ing", "ies", "ed", "es", "ly", "s"):
            if word.endswith(suffix) and len(word) - len(suffix) >= 3:
                return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
        return word

    normal = normalize_content(text)
    words = re.findall(r"\w+", normal)
    content = [w for w in words if w not in _STOP] or words
    stems = [stem(w) for w in content]
    counts: Counter[str] = Counter()
    counts.update("w:" + s for s in stems)
    counts.update(f"b:{a} {b}" for a, b in zip(stems, stems[1:]))
    for w in content or ([normal] if normal else []):
        padded = f"<{w}>"
        counts.update("c:" + padded[i : i + 3] for i in range(len(padded) - 2))
    if not counts:
        counts["c:<>"] = 1
    vec = np.zeros(dim, dtype=np.float64)
    for feature, tf in counts.items():
        idx, sign = _slot(feature, dim)
        vec[idx] += sign * _WEIGHTS[feature[0]] * (1.0 + math.log(tf))
    norm = float(np.linalg.norm(vec))
    if norm == 0.0:
        idx, sign = _slot("c:<>", dim)
        vec[idx], norm = sign, 1.0
    return [float(x) for x in (vec / norm).astype(np.float32)]


_TEXTS = [
    "I love hiking in the mountains", "hike hiking hiked hikes hikes", "the the a an", "", "???",
    "Caroline: I went to the LGBTQ support group yesterday and it was so powerful.",
    "Ünïcödé ﬁne ligatures and ｆｕｌｌｗｉｄｔｈ", "42 42 42 answers", "x", "re-entry re entry",
]


@settings(max_examples=200)
@given(st.lists(st.sampled_from(_TEXTS) | st.text(max_size=40), min_size=1, max_size=4))
def test_local_embedder_vectors_are_its_definition(texts: list[str]) -> None:
    for dim in (384, 16):
        emb = LocalEmbedder(dim)
        assert emb.embed(texts) == [_reference_vector(t, dim) for t in texts]
        # twice: the second pass comes from the embedder's feature caches
        assert emb.embed(texts) == [_reference_vector(t, dim) for t in texts]


def test_local_embedder_starts_a_full_feature_table_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The feature table is bounded: when full it is emptied (between batches) and the
    vectors stay those of the definition."""
    batches = [_TEXTS[:4], _TEXTS[4:], _TEXTS, ["hike hiking", "the mountains", "hiking in the mountains"]]
    unbounded = LocalEmbedder(64)
    for batch in batches:
        unbounded.embed(batch)
    monkeypatch.setattr(local_embedder, "_FEATURE_TABLE_SIZE", 40)
    emb = LocalEmbedder(64)
    for batch in batches * 2:
        assert emb.embed(batch) == [_reference_vector(t, 64) for t in batch]
    assert len(emb._names) < len(unbounded._names)  # emptied on the way


def test_local_embedder_sums_long_lists_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long list is embedded batch by batch, with the same vectors."""
    monkeypatch.setattr(local_embedder, "_BATCH_TEXTS", 3)
    texts = [*_TEXTS, "one more text", "and the last"]
    matrix = LocalEmbedder(32).embed_array(texts)
    assert matrix.shape == (len(texts), 32)
    assert matrix.tolist() == [_reference_vector(t, 32) for t in texts]


def test_local_embedder_is_shared_safely_between_threads() -> None:
    """One embedder serves concurrent requests (the benchmark's embedding server)."""
    from concurrent.futures import ThreadPoolExecutor

    emb = LocalEmbedder(128)
    texts = [f"{t} {i} word{i % 7} other{i % 13}" for i in range(60) for t in _TEXTS[:3]]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda chunk: emb.embed(chunk), [texts[i : i + 5] for i in range(0, len(texts), 5)]))
    assert [v for chunk in got for v in chunk] == [_reference_vector(t, 128) for t in texts]
