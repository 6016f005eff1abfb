"""The hybrid ranking's glue: fuse the two lists, add the entity boost, recency,
supersession and priority, cap every superseded or duplicate memory just below its
successor, and shape the ordered results (formulas in ``memstream.domain.ranking``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from datetime import datetime
from typing import Any

from memstream.domain.events import Scope
from memstream.domain.priority import priority_factor
from memstream.domain.ranking import (
    RankingWeights,
    diversify,
    entity_boost,
    entity_idf,
    final_score,
    lexical_confidence,
    normalised_rrf,
    order_after_successors,
    recency_score,
    score_fusion,
    supersession_factor,
)
from memstream.projections.schema import scoped_key
from memstream.projections.search.lexical import terms
from memstream.projections.search.results import ScoreParts, SearchResult, to_result

__all__ = ["Evidence", "fuse", "entity_boosts", "ranked"]


@dataclass
class Evidence:
    """What ranks the candidates (``pk -> value``): the cosine similarity and BM25
    score of each list, the fused score, the score received from neighbouring turns
    and the speaker / time prior."""

    vsim: dict[str, float] = field(default_factory=dict)
    tscore: dict[str, float] = field(default_factory=dict)
    fused: dict[str, float] = field(default_factory=dict)
    context: dict[str, float] = field(default_factory=dict)
    priors: dict[str, float] = field(default_factory=dict)


def fuse(
    scope: Scope,
    vector: list[tuple[str, float]],
    text: list[tuple[str, float]],
    w: RankingWeights,
    rows: Mapping[str, Mapping[str, Any]] | None = None,
    text_query: str = "",
) -> Evidence:
    """Score fusion (or weighted RRF with ``fusion="rrf"``) of the vector list
    (``memory_id``, cosine distance) and the BM25 list (``memory_id``, score). With
    ``lexical_coverage``, ``rows`` and the BM25 leg's ``text_query``, each BM25 score
    is weighed by the share of the query's terms its memory holds (:func:`coverage`)."""
    team, user = scope.team_id, scope.user_id
    vpks = [scoped_key(team, user, mid) for mid, _ in vector]
    tpks = [scoped_key(team, user, mid) for mid, _ in text]
    vsim = {pk: 1.0 - distance for pk, (_, distance) in zip(vpks, vector)}
    tscore = {pk: score for pk, (_, score) in zip(tpks, text)}
    if w.fusion == "score":
        lexical, top = tscore, None
        if w.lexical_coverage and rows is not None and tscore:
            lexical = _weighed(tscore, rows, _terms(text_query), w)
            top = max(tscore.values())  # the weighing must not be scaled away
        fused = score_fusion(lexical, vsim, w.text_weight, w.fusion_vector_weight, w.vector_scaling, top)
    else:
        fused = normalised_rrf(
            {"vector": vpks, "text": tpks}, {"vector": w.vector_weight, "text": w.text_weight}, w.rrf_k
        )
    return Evidence(vsim=vsim, tscore=tscore, fused=fused)


def _weighed(
    tscore: Mapping[str, float], rows: Mapping[str, Mapping[str, Any]], query: frozenset[str], w: RankingWeights
) -> dict[str, float]:
    """Each BM25 score of an explicit memory (one not drawn from turns: a turn's words
    are all it has) times ``1 - s + s * coverage`` over the query's discriminating
    terms (a term held by most candidates, the name of the person every memory here is
    about, tells none apart), and times the query's :func:`lexical_confidence`."""
    held = {pk: _terms(r.get("content") or "") for pk, r in rows.items()}
    hub = {t for t in query if 2 * sum(t in h for h in held.values()) > len(held)}
    wanted = query - hub
    explicit = [pk for pk in tscore if not (rows.get(pk) or {}).get("source_message_ids")]
    counts = {pk: len(wanted & held.get(pk, frozenset())) for pk in explicit}
    conf = lexical_confidence(counts.values(), len(wanted)) if w.query_confidence and wanted else 1.0
    s = w.lexical_coverage
    out = dict(tscore)
    for pk in explicit:
        c = counts[pk] / len(wanted) if wanted else 1.0
        out[pk] = tscore[pk] * (1.0 - s + s * c) * conf
    return out


@lru_cache(maxsize=65_536)
def _terms(text: str) -> frozenset[str]:
    # the same memories come back query after query: each is stemmed once
    return frozenset(terms(text))


