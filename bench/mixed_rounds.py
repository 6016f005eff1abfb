"""The arithmetic of ``memstream bench mixed``'s rounds (pure: no I/O).

The bench alternates its phases in rounds (alone, mixed, alone, mixed, ...) so that
each mixed phase is measured seconds after an alone phase: on a shared machine the
speed of the same code drifts by tens of percent within minutes, and two long phases
taken at different moments cannot resolve a 10 % change.

How the figures come from the rounds:

* ``mixed_ratio`` is the **median of the per-round ratios** (searches/s mixed / alone
  within one round): each ratio pairs two phases close in time, and the median drops
  a round that another process on the machine disturbed;
* ``searches_per_s_alone`` / ``_mixed`` are the medians of the rounds' rates;
* the latency percentiles (``search_p50_ms_*``, ``search_p99_ms_*``) pool the samples
  of all phases of a kind (a short phase holds too few samples for its own p99), and
  ``p99_ratio`` is pooled p99 mixed / pooled p99 alone: both pools span the same
  minutes, so a drift weighs on both sides alike;
* ``api_cpu_ms_per_search_*``: the API's CPU over all phases of a kind divided by their
  searches (the mixed one includes the writes' handling).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memstream.bench._common import percentile

__all__ = ["PhaseLog", "RATIO_METHOD", "round_figures", "pooled_figures", "median_or_none", "merged", "cpu_ms_per_search"]

RATIO_METHOD = (
    "mixed_ratio: median over rounds of (searches/s mixed / alone) within the round; "
    "searches_per_s_*: medians over rounds; p50/p99: pooled over all phases of a kind; "
    "p99_ratio: pooled p99 mixed / pooled p99 alone"
)


@dataclass
class PhaseLog:
    """Search latencies of one phase, in milliseconds."""

    samples_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0
    api_cpu_s: float | None = None
    """CPU time the API process used during the phase (its writes' included)."""
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds of each process of the run during the phase (``api``, ``worker``
    with its decoder, ``broker`` when it is the local one, ``client``: this one)."""

    writes: int = 0
    """Writes acknowledged during the phase."""

    def cores(self) -> dict[str, float]:
        """Each process's CPU over the phase, in cores."""
        return {name: round(s / self.seconds, 3) for name, s in self.cpu_s.items()} if self.seconds > 0 else {}

    @property
    def per_s(self) -> float:
        return len(self.samples_ms) / self.seconds if self.seconds > 0 else 0.0


def median_or_none(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def cpu_ms_per_search(phases: Sequence[PhaseLog]) -> float | None:
    """The API's CPU over ``phases`` per search answered in them."""
    searches = sum(len(p.samples_ms) for p in phases)
    if not searches or any(p.api_cpu_s is None for p in phases):
        return None
    return sum(p.api_cpu_s or 0.0 for p in phases) * 1000.0 / searches


def round_figures(alone: PhaseLog, mixed: PhaseLog) -> dict[str, Any]:
    """One round's figures: its two phases side by side."""
    a99 = percentile(alone.samples_ms, 99) if alone.samples_ms else None
    m99 = percentile(mixed.samples_ms, 99) if mixed.samples_ms else None
    return {
        "searches_per_s_alone": round(alone.per_s, 2),
        "searches_per_s_mixed": round(mixed.per_s, 2),
        "mixed_ratio": _ratio(mixed.per_s, alone.per_s),
        "search_p99_ms_alone": a99,
        "search_p99_ms_mixed": m99,
        "p99_ratio": _ratio(m99, a99),
        "api_cpu_ms_per_search_alone": cpu_ms_per_search([alone]),
        "api_cpu_ms_per_search_mixed": cpu_ms_per_search([mixed]),
        "writes_per_s": mixed.writes / mixed.seconds if mixed.seconds else 0.0,
    }


def pooled_figures(rounds: Sequence[tuple[PhaseLog, PhaseLog]]) -> dict[str, Any]:
    """The run's figures from its rounds (see the module's docstring for how)."""
    if not rounds:
        raise ValueError("no rounds")
    per_round = [round_figures(a, m) for a, m in rounds]
    alone_ms = [s for a, _ in rounds for s in a.samples_ms]
    mixed_ms = [s for _, m in rounds for s in m.samples_ms]
    a99 = percentile(alone_ms, 99) if alone_ms else None
    m99 = percentile(mixed_ms, 99) if mixed_ms else None
    mixed_s = sum(m.seconds for _, m in rounds)
    return {
        "searches_per_s_alone": median_or_none([r["searches_per_s_alone"] for r in per_round]),
        "searches_per_s_mixed": median_or_none([r["searches_per_s_mixed"] for r in per_round]),
        "mixed_ratio": median_or_none([r["mixed_ratio"] for r in per_round]),
        "search_p50_ms_alone": percentile(alone_ms, 50) if alone_ms else None,
        "search_p99_ms_alone": a99,
        "search_p50_ms_mixed": percentile(mixed_ms, 50) if mixed_ms else None,
        "search_p99_ms_mixed": m99,
        "p99_ratio": _ratio(m99, a99),
        "p99_ratio_round_median": median_or_none([r["p99_ratio"] for r in per_round]),
        "api_cpu_ms_per_search_alone": cpu_ms_per_search([a for a, _ in rounds]),
        "api_cpu_ms_per_search_mixed": cpu_ms_per_search([m for _, m in rounds]),
        "writes_per_s": sum(m.writes for _, m in rounds) / mixed_s if mixed_s else 0.0,
        "ratio_method": RATIO_METHOD,
        "rounds": per_round,
    }


def merged(phases: Sequence[PhaseLog]) -> PhaseLog:
    """All phases of a kind as one (their samples, seconds, CPU and writes summed):
    for the figures that need one phase, such as CPU cores and the net CPU a search."""
    out = PhaseLog()
    for p in phases:
        out.samples_ms.extend(p.samples_ms)
        out.seconds += p.seconds
        out.writes += p.writes
        for name, s in p.cpu_s.items():
            out.cpu_s[name] = out.cpu_s.get(name, 0.0) + s
    out.api_cpu_s = out.cpu_s.get("api") if all(p.api_cpu_s is not None for p in phases) else None
    return out
