"""Ranking math for hybrid search, pure (no I/O, no clock): the search module gathers
candidates from LanceDB and hands their ranks, ages and links to these functions.

:mod:`.weights` holds every constant and :class:`RankingWeights`; :mod:`.fusion` builds a
candidate's score (fusion, recency, supersession, entity boost: steps 1-4);
:mod:`.conversation` adds the conversation-aware steps 5-8. The names are re-exported here.
"""

from memstream.domain.ranking.conversation import (
    QUERY_STOP_WORDS,
    asks_for_time,
    is_question,
    lexical_query,
    mentions_time,
    prior_factor,
    propagate_context,
    score_fusion,
)
from memstream.domain.ranking.fusion import (
    entity_boost,
    entity_idf,
    final_score,
    normalised_rrf,
    order_after_successors,
    query_mentions,
    recency_factor,
    recency_score,
    supersession_factor,
    tokens,
    weighted_rrf,
)
from memstream.domain.ranking.weights import (
    CONTEXT_BACKWARD,
    CONTEXT_FORWARD,
    CONTEXT_FORWARD_STATEMENT,
    DUPLICATE_PENALTY,
    ENTITY_WEIGHT,
    FUSION_VECTOR_WEIGHT,
    HALF_LIFE_SECONDS,
    RECENCY_WEIGHT,
    RRF_K,
    SPEAKER_WEIGHT,
    SUCCESSOR_MARGIN,
    SUPERSEDED_PENALTY,
    TEMPORAL_WEIGHT,
    TEXT_WEIGHT,
    VECTOR_SCALING,
    VECTOR_WEIGHT,
    RankingWeights,
)

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
