"""Ratings read leniently, never guessed."""

from __future__ import annotations

import pytest

from memstream.domain.events import Rating
from memstream.domain.reflection.ratings import RatingParseError, parse_rating, rating_direction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("buy", Rating.buy),
        ("  SELL ", Rating.sell),
        ("Strong Buy", Rating.buy),
        ("**Overweight**", Rating.overweight),
        ("outperform", Rating.overweight),
        ("equal weight", Rating.hold),
        ("Neutral", Rating.hold),
        ("underperform", Rating.underweight),
        ("Rating: Underweight\nThe margins are thinning.", Rating.underweight),
        ("Analysis...\nFINAL TRANSACTION PROPOSAL: **SELL**", Rating.sell),
        ("Recommendation - hold.", Rating.hold),
        ("Rating: buy. On reflection, Rating: hold", Rating.hold),  # the last label wins
        ("We would buy more on any dip.", Rating.buy),
        ("Despite the sell-off we hold the position.", Rating.hold),  # "sell-off" is no rating
        ("buyback announced; we keep a HOLD", Rating.hold),
    ],
)
def test_parse_rating_is_lenient(text: str, expected: Rating) -> None:
    assert parse_rating(text) is expected


@pytest.mark.parametrize(
    "text",
    ["", "   ", "the weather is nice", "buy or sell, hard to say", "add to the trim list"],
)
def test_parse_rating_refuses_to_guess(text: str) -> None:
    with pytest.raises(RatingParseError):
        parse_rating(text)


def test_parse_rating_passes_enum_values_through() -> None:
    assert parse_rating(Rating.overweight) is Rating.overweight


def test_rating_direction() -> None:
    assert [rating_direction(r) for r in Rating] == [1, 1, 0, -1, -1]
