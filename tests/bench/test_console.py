"""``memstream bench console`` on a small space: every page answers 200 through the
real application (the run raises on any other status) and gets its figures."""

from __future__ import annotations

import pytest

from memstream.bench import console

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_every_page_is_measured_on_a_small_space(kafka_bootstrap: str) -> None:
    result = console.run(memories=300, requests=2)
    assert result["memories"] == 300 and result["requests_per_page"] == 2
    assert set(result["pages"]) == {
        "search", "memory", "ledger", "ledger, lessons on one subject", "ledger, page 40", "pending (fragment)",
        "timeline", "timeline, deep page", "spaces", "spaces, team-wide key",
        "operations", "operations status (fragment)", "dead letters",
    }
    for figures in result["pages"].values():
        assert 0 < figures["p50_ms"] <= figures["max_ms"]
    assert result["worst_p95_ms"] == max(f["p95_ms"] for f in result["pages"].values())
