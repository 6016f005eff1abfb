"""Ratings as models and people write them, read into the five-step scale."""

from __future__ import annotations

import re

from memstream.domain.events import Rating

__all__ = ["RatingParseError", "parse_rating", "rating_direction"]

_SYNONYMS: dict[str, Rating] = {
    "buy": Rating.buy,
    "strong buy": Rating.buy,
    "long": Rating.buy,
    "go long": Rating.buy,
    "overweight": Rating.overweight,
    "over weight": Rating.overweight,
    "outperform": Rating.overweight,
    "accumulate": Rating.overweight,
    "moderate buy": Rating.overweight,
    "add": Rating.overweight,
    "hold": Rating.hold,
    "neutral": Rating.hold,
    "market perform": Rating.hold,
    "equal weight": Rating.hold,
    "equal-weight": Rating.hold,
    "equalweight": Rating.hold,
    "wait": Rating.hold,
    "underweight": Rating.underweight,
    "under weight": Rating.underweight,
    "underperform": Rating.underweight,
    "reduce": Rating.underweight,
    "trim": Rating.underweight,
    "moderate sell": Rating.underweight,
    "sell": Rating.sell,
    "strong sell": Rating.sell,
    "short": Rating.sell,
    "go short": Rating.sell,
}

# Words that name a rating when they stand alone in running text. Short verbs such as
# "add", "trim", "wait", "long" and "short" are too common in prose to count there;
# they are accepted only as the whole answer or after a label.
_PROSE_WORDS = (
    "strong buy",
    "strong sell",
    "moderate buy",
    "moderate sell",
    "overweight",
    "underweight",
    "outperform",
    "underperform",
    "market perform",
    "equal weight",
    "equal-weight",
    "accumulate",
    "buy",
    "hold",
    "sell",
    "neutral",
)
_PROSE_RE = re.compile(
    r"(?<![\w-])(" + "|".join(re.escape(w).replace(r"\ ", r"[\s_]+") for w in _PROSE_WORDS) + r")(?![\w-])",
    re.IGNORECASE,
)
_LABEL_RE = re.compile(
    r"(?:final\s+(?:transaction\s+)?(?:proposal|decision|rating|recommendation|call|answer)"
    r"|rating|recommendation|decision|verdict|action|call|stance|position)"
    r"\s*(?:is|was|of)?\s*[:=\-\u2013\u2014]+\s*[*_`\"'\[(]*\s*"
    r"([A-Za-z][A-Za-z _-]{1,20}?)\s*[*_`\"'\])]*\s*(?=$|[\s.,;!?)\]])",
    re.IGNORECASE | re.MULTILINE,
)
_NORMALISE_WS = re.compile(r"[\s_]+")


class RatingParseError(ValueError):
    """Text in which no single 5-level rating can be found; ``reason`` is one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _synonym(text: str) -> Rating | None:
    key = _NORMALISE_WS.sub(" ", text.strip().strip("*_`\"'.!:;,()[]").lower()).strip()
    return _SYNONYMS.get(key)


def parse_rating(value: str | Rating) -> Rating:
    """Read a 5-level rating from an enum value, a word, or a model's free text.

    Lenient, but it never guesses between two answers. In order:

    1. the whole text is a rating or a synonym ("Buy", "STRONG SELL", "outperform",
       "equal weight", "neutral", "**Hold**");
    2. a labelled answer, the last one winning: "Rating: Overweight",
       "FINAL TRANSACTION PROPOSAL: **SELL**", "Recommendation - hold";
    3. rating words in prose ("we would buy here"): accepted when they all name the
       same rating; "buy or sell" raises. Compounds such as "sell-off" or
       "buyback" and short verbs ("add", "trim") do not count in prose.

    Raises :class:`RatingParseError` when nothing (or something ambiguous) is found.
    """
    if isinstance(value, Rating):
        return value
    if not isinstance(value, str) or not value.strip():
        raise RatingParseError("rating is empty")
    whole = _synonym(value)
    if whole is not None:
        return whole
    labelled = [r for m in _LABEL_RE.finditer(value) if (r := _synonym(m.group(1))) is not None]
    if labelled:
        return labelled[-1]
    found = {r for m in _PROSE_RE.finditer(value) if (r := _synonym(m.group(1))) is not None}
    if len(found) == 1:
        return found.pop()
    snippet = " ".join(value.split())[:60]
    if not found:
        raise RatingParseError(
            f"no rating found in {snippet!r} (expected one of: buy, overweight, hold, underweight, sell)"
        )
    names = ", ".join(sorted(r.value for r in found))
    raise RatingParseError(f"ambiguous rating in {snippet!r}: mentions {names}")


def rating_direction(rating: Rating) -> int:
    """+1 for a bullish call (buy, overweight), -1 for a bearish one, 0 for hold."""
    return {
        Rating.buy: 1,
        Rating.overweight: 1,
        Rating.hold: 0,
        Rating.underweight: -1,
        Rating.sell: -1,
    }[Rating(rating)]
