"""The BM25 leg of hybrid search from memory: a memory space's ``content`` as an
in-process inverted index, kept with the space's vectors (``search_vectors``) and
carried forward with them, so that a search of a kept space ranks its lexical list in
NumPy instead of asking LanceDB's full-text index, whose 5-6 ms of CPU competed with
the query's embedding for the machine's cores (docs/benchmarks.md).

The terms are those of the ``content`` FTS index (``store_maintenance._FTS_CONFIG``:
tantivy's analyzer as Lance builds it): words split on what is not a letter or a digit,
words of 40 bytes or more dropped, lower-cased, Snowball-English stemmed, stems in
tantivy's English stop list dropped, accents folded. Scores are Lance's BM25 (k1 = 1.2,
b = 0.75, ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))``, a repeated query word counted
again) over the space's own rows only: LanceDB's statistics span every space of the
table, so scores differ from LanceDB's by the space's share of the table (equal in a
table that holds one space), and no space's words weigh in another's ranking.

Why not ``bm25s``: its index is built whole, so carrying it forward over a commit costs
a rebuild of the space (about 11 ms per 400 memories); here a commit's rows are added
and replaced rows dropped with array operations, the statistics derived at query time.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import Stemmer

__all__ = ["terms", "SpaceText", "STOP_STEMS", "best_rows"]

K1, B = 1.2, 0.75
"""Lance's BM25 parameters."""
MAX_TOKEN_BYTES = 40
"""tantivy's ``RemoveLongFilter`` limit in Lance's default analyzer."""

STOP_STEMS = frozenset(
    """i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself
    yourselves he him his himself she she's her hers herself it it's its itself they them their
    theirs themselves what which who whom this that that'll these those am is are was were be
    been being have has had having do does did doing a an the and but if or because as until
    while of at by for with about against between into through during before after above below
    to from up down in out on off over under again further then once here there when where why
    how all any both each few more most other some such no nor not only own same so than too
    very s t can will just don don't should should've now d ll m o re ve y ain aren aren't
    couldn couldn't didn didn't doesn doesn't hadn hadn't hasn hasn't haven haven't isn isn't ma
    mightn mightn't mustn mustn't needn needn't shan shan't shouldn shouldn't wasn wasn't weren
    weren't won won't wouldn wouldn't""".split()
)
"""tantivy's English stop list, which Lance matches against stems (it runs after the
stemmer): a word is dropped when its stem is here (``tests/projections/
test_search_lexical.py`` checks it against LanceDB's index)."""

_WORD = re.compile(r"[^\W_]+")
_local = threading.local()


def _stemmer() -> Any:
    """This thread's Snowball stemmer (a PyStemmer object is not to be shared by threads)."""
    stemmer = getattr(_local, "stemmer", None)
    if stemmer is None:
        stemmer = _local.stemmer = Stemmer.Stemmer("english")
    return stemmer


def _fold(term: str) -> str:
    """``term`` with its accents folded to ASCII (letters without an ASCII base stay)."""
    if term.isascii():
        return term
    return "".join(c for c in unicodedata.normalize("NFKD", term) if not unicodedata.combining(c))


def terms(text: str | None) -> list[str]:
    """The index terms of ``text``, in order (repeats kept)."""
    if not text:
        return []
    words = [w.lower() for w in _WORD.findall(text) if len(w.encode()) < MAX_TOKEN_BYTES]
    return [_fold(s) for s in _stemmer().stemWords(words) if s not in STOP_STEMS]


