"""The arithmetic of ``bench mixed``'s rounds: how the run's figures come from them."""

from __future__ import annotations

import math

import pytest

from memstream.bench.mixed_rounds import PhaseLog, merged, pooled_figures, round_figures


def _phase(per_s: float, seconds: float, latency_ms: float, *, api_cpu_s: float, writes: int = 0) -> PhaseLog:
    n = int(per_s * seconds)
    return PhaseLog(
        samples_ms=[latency_ms] * n, seconds=seconds, api_cpu_s=api_cpu_s,
        cpu_s={"api": api_cpu_s, "worker": 0.5}, writes=writes,
    )


def test_one_round_sets_its_two_phases_side_by_side() -> None:
    alone = _phase(100, 6, 50.0, api_cpu_s=3.0)
    mixed = _phase(80, 6, 90.0, api_cpu_s=4.8, writes=180)
    r = round_figures(alone, mixed)
    assert r["searches_per_s_alone"] == 100 and r["searches_per_s_mixed"] == 80
    assert r["mixed_ratio"] == pytest.approx(0.8)
    assert r["p99_ratio"] == pytest.approx(90.0 / 50.0)
    assert r["api_cpu_ms_per_search_alone"] == pytest.approx(3000.0 / 600)
    assert r["api_cpu_ms_per_search_mixed"] == pytest.approx(4800.0 / 480)
    assert r["writes_per_s"] == pytest.approx(30.0)


def test_the_ratio_is_the_median_of_the_rounds_ratios_not_a_ratio_of_totals() -> None:
    """A machine that slows down 2x over the run: each round's ratio is 0.5, whatever
    the drift; the totals' ratio would mix the fast and the slow minutes."""
    rounds = []
    for speed in (1.0, 0.8, 0.6, 0.5, 0.4):
        rounds.append((_phase(100 * speed, 10, 40.0, api_cpu_s=5.0), _phase(50 * speed, 10, 80.0, api_cpu_s=5.0)))
    out = pooled_figures(rounds)
    assert out["mixed_ratio"] == pytest.approx(0.5)
    assert [r["mixed_ratio"] for r in out["rounds"]] == pytest.approx([0.5] * 5)
    assert out["searches_per_s_alone"] == pytest.approx(60.0)  # the median round
    assert out["searches_per_s_mixed"] == pytest.approx(30.0)


def test_one_disturbed_round_does_not_move_the_median() -> None:
    steady = [(_phase(100, 6, 40.0, api_cpu_s=3.0), _phase(70, 6, 60.0, api_cpu_s=3.0)) for _ in range(4)]
    disturbed = (_phase(100, 6, 40.0, api_cpu_s=3.0), _phase(10, 6, 60.0, api_cpu_s=3.0))
    out = pooled_figures([*steady[:2], disturbed, *steady[2:]])
    assert out["mixed_ratio"] == pytest.approx(0.7)


def test_percentiles_pool_the_samples_of_every_phase_of_a_kind() -> None:
    a1 = PhaseLog(samples_ms=[10.0] * 100, seconds=1.0, api_cpu_s=0.5)
    a2 = PhaseLog(samples_ms=[20.0] * 99 + [100.0], seconds=1.0, api_cpu_s=0.5)
    m1 = PhaseLog(samples_ms=[30.0] * 50, seconds=1.0, api_cpu_s=1.0)
    m2 = PhaseLog(samples_ms=[30.0] * 50, seconds=1.0, api_cpu_s=1.0)
    out = pooled_figures([(a1, m1), (a2, m2)])
    assert out["search_p50_ms_alone"] == pytest.approx(15.0)  # between the 10s and the 20s
    assert out["search_p99_ms_alone"] == pytest.approx(20.0)  # the one 100 is above p99 of 200
    assert out["search_p99_ms_mixed"] == pytest.approx(30.0)
    assert out["p99_ratio"] == pytest.approx(30.0 / 20.0)
    # CPU a search: all the phases' CPU over all their searches (not a mean of means)
    assert out["api_cpu_ms_per_search_alone"] == pytest.approx(1000.0 / 200)
    assert out["api_cpu_ms_per_search_mixed"] == pytest.approx(2000.0 / 100)
    assert "median over rounds" in out["ratio_method"]


def test_a_phase_without_searches_gives_no_ratio_and_no_cpu() -> None:
    empty = PhaseLog(seconds=6.0, api_cpu_s=1.0)
    r = round_figures(empty, _phase(50, 6, 30.0, api_cpu_s=1.0))
    assert r["mixed_ratio"] is None and r["p99_ratio"] is None
    assert r["api_cpu_ms_per_search_alone"] is None
    out = pooled_figures([(empty, empty)])
    assert out["mixed_ratio"] is None and out["search_p99_ms_alone"] is None
    with pytest.raises(ValueError):
        pooled_figures([])


def test_merged_sums_the_phases() -> None:
    a = _phase(10, 2, 5.0, api_cpu_s=1.0, writes=3)
    b = _phase(20, 3, 5.0, api_cpu_s=2.0, writes=4)
    m = merged([a, b])
    assert len(m.samples_ms) == 80 and m.seconds == 5 and m.writes == 7
    assert m.cpu_s == {"api": 3.0, "worker": 1.0} and m.api_cpu_s == 3.0
    assert m.cores() == {"api": 0.6, "worker": 0.2}
    assert math.isclose(m.per_s, 16.0)
