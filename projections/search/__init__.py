"""Hybrid search inside one memory space: :func:`search` ranks vector and BM25
candidates by recency, priority and supersession (``hybrid``); ``queries`` builds the
scoped LanceDB reads, ``reads`` and ``conversation`` fetch candidates and their turns,
``ranking`` and ``results`` shape the answer, ``baselines`` are the plain
vector/text/RRF searches, and ``cache``, ``vectors``, ``lexical``, ``owners``,
``growing`` and ``table_changes`` keep a busy space's lists between table versions.
``http_reranker`` reorders the top candidates with a cross-encoder behind HTTP."""

from __future__ import annotations

from memstream.projections.search.baselines import text_search
from memstream.projections.search.cache import READ_NOT_BEFORE, SearchCache
from memstream.projections.search.filters import SearchFilters, build_where
from memstream.projections.search.http_reranker import HttpReranker, build_reranker
from memstream.projections.search.hybrid import search
from memstream.projections.search.owners import MemoryOwners
from memstream.projections.search.results import RESULT_COLUMNS, SearchResult

__all__ = [
    "HttpReranker",
    "MemoryOwners",
    "READ_NOT_BEFORE",
    "RESULT_COLUMNS",
    "SearchCache",
    "SearchFilters",
    "SearchResult",
    "build_reranker",
    "build_where",
    "search",
    "text_search",
]
