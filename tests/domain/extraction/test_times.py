"""Times the model wrote, absolute and relative."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from memstream.domain.extraction.times import resolve_time
from tests.domain.extraction.helpers import T0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-07", datetime(2024, 5, 7, tzinfo=timezone.utc)),
        ("2024-05-07T10:00:00Z", datetime(2024, 5, 7, 10, tzinfo=timezone.utc)),
        ("2024-05-07T12:00:00+02:00", datetime(2024, 5, 7, 10, tzinfo=timezone.utc)),
        ("2024-05-07T10:00:00", datetime(2024, 5, 7, 10, tzinfo=timezone.utc)),
        ("2024-05", datetime(2024, 5, 1, tzinfo=timezone.utc)),
        ("2021", datetime(2021, 1, 1, tzinfo=timezone.utc)),
        ("today", datetime(2024, 5, 8, tzinfo=timezone.utc)),
        ("yesterday", datetime(2024, 5, 7, tzinfo=timezone.utc)),
        ("Yesterday.", datetime(2024, 5, 7, tzinfo=timezone.utc)),
        ("tomorrow", datetime(2024, 5, 9, tzinfo=timezone.utc)),
        ("the day before yesterday", datetime(2024, 5, 6, tzinfo=timezone.utc)),
        ("3 days ago", datetime(2024, 5, 5, tzinfo=timezone.utc)),
        ("two weeks ago", datetime(2024, 4, 24, tzinfo=timezone.utc)),
        ("in 2 days", datetime(2024, 5, 10, tzinfo=timezone.utc)),
        ("a month ago", datetime(2024, 4, 8, tzinfo=timezone.utc)),
        ("1 year ago", datetime(2023, 5, 8, tzinfo=timezone.utc)),
        ("last week", datetime(2024, 5, 1, tzinfo=timezone.utc)),
        ("next month", datetime(2024, 6, 8, tzinfo=timezone.utc)),
        ("last friday", datetime(2024, 5, 3, tzinfo=timezone.utc)),
        ("last wednesday", datetime(2024, 5, 1, tzinfo=timezone.utc)),
        ("next monday", datetime(2024, 5, 13, tzinfo=timezone.utc)),
        ("this friday", datetime(2024, 5, 10, tzinfo=timezone.utc)),
    ],
)
def test_resolve_time(text: str, expected: datetime) -> None:
    assert resolve_time(text, T0) == expected


@pytest.mark.parametrize("value", [None, "", "someday", "the 5th", "2024-13-01", "0001-01-01T00:00:00+05:00", True, 12.5, [], "x" * 200])
def test_unresolvable_times_are_none(value: Any) -> None:
    assert resolve_time(value, T0) is None


def test_month_arithmetic_clamps_the_day() -> None:
    assert resolve_time("a month ago", datetime(2024, 3, 31, tzinfo=timezone.utc)) == datetime(
        2024, 2, 29, tzinfo=timezone.utc
    )
