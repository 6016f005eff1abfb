"""Ranking math for hybrid search: fusion, recency, supersession and entity boosts.

Pure functions only (no I/O, no clock): the search module in ``memstream.projections``
gathers candidates from LanceDB and hands their ranks, ages and links to these
functions, so every constant below is unit-tested in isolation and documented once.

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

Conversation-aware ranking (:func:`memstream.projections.search.search`, measured on
LoCoMo by ``memstream bench locomo``; every rule is general, none knows the data):

5. **Query processing** (:func:`lexical_query`): the BM25 leg searches the query's
   content words only: English function words and question frames ("what", "did",
   "would", "likely"...) are dropped (:data:`QUERY_STOP_WORDS`; they match every
   question turn of a conversation and say nothing about the answer), and so are the
   names of the conversation's speakers that the query names, which move into the
   speaker prior (7.) instead: in a user's own memory space a participant's name is in
   half the memories and discriminates nothing lexically. The vector leg embeds the
   query as written (embedding models read whole questions).
6. **Score fusion** (``fusion="score"``, the default for :func:`search`;
   :func:`score_fusion`): ``(wt * bm25 / max_bm25 + wv * sim) / (wt + wv)`` with
   ``wt = TEXT_WEIGHT``, ``wv = FUSION_VECTOR_WEIGHT = 0.7`` and ``sim`` the cosine
   min-max scaled over the vector list (``VECTOR_SCALING``). Unlike RRF it keeps
   *how much* better the first BM25 hit is than the tenth, which is what separates
   an answer from a turn that shares one word with the question. ``fusion="rrf"``
   keeps weighted RRF (1.).
7. **Neighbouring turns** (:func:`propagate_context`): an answer often shares no word
   with the question while the turn before it (the question that prompted it) does. A
   memory therefore receives ``CONTEXT_FORWARD = 0.8`` of the fused score of the
   memory drawn from the turn just before its source turn in the same session when
   that turn is a question (``CONTEXT_FORWARD_STATEMENT = 0.2`` otherwise), and
   ``CONTEXT_BACKWARD = 0.45`` of the turn just after it.
8. **Priors** (:func:`prior_factor`): ``(1 + SPEAKER_WEIGHT)`` = 2.2 when the query
   names the speaker of the memory's source turn (speaker-aware); ``(1 +
   TEMPORAL_WEIGHT)`` = 2.0 when the query asks for a time (:func:`asks_for_time`:
   "when", "how long ago", "what year"...) and the memory states one
   (:func:`mentions_time`: a date, a weekday, "yesterday", "last week"...).

With 5-8: ``final = (fused + context) * prior * (1 - w + w * recency) * supersession
* (1 + entity)``, then capped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from memstream.domain.content import normalize_content

__all__ = [
    "RRF_K",
    "VECTOR_WEIGHT",
    "TEXT_WEIGHT",
    "RECENCY_WEIGHT",
    "HALF_LIFE_SECONDS",
    "SUPERSEDED_PENALTY",
    "DUPLICATE_PENALTY",
    "ENTITY_WEIGHT",
    "SUCCESSOR_MARGIN",
    "RankingWeights",
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
    "FUSION_VECTOR_WEIGHT",
    "VECTOR_SCALING",
    "CONTEXT_FORWARD",
    "CONTEXT_FORWARD_STATEMENT",
    "CONTEXT_BACKWARD",
    "SPEAKER_WEIGHT",
    "TEMPORAL_WEIGHT",
    "QUERY_STOP_WORDS",
    "lexical_query",
    "score_fusion",
    "is_question",
    "asks_for_time",
    "mentions_time",
    "propagate_context",
    "prior_factor",
]

RRF_K = 60
VECTOR_WEIGHT = 1.0
TEXT_WEIGHT = 1.0
RECENCY_WEIGHT = 0.1
HALF_LIFE_SECONDS = 30 * 86_400.0
SUPERSEDED_PENALTY = 0.5
DUPLICATE_PENALTY = 0.5
ENTITY_WEIGHT = 0.3
SUCCESSOR_MARGIN = 1e-3
"""A capped memory scores ``(1 - SUCCESSOR_MARGIN)`` times its successor's score."""
FUSION_VECTOR_WEIGHT = 0.7
"""Weight of min-max scaled cosine similarity against max-normalised BM25 (weight
``TEXT_WEIGHT``) in score fusion: full text leads, similarity finds what is said in
other words. Fitted with the default neural embedder (docs/benchmarks.md)."""
VECTOR_SCALING = "minmax"
"""A sentence model's cosines of a relevant and an unrelated memory differ by a few
tenths: scaled over the candidates, the vector leg spans [0, 1] as BM25 does."""
CONTEXT_FORWARD = 0.8
CONTEXT_FORWARD_STATEMENT = 0.2
CONTEXT_BACKWARD = 0.45
SPEAKER_WEIGHT = 1.2
TEMPORAL_WEIGHT = 1.0

