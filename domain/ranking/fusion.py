"""Fusion, recency, supersession and entity boosts: a candidate's score from its ranks.

How a candidate's final score is built (each factor is reported as a ``ScoreParts``
field by the search module, for ``--explain``):

1. **Fusion** (``fused``, in (0, 1]): weighted reciprocal rank fusion over the ranked
   lists (vector similarity, BM25 full text)::

       rrf(d) = sum over lists L of  w_L / (RRF_K + rank_L(d))     (rank starts at 1)

   divided by the best score possible (rank 1 in every list), so a document ranked
   first by both retrievers scores 1.0. RRF uses ranks only, so the incomparable
   scales of cosine distance and BM25 never need calibrating. ``RRF_K = 60`` is the
   constant of Cormack, Clarke and Buettcher (SIGIR 2009), which damps the influence
   of any single list's top ranks.
2. **Recency** (``recency``, in (0, 1]): ``0.5 ** (age / half_life)`` with a half-life
   of 30 days; it multiplies the score through ``(1 - w + w * recency)`` with
   ``w = RECENCY_WEIGHT = 0.1``, so age can cost at most 10 %: a tie-breaker between
   similarly relevant memories, never a reason to prefer an irrelevant new one.
3. **Supersession** (``supersession``): 1.0 for a current memory,
   ``SUPERSEDED_PENALTY = 0.5`` for one whose ``superseded_by`` is set (a newer memory
   supersedes or contradicts it), ``DUPLICATE_PENALTY = 0.5`` for a duplicate of a
   canonical memory. Then :func:`order_after_successors` caps each such memory just
   below its successor when both are in the results, so a superseded memory always
   ranks below the memory that replaced it, whatever their relevance.
4. **Entity boost** (``entity``, in [0, ``ENTITY_WEIGHT`` = 0.3]): when the query names
   an entity of the memory, the score is multiplied by ``1 + ENTITY_WEIGHT * idf``
   where ``idf = ln(1 + N / df) / ln(1 + N)`` over the memory space (``N`` memories,
   ``df`` of them naming the entity): an entity named in every memory boosts almost
   nothing, a rare one boosts fully.

``final = fused * (1 - w + w * recency) * supersession * (1 + entity)``, then capped
by :func:`order_after_successors`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

from memstream.domain.content import normalize_content
from memstream.domain.ranking.weights import (
    ENTITY_WEIGHT,
    HALF_LIFE_SECONDS,
    RECENCY_WEIGHT,
    RRF_K,
    SUCCESSOR_MARGIN,
    RankingWeights,
)

__all__ = [
    "weighted_rrf",
    "normalised_rrf",
    "recency_score",
    "recency_factor",
    "supersession_factor",
    "entity_idf",
    "entity_boost",
    "tokens",
    "query_mentions",
    "final_score",
    "order_after_successors",
]

_WORD = re.compile(r"\w+", re.UNICODE)


def weighted_rrf(
    rankings: Mapping[str, Sequence[str]],
    weights: Mapping[str, float],
    k: int = RRF_K,
) -> dict[str, float]:
    """Weighted reciprocal rank fusion: ``sum_L w_L / (k + rank_L(d))``, ranks from 1.

    ``rankings`` maps a list name ("vector", "text") to ids best first; a list missing
    from ``weights`` has weight 1. An id repeated inside one list counts at its best
    rank only."""
    scores: dict[str, float] = {}
    for name, ids in rankings.items():
        w = float(weights.get(name, 1.0))
        seen: set[str] = set()
        rank = 0
        for doc in ids:
            if doc in seen:
                continue
            seen.add(doc)
            rank += 1
            scores[doc] = scores.get(doc, 0.0) + w / (k + rank)
    return scores


def normalised_rrf(
    rankings: Mapping[str, Sequence[str]],
    weights: Mapping[str, float],
    k: int = RRF_K,
) -> dict[str, float]:
    """:func:`weighted_rrf` divided by its best possible value (rank 1 in every list
    that has any results), so scores lie in (0, 1] and 1.0 means "first everywhere"."""
    raw = weighted_rrf(rankings, weights, k)
    best = sum(float(weights.get(name, 1.0)) for name, ids in rankings.items() if ids) / (k + 1)
    if best <= 0:
        return {doc: 0.0 for doc in raw}
    return {doc: s / best for doc, s in raw.items()}


def recency_score(age_seconds: float, half_life_seconds: float = HALF_LIFE_SECONDS) -> float:
    """``0.5 ** (age / half_life)``; a future time (negative age) counts as age 0."""
    if half_life_seconds <= 0:
        raise ValueError("half_life_seconds must be positive")
    age = max(0.0, float(age_seconds))
    return float(0.5 ** (age / half_life_seconds))


def recency_factor(recency: float, weight: float = RECENCY_WEIGHT) -> float:
    """The multiplier a recency score contributes: ``1 - weight + weight * recency``."""
    return 1.0 - weight + weight * recency


def supersession_factor(
    superseded: bool, duplicate: bool, weights: RankingWeights = RankingWeights()
) -> float:
    """1.0 for a current memory; the (smaller) penalty applies when both are set."""
    factor = 1.0
    if superseded:
        factor = min(factor, weights.superseded_penalty)
    if duplicate:
        factor = min(factor, weights.duplicate_penalty)
    return factor


def entity_idf(df: int, n: int) -> float:
    """``ln(1 + n/df) / ln(1 + n)`` in (0, 1]: 1 for an entity named by one memory of
    the space, close to 0 for one named everywhere. ``df`` is clamped to ``[1, n]``."""
    n = max(1, int(n))
    df = min(max(1, int(df)), n)
    return math.log1p(n / df) / math.log1p(n)


def entity_boost(idfs: Iterable[float], weight: float = ENTITY_WEIGHT) -> float:
    """The boost for a memory whose entities named in the query have these idfs: the
    strongest single one (several weak mentions do not add up to a strong one)."""
    best = max((float(x) for x in idfs), default=0.0)
    return weight * best


def tokens(text: str) -> list[str]:
    """Word tokens of the normal form (NFKC, case folded): the unit entity mentions
    are matched on, so "Alice's" mentions "alice" but "Alicent" does not."""
    return _WORD.findall(normalize_content(text))


@lru_cache(maxsize=65_536)
def _name_tokens(name: str) -> tuple[str, ...]:
    # a search matches its query against the same few speakers and entity names again and again
    return tuple(tokens(name))


def query_mentions(query: str, names: Iterable[str]) -> set[str]:
    """The names (as given) whose token sequence appears contiguously in the query."""
    q = tuple(tokens(query))
    found: set[str] = set()
    if not q:
        return found
    words = frozenset(q)  # most names share no word with the query: one set lookup each
    for name in names:
        t = _name_tokens(name)
        if not t or t[0] not in words or len(t) > len(q):
            continue
        n = len(t)
        if n == 1 or any(q[i : i + n] == t for i in range(len(q) - n + 1)):
            found.add(name)
    return found


def final_score(
    fused: float,
    recency: float,
    supersession: float,
    entity: float,
    weights: RankingWeights = RankingWeights(),
) -> float:
    """``fused * recency_factor * supersession * (1 + entity)`` (before successor caps)."""
    return fused * recency_factor(recency, weights.recency_weight) * supersession * (1.0 + entity)


def order_after_successors(
    scores: Mapping[str, float],
    successor: Mapping[str, str | None],
    margin: float = SUCCESSOR_MARGIN,
) -> dict[str, float]:
    """Cap every memory whose successor is also scored just below that successor.

    ``successor[x]`` is the memory that replaced ``x`` (its ``superseded_by``, or its
    canonical memory for a duplicate). Chains are followed (A -> B -> C gives
    C > B > A); a cycle (A supersedes B and B supersedes A) is cut where it is first
    re-entered, so the function always terminates. Scores of memories without a scored
    successor stay as they are."""
    if not 0.0 < margin < 1.0:
        raise ValueError("margin must be in (0, 1)")
    result: dict[str, float] = {}
    visiting: set[str] = set()

    def capped(doc: str) -> float:
        if doc in result:
            return result[doc]
        own = float(scores[doc])
        nxt = successor.get(doc)
        if nxt is None or nxt == doc or nxt not in scores or doc in visiting:
            result[doc] = own
            return own
        visiting.add(doc)
        bound = capped(nxt) * (1.0 - margin)
        visiting.discard(doc)
        value = min(own, bound)
        # a cycle may have fixed this entry while we recursed: keep the smaller
        result[doc] = min(value, result.get(doc, value))
        return result[doc]

    for doc in scores:
        capped(doc)
    return result
