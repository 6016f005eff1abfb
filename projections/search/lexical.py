"""The BM25 leg of hybrid search from memory: a memory space's ``content`` as an
in-process inverted index, kept with the space's vectors (``vectors``) and
carried forward with them, so that a search of a kept space ranks its lexical list in
NumPy instead of asking LanceDB's full-text index, whose 5-6 ms of CPU competed with
the query's embedding for the machine's cores (docs/benchmarks-history.md).

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

Kept, measured (docs/benchmarks.md, "Full-text mirror against LanceDB's FTS"): `bench locomo` search p50 13.0 ms against 15.1 with LanceDB's FTS (+16 %), recall@10 0.785 vs 0.783.
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

from memstream.projections.search.growing import Buffer, Chunks

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
search/test_lexical.py`` checks it against LanceDB's index)."""

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


class _TextRows:
    """What the versions of one space's index share: the rows' ids, sessions, source
    turns and term counts, the postings in row order (``rows``, ``term_ids``,
    ``counts``: row ``r`` holds term ``t`` ``c`` times) and the vocabulary, all only
    appended to; and the postings' order by term, built for a prefix of them (the
    postings after it are scanned)."""

    def __init__(
        self, columns: Sequence[pa.Array | pa.ChunkedArray], postings: Sequence[np.ndarray], vocab: dict[str, int]
    ) -> None:
        """From every row's ``_COLUMNS``, :func:`_postings`' four arrays and the vocabulary."""
        self.lock = threading.Lock()
        self.vocab = vocab
        self.lengths, self.rows, self.term_ids, self.counts = (Buffer(a) for a in postings)
        self.columns = [Chunks(c) for c in columns]
        self.by_term: tuple[int, np.ndarray, np.ndarray] = (0, _NONE, _NONE)
        """For the first ``p`` postings: their positions in term order, and their terms."""

    def extend(self, at: tuple[int, int], written: pa.Table) -> tuple[int, int, list[pa.ChunkedArray]] | None:
        """Append ``written`` after the first ``at`` rows and postings: the new ends and
        columns (``None``: ``at`` is not the end, another version appended after it)."""
        with self.lock:
            if (len(self.lengths), len(self.rows)) != at:
                return None
            lengths, rows, term_ids, counts = _postings(written.column("content").to_pylist(), self.vocab, at[0])
            for buffer, part in zip((self.lengths, self.rows, self.term_ids, self.counts), (lengths, rows, term_ids, counts)):
                buffer.append(part)
            for chunks, name in zip(self.columns, _COLUMNS):
                chunks.append(written.column(name))
            return len(self.lengths), len(self.rows), [c.column() for c in self.columns]

    def hits(self, wanted: np.ndarray, postings: int) -> np.ndarray:
        """The positions among the first ``postings`` postings of those whose term is in
        ``wanted`` (sorted), ordered by term, then position."""
        built, order, sorted_terms = self.by_term
        if postings - built > max(_TAIL_MIN, built // 8):
            built, order, sorted_terms = self._sort(postings)
        first = np.searchsorted(sorted_terms, wanted, "left")
        last = np.searchsorted(sorted_terms, wanted, "right")
        found = order[np.concatenate([np.arange(a, b) for a, b in zip(first.tolist(), last.tolist())])]
        found = found[found < postings]
        if postings > built:
            tail = np.flatnonzero(np.isin(self.term_ids.prefix(postings)[built:], wanted)) + built
            found = np.concatenate([found, tail])
        return found[np.lexsort((found, self.term_ids.prefix(postings)[found]))]

    def _sort(self, postings: int) -> tuple[int, np.ndarray, np.ndarray]:
        """Order the first ``postings`` postings by term (sorted outside the lock; kept
        unless another thread sorted more meanwhile)."""
        term_ids = self.term_ids.prefix(postings)
        order = np.argsort(term_ids, kind="stable").astype(np.int32)
        sorted_ = (postings, order, term_ids[order])
        with self.lock:
            if self.by_term[0] < postings:
                self.by_term = sorted_
        return sorted_

    @property
    def nbytes(self) -> int:
        """The bytes of the postings, their order by term and the columns (not the
        vocabulary's Python objects)."""
        buffers = (self.lengths, self.rows, self.term_ids, self.counts)
        _, order, sorted_terms = self.by_term  # one order: a sort may replace it meanwhile
        postings = sum(b.nbytes for b in buffers) + order.nbytes + sorted_terms.nbytes
        return postings + sum(c.nbytes for c in self.columns)


_NONE = np.zeros(0, dtype=np.int32)
_TAIL_MIN = 4096
"""Postings scanned rather than looked up in the term order before it is built again
(then again when the scanned part exceeds an eighth of the ordered one)."""


@dataclass(frozen=True)
class SpaceText:
    """One space's memories (every row, with a vector or not) at one version, as an
    inverted index: the first ``n_rows`` rows and ``n_postings`` postings of storage
    shared with the space's other versions (:class:`_TextRows`), in the order a read
    of the space gives. Never changed: a carried index is a new view, its rows
    appended after this one's."""

    store: _TextRows
    n_rows: int
    n_postings: int
    ids: pa.ChunkedArray
    sessions: pa.ChunkedArray
    sources: pa.ChunkedArray

    @classmethod
    def of(cls, table: pa.Table) -> SpaceText:
        """From rows with ``memory_id``, ``session_id``, ``source_message_ids``, ``content``."""
        vocab: dict[str, int] = {}
        postings = _postings(table.column("content").to_pylist(), vocab, 0)
        return cls._of(_TextRows([table.column(c) for c in _COLUMNS], postings, vocab))

    @classmethod
    def _of(cls, store: _TextRows) -> SpaceText:
        return cls(store, len(store.lengths), len(store.rows), *(c.column() for c in store.columns))

    def __len__(self) -> int:
        return self.n_rows

    @cached_property
    def columns(self) -> tuple[pa.Array, pa.Array, pa.Array]:
        """``ids``, ``sessions`` and ``sources`` in one chunk each (a take from many
        chunks joins them first: once per version, not at every take)."""
        return self.ids.combine_chunks(), self.sessions.combine_chunks(), self.sources.combine_chunks()

    def replaced(self, ids: Collection[str]) -> np.ndarray | None:
        """Which rows have an id in ``ids`` (``None``: none)."""
        if not ids:
            return None
        gone = pc.is_in(self.columns[0], value_set=pa.array(sorted(ids), type=self.ids.type))
        gone = gone.to_numpy(zero_copy_only=False)
        return gone if gone.any() else None

    def carried(self, replaced: Collection[str], written: pa.Table) -> SpaceText:
        """This index without the rows whose id is in ``replaced``, with ``written`` (rows
        as :meth:`of` takes them) after the rest: the order a read of the space gives.
        Appended to the storage this version shares when nothing is replaced and it
        ends where the storage does (no other version appended first); else copied."""
        return self.carried_without(self.replaced(replaced), written)

    def carried_without(self, gone: np.ndarray | None, written: pa.Table) -> SpaceText:
        """:meth:`carried`, with the replaced rows already found (:meth:`replaced`)."""
        if gone is None:
            grown = self.store.extend((self.n_rows, self.n_postings), written)
            if grown is not None:
                return SpaceText(self.store, *grown[:2], *grown[2])
        return self.copied(gone).carried_without(None, written)

    def copied(self, gone: np.ndarray | None) -> SpaceText:
        """This index without the rows in ``gone`` (``None``: none), in storage of its own."""
        keep = ~gone if gone is not None else np.ones(self.n_rows, dtype=bool)
        rows = self.store.rows.prefix(self.n_postings)
        kept = keep[rows]
        renumber = (np.cumsum(keep) - 1).astype(np.int32)
        postings = (
            self.store.lengths.prefix(self.n_rows)[keep],
            renumber[rows[kept]],
            self.store.term_ids.prefix(self.n_postings)[kept],
            self.store.counts.prefix(self.n_postings)[kept],
        )
        take = pa.array(np.flatnonzero(keep), type=pa.int64())
        columns = [c.take(take) for c in self.columns]
        return SpaceText._of(_TextRows(columns, postings, dict(self.store.vocab)))

    def best(self, query: str, limit: int) -> pa.Table:
        """The ``limit`` best BM25 matches of ``query`` (some term in common; best first,
        ties by memory id): ``memory_id``, ``session_id``, ``source_message_ids`` and
        ``_score``, as LanceDB's full-text query's list."""
        order, scores = self._top(query, limit)
        return self.listed(order, "_score", scores)

    def listed(self, order: np.ndarray, score: str, scores: np.ndarray) -> pa.Table:
        """The rows at ``order`` as a candidate list: ``memory_id``, ``session_id``,
        ``source_message_ids`` and ``scores`` as ``score``."""
        take = pa.array(order, type=pa.int64())
        ids, sessions, sources = self.columns
        return pa.table(
            {
                "memory_id": ids.take(take),
                "session_id": sessions.take(take),
                "source_message_ids": sources.take(take),
                score: pa.array(scores, type=pa.float32()),
            }
        )

    def scores(self, query: str) -> np.ndarray:
        """Every row's BM25 score for ``query`` (0: no term in common)."""
        vocab = self.store.vocab
        weights = Counter(vocab[t] for t in terms(query) if t in vocab)
        n = len(self)
        if not weights or n == 0:
            return np.zeros(self.n_rows, dtype=np.float32)
        wanted = np.array(sorted(weights), dtype=np.int32)
        hit = self.store.hits(wanted, self.n_postings)
        row = self.store.rows.prefix(self.n_postings)[hit]
        which = np.searchsorted(wanted, self.store.term_ids.prefix(self.n_postings)[hit])  # among ``wanted``
        df = np.bincount(which, minlength=len(wanted))  # one posting per row and term
        count = self.store.counts.prefix(self.n_postings)[hit]
        idf = np.log1p((n - df + 0.5) / (df + 0.5))
        repeats = np.array([weights[t] for t in wanted.tolist()], dtype=np.float64)
        norm = K1 * (1 - B + B * self.store.lengths.prefix(self.n_rows)[row] / self._mean_length)
        part = (repeats * idf)[which] * count * (K1 + 1) / (count + norm)
        return np.bincount(row, weights=part, minlength=self.n_rows).astype(np.float32)

    @cached_property
    def _mean_length(self) -> float:
        lengths = self.store.lengths.prefix(self.n_rows)
        return max(float(lengths.mean()), 1e-9) if len(lengths) else 1.0

    def _top(self, query: str, limit: int) -> tuple[np.ndarray, np.ndarray]:
        scores = self.scores(query)
        hits = np.flatnonzero(scores > 0)
        order = best_rows(scores, hits, limit, self.columns[0])
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