_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True)
class RankingWeights:
    """Every tunable of the ranking in one value, defaults as documented above.

    Benchmarks (e.g. LoCoMo) tune these without touching the search code."""

    rrf_k: int = RRF_K
    vector_weight: float = VECTOR_WEIGHT
    text_weight: float = TEXT_WEIGHT
    recency_weight: float = RECENCY_WEIGHT
    half_life_s: float = HALF_LIFE_SECONDS
    superseded_penalty: float = SUPERSEDED_PENALTY
    duplicate_penalty: float = DUPLICATE_PENALTY
    entity_weight: float = ENTITY_WEIGHT
    fusion: str = "score"
    """"score" (:func:`score_fusion`) or "rrf" (:func:`normalised_rrf`)."""
    fusion_vector_weight: float = FUSION_VECTOR_WEIGHT
    vector_scaling: str = VECTOR_SCALING
    """How score fusion reads cosine similarity: "minmax" over the candidates or "raw"."""
    context_forward: float = CONTEXT_FORWARD
    context_forward_statement: float = CONTEXT_FORWARD_STATEMENT
    context_backward: float = CONTEXT_BACKWARD
    speaker_weight: float = SPEAKER_WEIGHT
    temporal_weight: float = TEMPORAL_WEIGHT
    query_processing: bool = True
    """Search the BM25 leg with :func:`lexical_query` (False: the query as written)."""

    def __post_init__(self) -> None:
        if self.rrf_k < 0:
            raise ValueError("rrf_k must be >= 0")
        if self.vector_weight < 0 or self.text_weight < 0:
            raise ValueError("list weights must be >= 0")
        if not 0.0 <= self.recency_weight <= 1.0:
            raise ValueError("recency_weight must be in [0, 1]")
        if self.half_life_s <= 0:
            raise ValueError("half_life_s must be positive")
        for name in ("superseded_penalty", "duplicate_penalty"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1]")
        if self.entity_weight < 0:
            raise ValueError("entity_weight must be >= 0")
        if self.fusion not in ("score", "rrf"):
            raise ValueError('fusion must be "score" or "rrf"')
        if self.vector_scaling not in ("raw", "minmax"):
            raise ValueError('vector_scaling must be "raw" or "minmax"')
        for name in (
            "fusion_vector_weight",
            "context_forward",
            "context_forward_statement",
            "context_backward",
            "speaker_weight",
            "temporal_weight",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")


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


def query_mentions(query: str, names: Iterable[str]) -> set[str]:
    """The names (as given) whose token sequence appears contiguously in the query."""
    q = tokens(query)
    found: set[str] = set()
    if not q:
        return found
    for name in names:
        t = tokens(name)
        if not t or len(t) > len(q):
            continue
        n = len(t)
        if any(q[i : i + n] == t for i in range(len(q) - n + 1)):
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


# ------------------------------------------------------------------ conversation-aware
QUERY_STOP_WORDS: frozenset[str] = frozenset(
    """a about above after again against all am an and any are aren as at be because been
    before being below between both but by can cannot could couldn d did didn do does
    doesn doing don down during each few for from further had hadn has hasn have haven
    having he her here hers herself him himself his how i if in into is isn it its
    itself just ll m me more most mustn my myself no nor not now of off on once only or
    other ought our ours ourselves out over own re s same shan she should shouldn so some
    such t than that the their theirs them themselves then there these they this those
    through to too under until up ve very was wasn we were weren what when where which
    while who whom why will with won would wouldn y you your yours yourself yourselves
    also ever likely probably might may must shall kind type sort""".split()
)
"""English function words and question frames (after :func:`tokens`, so contractions
are split: "didn't" -> "didn", "t"). Dropped from the BM25 query only."""


def lexical_query(query: str, drop_names: Iterable[str] = ()) -> str:
    """The query's content words for the BM25 leg: :data:`QUERY_STOP_WORDS` removed and
    every contiguous mention of a name in ``drop_names`` removed (with a possessive
    "'s" after it). If nothing is left, the query without stop words, and if that is
    empty too, the query as written (a query is never emptied)."""
    words = tokens(query)
    drop = [t for t in (tokens(n) for n in drop_names) if t]
    kept: list[str] = []
    i = 0
    while i < len(words):
        for name in drop:
            if words[i : i + len(name)] == name:
                i += len(name)
                if i < len(words) and words[i] == "s":
                    i += 1
                break
        else:
            if words[i] not in QUERY_STOP_WORDS:
                kept.append(words[i])
            i += 1
    if kept:
        return " ".join(kept)
    without_stop = [w for w in words if w not in QUERY_STOP_WORDS]
    return " ".join(without_stop) if without_stop else query


def score_fusion(
    text_scores: Mapping[str, float],
    vector_similarities: Mapping[str, float],
    text_weight: float = TEXT_WEIGHT,
    vector_weight: float = FUSION_VECTOR_WEIGHT,
    vector_scaling: str = "raw",
) -> dict[str, float]:
    """``(wt * bm25 / max_bm25 + wv * sim) / (wt + wv)`` per document, in [0, 1]; a
    document missing from one list scores 0 there. ``sim`` is ``max(0, cosine)``
    ("raw"), or that min-max scaled over the vector list ("minmax": the best candidate
    1, the worst 0; a list whose similarities are all equal keeps them raw)."""
    total = float(text_weight) + float(vector_weight)
    if total <= 0:
        raise ValueError("at least one weight must be positive")
    if vector_scaling not in ("raw", "minmax"):
        raise ValueError('vector_scaling must be "raw" or "minmax"')
    top = max((float(v) for v in text_scores.values()), default=0.0)
    sims = {doc: max(0.0, float(v)) for doc, v in vector_similarities.items()}
    low, high = min(sims.values(), default=0.0), max(sims.values(), default=0.0)
    if vector_scaling == "minmax" and high > low:
        sims = {doc: (v - low) / (high - low) for doc, v in sims.items()}
    out: dict[str, float] = {}
    for doc in set(text_scores) | set(sims):
        t = float(text_scores.get(doc, 0.0)) / top if top > 0 else 0.0
        out[doc] = (text_weight * max(0.0, t) + vector_weight * sims.get(doc, 0.0)) / total
    return out


_QUESTION = re.compile(r"\?")
_ASKS_TIME = re.compile(
    r"\b(when|how long|how often|how many (days|weeks|months|years|times)|what (year|month|day|date|time)|"
    r"which (year|month|day|date)|since when|until when)\b",
    re.IGNORECASE,
)
_TIME_WORDS = re.compile(
    r"\b(yesterday|today|tonight|tomorrow|ago|last|next|recently|lately|soon|earlier|later|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday|weekend|weekends|week|weeks|"
    r"month|months|year|years|day|days|morning|evening|night|"
    r"january|february|march|april|may|june|july|august|september|october|november|december|"
    r"spring|summer|autumn|fall|winter|since|until|"
    r"(1[89]|20)\d\d|\d{1,2}(st|nd|rd|th)|\d{1,2}[/.-]\d{1,2}([/.-]\d{2,4})?)\b",
    re.IGNORECASE,
)


def is_question(text: str) -> bool:
    """Whether a turn asks something (holds a question mark): the turn after it is
    then likely its answer."""
    return bool(_QUESTION.search(text))


def asks_for_time(query: str) -> bool:
    """Whether the query asks for a time: "when", "how long", "what year"..."""
    return bool(_ASKS_TIME.search(query))


@lru_cache(maxsize=65_536)
def mentions_time(text: str) -> bool:
    """Whether a text states a time: a date, a year, a weekday or month, or a relative
    expression ("yesterday", "last week", "two years ago").

    Cached: a search asks it of every candidate (~160), the same memories come back
    for query after query, and the pattern costs ~27 µs per memory."""
    return bool(_TIME_WORDS.search(text))


def propagate_context(
    scores: Mapping[str, float],
    previous: Mapping[str, str],
    questions: Iterable[str],
    weights: RankingWeights = RankingWeights(),
) -> dict[str, float]:
    """The context score each document receives from its neighbouring turns.

    ``previous[d]`` is the document drawn from the turn just before ``d``'s source turn
    (same memory space and session); ``questions`` are the documents whose turn asks
    something. ``d`` receives ``context_forward`` (or ``context_forward_statement`` when
    the previous turn is no question) times the previous document's score, and
    ``context_backward`` times the score of the document whose previous turn ``d`` is.
    Only ``scores`` (the fused candidates) give; any document may receive."""
    asked = set(questions)
    out: dict[str, float] = {}
    for doc, prev in previous.items():
        if doc == prev:
            continue
        if prev in scores:
            w = weights.context_forward if prev in asked else weights.context_forward_statement
            if w:
                out[doc] = out.get(doc, 0.0) + w * float(scores[prev])
        if doc in scores and weights.context_backward:
            out[prev] = out.get(prev, 0.0) + weights.context_backward * float(scores[doc])
    return out


def prior_factor(
    speaker_named: bool, time_match: bool, weights: RankingWeights = RankingWeights()
) -> float:
    """``(1 + speaker_weight)`` if the query names the memory's speaker, times ``(1 +
    temporal_weight)`` if the query asks for a time the memory states."""
    factor = 1.0
    if speaker_named:
        factor *= 1.0 + weights.speaker_weight
    if time_match:
        factor *= 1.0 + weights.temporal_weight
    return factor
