"""A reranker behind an HTTP ``/rerank`` endpoint: a cross-encoder scores the query
against each of the top candidates, and they are put in that order.

The request and answer are the shape Jina and Cohere defined and the local servers
copied (llama.cpp's ``llama-server --reranking``, vLLM, Infinity, text-embeddings-
inference): ``POST <base>/rerank`` with ``{"model", "query", "documents", "top_n"}``,
answered with ``{"results": [{"index", "relevance_score"}, ...]}`` (a bare list of
``{"index", "score"}`` is read too). No model is bundled: no registry package ships a
cross-encoder with a clear licence in a form onnxruntime runs (docs/benchmarks-history.md),
and nothing may download one at run time.

Only the first ``top_n`` candidates are sent (the rest keep memstream's order after
them). A failed call leaves memstream's order as it is and says so in the log: a
search never fails because its optional reranker did.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import httpx

from memstream.projections.search.results import SearchResult
from memstream.settings import EmbeddingSettings

__all__ = ["RERANK_CANDIDATES", "RERANK_TIMEOUT_S", "HttpReranker", "RerankError", "build_reranker", "rerank_endpoint"]

RERANK_CANDIDATES = 20
"""How many of memstream's top results the reranker orders (the rest follow): a cross-
encoder's cost grows with each one, and a search rarely asks for more than ten."""
RERANK_TIMEOUT_S = 10.0
"""Timeout of one rerank call; past it memstream's own order is kept (logged)."""

log = logging.getLogger(__name__)


class RerankError(Exception):
    """The endpoint did not answer with one score per document."""


def rerank_endpoint(url: str) -> str:
    """``url`` when it names the route already, else ``<url>/rerank`` (a base URL such
    as ``http://127.0.0.1:8080/v1``)."""
    url = url.rstrip("/")
    return url if url.rsplit("/", 1)[-1] in ("rerank", "reranking") else f"{url}/rerank"


def _scores(answer: Any, count: int) -> list[float]:
    """One score per document from an answer, by the documents' indexes."""
    items = answer.get("results", answer.get("data")) if isinstance(answer, dict) else answer
    if not isinstance(items, list):
        raise RerankError("the answer holds no list of results")
    scores: list[float | None] = [None] * count
    for item in items:
        if not isinstance(item, dict):
            raise RerankError("a result is not an object")
        index, score = item.get("index"), item.get("relevance_score", item.get("score"))
        if not isinstance(index, int) or not 0 <= index < count or not isinstance(score, (int, float)):
            raise RerankError(f"a result has no valid index and score: {str(item)[:200]}")
        scores[index] = float(score)
    if any(s is None for s in scores):
        raise RerankError(f"{sum(s is None for s in scores)} of {count} documents got no score")
    return [s for s in scores if s is not None]


class HttpReranker:
    """A :data:`~memstream.projections.search.results.Reranker`: orders the first
    ``top_n`` results by the endpoint's scores (ties keep memstream's order) and puts
    each score in the result's ``parts.rerank``."""

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        top_n: int = RERANK_CANDIDATES,
        timeout_s: float = RERANK_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.endpoint = rerank_endpoint(url)
        self.model = model
        self.top_n = top_n
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers, transport=transport)

    def close(self) -> None:
        self._client.close()

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        """The endpoint's relevance score of each document for ``query``."""
        body: dict[str, Any] = {"query": query, "documents": list(documents), "top_n": len(documents)}
        if self.model:
            body["model"] = self.model
        try:
            response = self._client.post(self.endpoint, json=body)
        except httpx.HTTPError as exc:
            raise RerankError(f"{type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise RerankError(f"HTTP {response.status_code}: {response.text[:200]}")
        try:
            answer = response.json()
        except ValueError:
            raise RerankError("the answer is not JSON") from None
        return _scores(answer, len(documents))

    def __call__(self, query: str, results: list[SearchResult]) -> list[SearchResult]:
        head, tail = results[: self.top_n], results[self.top_n :]
        if len(head) < 2:
            return results
        try:
            scores = self.scores(query, [r.content for r in head])
        except RerankError as exc:
            log.warning("rerank at %s failed, memstream's order kept: %s", self.endpoint, exc)
            return results
        order = sorted(range(len(head)), key=lambda i: (-scores[i], i))
        return [replace(head[i], parts=replace(head[i].parts, rerank=scores[i])) for i in order] + tail


def build_reranker(config: EmbeddingSettings) -> HttpReranker | None:
    """The reranker ``config`` names (``MEMSTREAM_EMBEDDINGS_RERANK_URL``), or ``None``."""
    if not config.rerank_url:
        return None
    key = config.rerank_api_key.get_secret_value() if config.rerank_api_key is not None else None
    return HttpReranker(config.rerank_url, model=config.rerank_model, api_key=key)
