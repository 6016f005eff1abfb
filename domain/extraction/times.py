"""Times the model wrote, read as UTC: ISO forms, and relative phrases as a safety net."""

from __future__ import annotations

import re
from datetime import date, datetime, time, timedelta, timezone
from typing import Any

from dateutil.relativedelta import relativedelta

__all__ = ["resolve_time"]

_WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
_UNITS = {"day": 1, "week": 7, "fortnight": 14}
_NUMBER_WORDS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
}
_RELATIVE_AGO = re.compile(
    r"^(\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)\s+"
    r"(day|week|fortnight|month|year)s?\s+ago$"
)
_RELATIVE_IN = re.compile(
    r"^in\s+(\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)\s+"
    r"(day|week|fortnight|month|year)s?$"
)
_LAST_NEXT = re.compile(r"^(last|next|this|coming|past|previous)\s+(\w+)$")


def _midnight(d: date) -> datetime:
    return datetime.combine(d, time(0), tzinfo=timezone.utc)


def _shift_months(d: date, months: int) -> date:
    """``months`` later (earlier when negative), the day clamped to the month's last."""
    return d + relativedelta(months=months)


def resolve_time(value: Any, reference: datetime) -> datetime | None:
    """A timezone-aware UTC time for what the model wrote, or ``None``.

    Accepted: ISO 8601 date-times (a naive one is taken as UTC), dates (midnight UTC),
    ``YYYY-MM`` and ``YYYY`` (the first day), and, as a safety net when the model did not
    resolve them itself, relative expressions against ``reference`` (the time of the turn
    that said them): ``today``, ``yesterday``, ``tomorrow``, ``the day before
    yesterday``, ``the day after tomorrow``, ``N days|weeks|months|years ago``, ``in N
    ...``, ``last|next week|month|year``, ``last|next|this <weekday>``. Relative results
    are dates (midnight UTC). Anything else is ``None``: a bad time never sinks a memory.
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        if 1900 <= value <= 2200 and float(value).is_integer():
            return _midnight(date(int(value), 1, 1))
        return None
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not text or len(text) > 80:
        return None
    iso = text.replace("Z", "+00:00").replace("z", "+00:00")
    try:
        parsed = datetime.fromisoformat(iso)
    except ValueError:
        parsed = None
    if parsed is not None:
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        try:
            return parsed.astimezone(timezone.utc)
        except (OverflowError, ValueError):
            return None  # e.g. year 1 at +05:00 leaves the representable range
    match = re.fullmatch(r"(\d{4})-(\d{1,2})", text)
    if match:
        try:
            return _midnight(date(int(match.group(1)), int(match.group(2)), 1))
        except ValueError:
            return None
    if re.fullmatch(r"\d{4}", text):
        return _midnight(date(int(text), 1, 1))
    return _relative(text.lower().rstrip("."), reference.astimezone(timezone.utc).date())


def _relative(text: str, today: date) -> datetime | None:
    text = " ".join(text.split())
    if text.startswith("the "):
        text = text[4:]
    fixed = {
        "today": 0, "now": 0, "tonight": 0, "this morning": 0, "this evening": 0,
        "yesterday": -1, "last night": -1, "tomorrow": 1,
        "day before yesterday": -2, "day after tomorrow": 2,
    }
    if text in fixed:
        return _midnight(today + timedelta(days=fixed[text]))
    for pattern, sign in ((_RELATIVE_AGO, -1), (_RELATIVE_IN, 1)):
        match = pattern.match(text)
        if match:
            raw_n, unit = match.group(1), match.group(2)
            n = int(raw_n) if raw_n.isdigit() else _NUMBER_WORDS[raw_n]
            if n > 10_000:
                return None
            if unit in _UNITS:
                return _midnight(today + timedelta(days=sign * n * _UNITS[unit]))
            months = n if unit == "month" else 12 * n
            try:
                return _midnight(_shift_months(today, sign * months))
            except ValueError:
                return None
    match = _LAST_NEXT.match(text)
    if match:
        which, what = match.groups()
        sign = 1 if which in ("next", "coming") else (0 if which == "this" else -1)
        if what == "week":
            return _midnight(today + timedelta(days=7 * sign))
        if what == "month":
            return _midnight(_shift_months(today, sign))
        if what == "year":
            return _midnight(_shift_months(today, 12 * sign))
        if what in _WEEKDAYS:
            target = _WEEKDAYS.index(what)
            delta = target - today.weekday()
            if sign < 0:
                delta = delta - 7 if delta >= 0 else delta
            elif sign > 0:
                delta = delta + 7 if delta <= 0 else delta
            return _midnight(today + timedelta(days=delta))
    return None
