"""The offline hashing embedder (``MEMSTREAM_EMBEDDINGS_PROVIDER=local``): feature hashing of
words, word pairs and character trigrams. No download, deterministic across processes
and machines; lexical similarity only (it knows no synonyms), so it suits a store that
also runs BM25 and is weak alone."""

from __future__ import annotations

import hashlib
import math
import re
import threading
from collections import Counter
from collections.abc import Sequence
from itertools import chain
from typing import cast

import numpy as np

from memstream.domain.content import normalize_content
from memstream.projections.embedders.api import EmbedderConfigError

__all__ = ["LocalEmbedder"]

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
