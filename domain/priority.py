"""Priority in ranking: a small factor that can order equals, never outweigh relevance.

Every memory carries a priority, 0-100 (the extraction prompt: 90-100 identity, strong
preferences, commitments and explicit "remember this"; 50 ordinary facts; under 20
trivia). Search multiplies a candidate's score by::

    priority_factor(p) = 1 + PRIORITY_WEIGHT * (p - 50) / 50      (p clamped to 0-100)

so an ordinary memory (50) is unchanged and the factor stays within
``[1 - PRIORITY_WEIGHT, 1 + PRIORITY_WEIGHT]`` = [0.95, 1.05]. A priority-100 memory
therefore ranks above a priority-0 one only when the latter's relevance is less than
``1.05 / 0.95`` = 10.5 % higher: priority breaks near-ties (a priority-90 instruction
before a priority-10 aside saying much the same), never lifts an unrelated memory over
a relevant one. ``--explain`` shows the factor as ``priority``. It is its own term,
apart from the fusion weights of :mod:`memstream.domain.ranking`.
"""

from __future__ import annotations

__all__ = ["PRIORITY_WEIGHT", "NEUTRAL_PRIORITY", "priority_factor"]

PRIORITY_WEIGHT = 0.05
NEUTRAL_PRIORITY = 50


def priority_factor(priority: int | None, weight: float = PRIORITY_WEIGHT) -> float:
    """The score factor of a memory's ``priority`` (``None``: neutral); see above."""
    if priority is None:
        return 1.0
    p = min(100, max(0, int(priority)))
    return 1.0 + weight * (p - NEUTRAL_PRIORITY) / NEUTRAL_PRIORITY