def _distinct_words(rows: Mapping[str, Mapping[str, Any]], order: list[str]) -> dict[str, frozenset[str]]:
    """Each candidate's terms without those most candidates hold (the name of the
    person they are all about): a word every memory shares makes none a repeat."""
    words = {pk: _terms(rows[pk].get("content") or "") for pk in order}
    counts = Counter(t for ws in words.values() for t in ws)
    common = frozenset(t for t, n in counts.items() if 2 * n > len(words))
    return {pk: ws - common for pk, ws in words.items()} if common else words


def entity_boosts(
    rows: Mapping[str, Mapping[str, Any]],
    keys: set[str],
    stats: tuple[dict[str, int], int] | None,
    w: RankingWeights,
) -> dict[str, float]:
    """The boost of the candidates that name entities the query names, damped by IDF."""
    if not keys:
        return {}
    df, total = stats if stats is not None else ({}, 0)
    idf = {key: entity_idf(df.get(key, 1), total) for key in keys}
    boosts: dict[str, float] = {}
    for pk, r in rows.items():
        own = r.get("entity_keys")
        if not own:
            continue
        hits = [idf[key] for key in own if key in idf]
        if hits:
            boosts[pk] = entity_boost(hits, w.entity_weight)
    return boosts


def _anchor_time(row: Mapping[str, Any]) -> datetime:
    # the first of these that is set (a datetime is never falsy)
    get = row.get
    value = get("timestamp") or get("timestamp_end") or get("timestamp_start") or get("created_at")
    if value is None:
        raise ValueError("memory row without any time")
    return value  # type: ignore[no-any-return]


def ranked(
    rows: Mapping[str, Mapping[str, Any]],
    ev: Evidence,
    boosts: Mapping[str, float],
    now: datetime,
    w: RankingWeights,
    *,
    drop_zero: bool,
    k: int | None,
) -> list[SearchResult]:
    """The candidates as results in ranking order: ``prior * (fused + context)`` with
    recency, supersession, entity boost and priority, capped below each successor,
    the first ``k`` places chosen among near-repeats (:func:`diversify`);
    without evidence (``drop_zero``) a candidate never pads the list; cut at ``k``
    (``None``: every candidate, for a reranker)."""
    raw: dict[str, float] = {}
    pieces: dict[str, tuple[float, float, float, float, float]] = {}
    fused, context, prior = ev.fused, ev.context, ev.priors
    successor: dict[str, str] = {}
    # candidates share their turn's time and a few priorities: each worked out once
    recency: dict[datetime, float] = {}
    factor: dict[Any, float] = {}
    for pk, r in rows.items():
        f = fused.get(pk, 0.0)
        anchor = _anchor_time(r)
        rec = recency.get(anchor)
        if rec is None:
            rec = recency[anchor] = recency_score((now - anchor).total_seconds(), w.half_life_s)
        nxt, dup = r.get("superseded_by"), r.get("canonical_id")
        sup = supersession_factor(bool(nxt), bool(dup), w) if nxt or dup else 1.0
        ent = boosts.get(pk, 0.0)
        p = r.get("priority")
        pri = factor.get(p)
        if pri is None:
            pri = factor[p] = priority_factor(p)
        pieces[pk] = (f, rec, sup, ent, pri)
        raw[pk] = final_score((f + context.get(pk, 0.0)) * prior.get(pk, 1.0), rec, sup, ent, w) * pri
        if nxt or dup:
            successor[pk] = scoped_key(r["team_id"], r["user_id"], nxt or dup)
    # capping follows successor links: without any, every score stands
    final = order_after_successors(raw, successor) if successor else raw
    order = sorted(rows, key=lambda pk: (-final[pk], rows[pk]["memory_id"]))
    if drop_zero:
        order = [pk for pk in order if final[pk] > 0.0]
    if w.diversity_weight and len(order) > 1:
        order = diversify(order, final, _distinct_words(rows, order), w.diversity_weight, k or len(order), successor)
    if k is not None:
        order = order[:k]
    results = []
    for pk in order:
        f, rec, sup, ent, pri = pieces[pk]
        parts = ScoreParts(
            ev.vsim.get(pk), ev.tscore.get(pk), f, rec, sup, ent, final[pk], context.get(pk, 0.0),
            prior.get(pk, 1.0), pri,
        )
        results.append(to_result(rows[pk], final[pk], parts))
    return results