@dataclass(frozen=True)
class SpaceText:
    """One space's memories (every row, with a vector or not) as an inverted index:
    ids, sessions and source turns by row; each row's term count (``lengths``); the
    postings as three parallel arrays in row order (``rows``, ``term_ids``, ``counts``:
    row ``r`` holds term ``t`` ``c`` times); ``vocab`` maps a term to its id. Never
    changed: a carried index is a new one (``vocab`` may be shared, only added to on a
    copy)."""

    ids: pa.Array
    sessions: pa.Array
    sources: pa.Array
    lengths: np.ndarray
    rows: np.ndarray
    term_ids: np.ndarray
    counts: np.ndarray
    vocab: dict[str, int]

    @classmethod
    def of(cls, table: pa.Table) -> SpaceText:
        """From rows with ``memory_id``, ``session_id``, ``source_message_ids``, ``content``."""
        vocab: dict[str, int] = {}
        lengths, rows, term_ids, counts = _postings(table.column("content").to_pylist(), vocab, 0)
        ids, sessions, sources = (table.column(c).combine_chunks() for c in _COLUMNS)
        return cls(ids, sessions, sources, lengths, rows, term_ids, counts, vocab)

    def __len__(self) -> int:
        return len(self.ids)

    def carried(self, replaced: Collection[str], written: pa.Table) -> SpaceText:
        """This index without the rows whose id is in ``replaced``, with ``written`` (rows
        as :meth:`of` takes them) after the rest: the order a read of the space gives."""
        if replaced:
            gone = pc.is_in(self.ids, value_set=pa.array(sorted(replaced), type=self.ids.type))
            keep = ~gone.to_numpy(zero_copy_only=False)
        else:
            keep = np.ones(len(self), dtype=bool)
        renumber = np.cumsum(keep) - 1
        live = keep[self.rows]
        vocab = dict(self.vocab)
        lengths, rows, term_ids, counts = _postings(written.column("content").to_pylist(), vocab, int(keep.sum()))
        take = pa.array(np.flatnonzero(keep), type=pa.int64())
        return SpaceText(
            pa.concat_arrays([self.ids.take(take), written.column("memory_id").combine_chunks()]),
            pa.concat_arrays([self.sessions.take(take), written.column("session_id").combine_chunks()]),
            pa.concat_arrays([self.sources.take(take), written.column("source_message_ids").combine_chunks()]),
            np.concatenate([self.lengths[keep], lengths]),
            np.concatenate([renumber[self.rows[live]], rows]).astype(np.int32),
            np.concatenate([self.term_ids[live], term_ids]),
            np.concatenate([self.counts[live], counts]),
            vocab,
        )

    def best(self, query: str, limit: int) -> pa.Table:
        """The ``limit`` best BM25 matches of ``query`` (some term in common; best first,
        ties by memory id): ``memory_id``, ``session_id``, ``source_message_ids`` and
        ``_score``, as LanceDB's full-text query's list."""
        order, scores = self._top(query, limit)
        take = pa.array(order, type=pa.int64())
        return pa.table(
            {
                "memory_id": self.ids.take(take),
                "session_id": self.sessions.take(take),
                "source_message_ids": self.sources.take(take),
                "_score": pa.array(scores, type=pa.float32()),
            }
        )

    def scores(self, query: str) -> np.ndarray:
        """Every row's BM25 score for ``query`` (0: no term in common)."""
        weights = Counter(self.vocab[t] for t in terms(query) if t in self.vocab)
        n = len(self)
        if not weights or n == 0:
            return np.zeros(n, dtype=np.float32)
        wanted = np.array(sorted(weights), dtype=np.int32)
        order, sorted_terms = self._by_term
        first = np.searchsorted(sorted_terms, wanted, "left")
        last = np.searchsorted(sorted_terms, wanted, "right")
        df = last - first  # one posting per row and term
        hit = order[np.concatenate([np.arange(a, b) for a, b in zip(first.tolist(), last.tolist())])]
        row, count = self.rows[hit], self.counts[hit]
        idf = np.log1p((n - df + 0.5) / (df + 0.5))
        repeats = np.array([weights[t] for t in wanted.tolist()], dtype=np.float64)
        which = np.repeat(np.arange(len(wanted)), df)  # the posting's term among ``wanted``
        norm = K1 * (1 - B + B * self.lengths[row] / self._mean_length)
        part = (repeats * idf)[which] * count * (K1 + 1) / (count + norm)
        return np.bincount(row, weights=part, minlength=n).astype(np.float32)

    @cached_property
    def _by_term(self) -> tuple[np.ndarray, np.ndarray]:
        """The postings' positions in term order, and their terms in that order (computed
        at the first query of this version: a carried index pays it once)."""
        order = np.argsort(self.term_ids, kind="stable")
        return order, self.term_ids[order]

    @cached_property
    def _mean_length(self) -> float:
        return max(float(self.lengths.mean()), 1e-9) if len(self.lengths) else 1.0

    def _top(self, query: str, limit: int) -> tuple[np.ndarray, np.ndarray]:
        scores = self.scores(query)
        hits = np.flatnonzero(scores > 0)
        order = best_rows(scores, hits, limit, self.ids)
        return order, scores[order]


_COLUMNS = ("memory_id", "session_id", "source_message_ids")


def _postings(
    contents: Sequence[str | None], vocab: dict[str, int], first: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Term counts and postings of ``contents`` numbered from row ``first`` (new terms
    added to ``vocab``)."""
    lengths = np.zeros(len(contents), dtype=np.int32)
    rows: list[int] = []
    term_ids: list[int] = []
    counts: list[int] = []
    for i, content in enumerate(contents):
        found = terms(content)
        lengths[i] = len(found)
        for term, count in Counter(found).items():
            rows.append(first + i)
            term_ids.append(vocab.setdefault(term, len(vocab)))
            counts.append(count)
    return (
        lengths,
        np.asarray(rows, dtype=np.int32),
        np.asarray(term_ids, dtype=np.int32),
        np.asarray(counts, dtype=np.float32),
    )


def best_rows(scores: np.ndarray, rows: np.ndarray, limit: int, ids: pa.Array) -> np.ndarray:
    """The ``limit`` best of ``rows`` by ``scores``, best first, ties by memory id
    (``ids``: every row's), not by position: a space's row order is the order its
    memories were committed, which depends on timing, and it moved recall between
    ingests of the same data. Only the rows kept are sorted by id."""
    if limit < 1:
        return rows[:0]
    if len(rows) > limit:  # keep every row that ties the last one in
        cut = np.partition(scores[rows], len(rows) - limit)[len(rows) - limit]
        rows = rows[scores[rows] >= cut]
    kept_ids = np.asarray(ids.take(pa.array(rows, type=pa.int64())).to_pylist(), dtype=str)
    return rows[np.lexsort((kept_ids, -scores[rows]))][:limit]
