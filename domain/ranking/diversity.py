"""Diversity: the first places of a result list go to memories that say different things.

A question that needs several facts ("what events has Caroline joined?") is answered by
a list of different memories, not by five phrasings of one; and a memory repeated about
several people ("Greta finds the job stressful", "Farid finds the job stressful")
should hold one place, not three. :func:`diversify` is a greedy maximal-marginal-
relevance pass (Carbonell and Goldstein, SIGIR 1998) over word sets: each next place
goes to the candidate with the best ``score * (1 - weight * redundancy)``, where
``redundancy`` is its largest word overlap with a memory placed before it
(:func:`repeat`: Jaccard above a floor).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["REPEAT_FLOOR", "jaccard", "repeat", "diversify"]


REPEAT_FLOOR = 0.3
"""Word overlap (Jaccard) up to which two memories are no repeat of each other: short
facts about one topic share a word or two ("Hiroshi lives in a houseboat", "Hiroshi's
sister lives in Lisbon") and both may be wanted."""


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """``|a & b| / |a | b|``; 0 for two empty sets."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def repeat(a: frozenset[str], b: frozenset[str], floor: float = REPEAT_FLOOR) -> float:
    """How far ``a`` repeats ``b``: their :func:`jaccard` above ``floor``, scaled to
    [0, 1]."""
    return max(0.0, jaccard(a, b) - floor) / (1.0 - floor)


def diversify(
    order: Sequence[str],
    scores: Mapping[str, float],
    words: Mapping[str, frozenset[str]],
    weight: float,
    places: int,
    after: Mapping[str, str] | None = None,
    floor: float = REPEAT_FLOOR,
) -> list[str]:
    """``order`` (best first) with its first ``places`` places chosen greedily by
    ``scores[d] * (1 - weight * redundancy(d))``; the rest follow in their order.
    ``after[d]``: a memory ``d`` must stay below (its successor): ``d`` is not placed
    while that one waits. Ties keep ``order``."""
    if weight <= 0 or len(order) < 2:
        return list(order)
    after = after or {}
    left = list(order)
    redundancy = dict.fromkeys(left, 0.0)
    placed: list[str] = []
    while left and len(placed) < places:
        unplaced = set(left)
        best, value = None, 0.0
        for d in left:
            if after.get(d) in unplaced:
                continue
            v = scores[d] * (1.0 - weight * redundancy[d])
            if best is None or v > value:
                best, value = d, v
        if best is None:  # only a successor cycle is left: keep its order
            break
        left.remove(best)
        placed.append(best)
        chosen = words.get(best, frozenset())
        for d in left:
            r = repeat(words.get(d, frozenset()), chosen, floor)
            if r > redundancy[d]:
                redundancy[d] = r
    return placed + left
