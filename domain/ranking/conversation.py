"""Conversation-aware ranking: query processing, score fusion, neighbouring turns, priors.

Every rule is general; none knows the data it is benchmarked on. The numbers refer to
the scoring steps of :mod:`.fusion` (1-4), which these extend:

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
   ``CONTEXT_BACKWARD = 0.6`` of the turn just after it.
8. **Priors** (:func:`prior_factor`): ``(1 + SPEAKER_WEIGHT)`` = 2.6 when the query
   names the speaker of the memory's source turn (speaker-aware); ``(1 +
   TEMPORAL_WEIGHT)`` = 2.0 when the query asks for a time (:func:`asks_for_time`:
   "when", "how long ago", "what year"...) and the memory states one
   (:func:`mentions_time`: a date, a weekday, "yesterday", "last week"...); and
   ``QUESTION_PENALTY`` = 0.7 when every source turn of the memory asks something
   (:func:`is_question`): a question states little, and the answer after it is found
   through rule 7.

With 5-8: ``final = (fused + context) * prior * (1 - w + w * recency) * supersession
* (1 + entity)``, then capped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import date, datetime
from functools import lru_cache

from memstream.domain.ranking.fusion import tokens
from memstream.domain.ranking.weights import FUSION_VECTOR_WEIGHT, TEXT_WEIGHT, RankingWeights

__all__ = [
    "QUERY_STOP_WORDS",
    "lexical_query",
    "score_fusion",
    "is_question",
    "asks_for_time",
    "asks_about_conversation",
    "mentions_time",
    "propagate_context",
    "prior_factor",
    "is_turn_copy",
    "named_dates",
    "on_named_day",
    "coverage",
    "lexical_confidence",
    "query_names",
]


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
    text_top: float | None = None,
) -> dict[str, float]:
    """``(wt * bm25 / max_bm25 + wv * sim) / (wt + wv)`` per document, in [0, 1]; a
    document missing from one list scores 0 there. ``sim`` is ``max(0, cosine)``
    ("raw"), or that min-max scaled over the vector list ("minmax": the best candidate
    1, the worst 0; a list whose similarities are all equal keeps them raw).
    ``text_top``: what BM25 scores are divided by (default: their maximum)."""
    total = float(text_weight) + float(vector_weight)
    if total <= 0:
        raise ValueError("at least one weight must be positive")
    if vector_scaling not in ("raw", "minmax"):
        raise ValueError('vector_scaling must be "raw" or "minmax"')
    top = max((float(v) for v in text_scores.values()), default=0.0) if text_top is None else float(text_top)
    sims = {doc: max(0.0, float(v)) for doc, v in vector_similarities.items()}
    low, high = min(sims.values(), default=0.0), max(sims.values(), default=0.0)
    if vector_scaling == "minmax" and high > low:
        sims = {doc: (v - low) / (high - low) for doc, v in sims.items()}
    out: dict[str, float] = {}
    for doc in set(text_scores) | set(sims):
        t = float(text_scores.get(doc, 0.0)) / top if top > 0 else 0.0
        sim = sims.get(doc, 0.0)
        out[doc] = (text_weight * max(0.0, t) + vector_weight * sim) / total
    return out


_QUESTION = re.compile(r"\?")
_AUX = r"(did|does|do|is|was|were|will|would|has|have|had|can|could|should|are|am)"
_ASKS_TIME = re.compile(
    # "when" asks only where a question starts ("When did...", "..., and when is...");
    # "when she was younger" is a conjunction
    rf"(^\W*when|[,;:(]\s*when|\bwhen {_AUX})\b|"
    r"\b(how long|how often|how many (days|weeks|months|years|times)|what (year|month|day|date|time)|"
    r"which (year|month|day|date)|since when|until when)\b",
    re.IGNORECASE,
)
_ASKS_CONVERSATION = re.compile(
    r"\b(say|says|said|tell|tells|told|mention|mentions|mentioned|talk|talks|talked|chat|chats|chatted|"
    r"conversation|conversations|discuss|discussed|ask|asks|asked|reply|replied|message|messages|wrote)\b",
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


_NAME = re.compile(r"(?<=[\w,;:'\"] )[A-Z][\w'-]*[a-z][\w'-]*")


def query_names(query: str) -> frozenset[str]:
    """The capitalised words of the query that do not start a sentence: the names it
    asks about ("What did Caroline research?" -> Caroline), possessives stripped."""
    return frozenset(m.group(0).removesuffix("'s") for m in _NAME.finditer(query))


def coverage(query_terms: frozenset[str], memory_terms: frozenset[str]) -> float:
    """The share of the query's content terms a memory holds: how far a BM25 hit can be
    trusted. A hit on one common word of a long question is weak evidence; a hit on
    all of them is strong. 1 for a query without terms: nothing to weigh."""
    if not query_terms:
        return 1.0
    return len(query_terms & memory_terms) / len(query_terms)


def lexical_confidence(held: Iterable[int], wanted: int) -> float:
    """How far BM25 may reorder the vector list for one query, from how many of its
    ``wanted`` content terms each memory holds (``held``): fully when some memory holds
    two of them or all; else the best share any holds. A hit on one word of a
    three-word question ("live" in "which animals live with Alice at home?") is a
    topic match, not an answer: 1/3 of its weight."""
    best = max(held, default=0)
    if wanted <= 0 or best >= min(2, wanted):
        return 1.0
    return best / wanted


def is_question(text: str) -> bool:
    """Whether a turn asks something (holds a question mark): the turn after it is
    then likely its answer."""
    return bool(_QUESTION.search(text))


def asks_for_time(query: str) -> bool:
    """Whether the query asks for a time: "when" opening a question, "how long",
    "what year"..."""
    return bool(_ASKS_TIME.search(query))


_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september",
           "october", "november", "december")
_MONTH = r"(january|february|march|april|may|june|july|august|september|october|november|december)"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_DATES = re.compile(
    rf"\b(?:{_DAY} {_MONTH},? (\d{{4}})|{_MONTH} {_DAY},? (\d{{4}})|(\d{{4}})-(\d{{2}})-(\d{{2}}))\b", re.IGNORECASE
)


def named_dates(query: str) -> frozenset[date]:
    """The calendar days the query names ("on 16 November, 2023", "May 3, 2023",
    "2023-05-03"); impossible days are skipped."""
    out: set[date] = set()
    for m in _DATES.finditer(query):
        d1, mon1, y1, mon2, d2, y2, yi, mi, di = m.groups()
        try:
            if y1:
                out.add(date(int(y1), _MONTHS.index(mon1.lower()) + 1, int(d1)))
            elif y2:
                out.add(date(int(y2), _MONTHS.index(mon2.lower()) + 1, int(d2)))
            else:
                out.add(date(int(yi), int(mi), int(di)))
        except ValueError:
            continue
    return frozenset(out)


def on_named_day(days: frozenset[date], start: datetime | None, end: datetime | None) -> bool:
    """Whether a memory's time (a point: ``start`` = ``end``; or a span) falls on one
    of the named ``days``: what was recorded that day is what a question about that
    day asks for."""
    if not days or start is None:
        return False
    first, last = start.date(), (end or start).date()
    return any(first <= d <= last for d in days)


def asks_about_conversation(query: str) -> bool:
    """Whether the query asks what was said ("what did Alice say...", "...mention",
    "...told"): then a turn is as good an answer as a fact stated apart."""
    return bool(_ASKS_CONVERSATION.search(query))


@lru_cache(maxsize=65_536)
def mentions_time(text: str) -> bool:
    """Whether a text states a time: a date, a year, a weekday or month, or a relative
    expression ("yesterday", "last week", "two years ago").

    Cached: a search asks it of every candidate, and the same memories come back for
    query after query."""
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


def is_turn_copy(content: str, turns: Iterable[tuple[str | None, str]]) -> bool:
    """Whether a memory is its source turn word for word (``turns``: ``(speaker,
    text)`` of its source turns), as the no-LLM extractor stores one: the text, or
    ``"<speaker>: <text>"``. A fact extracted or written apart is not."""
    said = content.strip()
    for speaker, text in turns:
        text = text.strip()
        if text and (said == text or (speaker and said == f"{speaker.strip()}: {text}")):
            return True
    return False


def prior_factor(
    speaker_named: bool,
    time_match: bool,
    weights: RankingWeights = RankingWeights(),
    only_asks: bool = False,
    small_talk: bool = False,
    day_match: bool = False,
) -> float:
    """``(1 + speaker_weight)`` if the query names the memory's speaker (or, for a
    memory not drawn from turns, a speaker the memory names), times ``(1 +
    temporal_weight)`` if the query asks for a time the memory states, times
    ``question_penalty`` if the memory's source turns only ask (``only_asks``), times
    ``turn_prior`` for a turn memory the query does not ask about (``small_talk``),
    times ``(1 + date_weight)`` if its time is on a day the query names (``day_match``)."""
    factor = weights.question_penalty if only_asks else 1.0
    if day_match:
        factor *= 1.0 + weights.date_weight
    if small_talk:
        factor *= weights.turn_prior
    if speaker_named:
        factor *= 1.0 + weights.speaker_weight
    if time_match:
        factor *= 1.0 + weights.temporal_weight
    return factor
