"""The ranking's constants and :class:`RankingWeights`, every tunable in one value."""

from __future__ import annotations

from dataclasses import dataclass

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
    "FUSION_VECTOR_WEIGHT",
    "VECTOR_SCALING",
    "CONTEXT_FORWARD",
    "CONTEXT_FORWARD_STATEMENT",
    "CONTEXT_BACKWARD",
    "SPEAKER_WEIGHT",
    "TEMPORAL_WEIGHT",
    "QUESTION_PENALTY",
    "LEXICAL_COVERAGE",
    "TURN_PRIOR",
    "DATE_WEIGHT",
    "DIVERSITY_WEIGHT",
    "RankingWeights",
]

RRF_K = 60
VECTOR_WEIGHT = 1.0
TEXT_WEIGHT = 1.0
RECENCY_WEIGHT = 0.1
HALF_LIFE_SECONDS = 30 * 86_400.0
SUPERSEDED_PENALTY = 0.5
DUPLICATE_PENALTY = 0.5
ENTITY_WEIGHT = 0.0
"""Off: fitted on four shapes, the entity boost helped on none (bench/data/ranking_fit.json)."""
SUCCESSOR_MARGIN = 1e-3
"""A capped memory scores ``(1 - SUCCESSOR_MARGIN)`` times its successor's score."""
FUSION_VECTOR_WEIGHT = 0.7
"""Weight of min-max scaled cosine similarity against max-normalised BM25 (weight
``TEXT_WEIGHT``) in score fusion: full text leads, similarity finds what is said in
other words. Fitted with the default neural embedder (docs/benchmarks-history.md)."""
VECTOR_SCALING = "minmax"
"""A sentence model's cosines of a relevant and an unrelated memory differ by a few
tenths: scaled over the candidates, the vector leg spans [0, 1] as BM25 does."""
CONTEXT_FORWARD = 0.8
CONTEXT_FORWARD_STATEMENT = 0.2
CONTEXT_BACKWARD = 0.6
SPEAKER_WEIGHT = 1.6
TEMPORAL_WEIGHT = 1.0
QUESTION_PENALTY = 0.7
"""A memory drawn only from turns that ask something scores this share of itself: a
question states little; its answer, which the neighbouring-turn rule finds, does."""


TURN_PRIOR = 0.5
"""A turn memory (its source turn word for word, as the no-LLM extractor stores it)
scores this share of itself unless the query asks what was said: a fact stated apart
answers better than small talk of equal relevance. Constant over a space of turns
only, so it reorders nothing there."""

DATE_WEIGHT = 2.0
"""A memory whose time is on a day the query names ("on 16 November, 2023") scores
``1 + DATE_WEIGHT`` times itself."""

DIVERSITY_WEIGHT = 0.5
"""How much a memory's word overlap with one ranked above it costs its place
(:func:`~memstream.domain.ranking.diversify`; 0: off)."""

LEXICAL_COVERAGE = 1.0
"""A BM25 hit counts by its confidence: the share of the query's content terms the
memory holds (1.0: fully; 0.0: not weighed)."""



@dataclass(frozen=True)
class RankingWeights:
    """Every tunable of the ranking in one value, defaults as documented in
    :mod:`.fusion` and :mod:`.conversation`; benchmarks tune these without touching the
    search code."""

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
    question_penalty: float = QUESTION_PENALTY
    """The prior of a memory whose source turns all ask something (1.0: off)."""
    date_weight: float = DATE_WEIGHT
    diversity_weight: float = DIVERSITY_WEIGHT
    turn_prior: float = TURN_PRIOR
    """The prior of a turn memory when the query does not ask what was said (1.0: off)."""
    speaker_about: bool = True
    """The speaker prior also for a memory not drawn from turns that names the speaker
    the query names (False: turns only)."""
    lexical_coverage: float = LEXICAL_COVERAGE
    """How far each BM25 hit is weighed by the share ``c`` of the query's content terms
    it holds: by ``1 - s + s * c`` (0: BM25 normalised by its best hit only)."""
    query_confidence: bool = True
    """Also weigh every BM25 hit of explicit memories by :func:`lexical_confidence` of
    the query (False: by its own coverage only)."""
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
        for name in ("superseded_penalty", "duplicate_penalty", "question_penalty", "turn_prior"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1]")
        if not 0.0 <= self.diversity_weight <= 1.0:
            raise ValueError("diversity_weight must be in [0, 1]")
        if not 0.0 <= self.lexical_coverage <= 1.0:
            raise ValueError("lexical_coverage must be in [0, 1]")
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
            "date_weight",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
