"""The checks the fast reader (:mod:`memstream.codec.fast_decode`) applies to decoded
values: each returns the plain value or raises :class:`Unsure`, leaving the record to
the general path."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

__all__ = ["Check", "Pattern", "UUID", "Unsure", "chain", "finite", "optional", "utc"]

Check = Callable[[Any], Any]


class Unsure(Exception):
    """This record is for the general path to judge."""


# The one ISO 8601 shape writers use: date, time, up to microseconds, ``Z`` or ``+hh:mm``.
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?(?:Z|[+-]\d{2}:\d{2})")


def utc(value: str) -> datetime:
    if not _TIME.fullmatch(value):
        raise Unsure
    return datetime.fromisoformat(value).astimezone(timezone.utc)


def finite(value: float) -> float:
    if not math.isfinite(value):
        raise Unsure
    return value


def chain(checks: Sequence[Check]) -> Check | None:
    if not checks:
        return None
    if len(checks) == 1:
        return checks[0]

    def run(value: Any) -> Any:
        for check in checks:
            value = check(value)
        return value

    return run


def optional(check: Check | None) -> Check | None:
    return None if check is None else (lambda v: None if v is None else check(v))


class Pattern:
    """A ``StringConstraints`` pattern as a check; several values of one pattern are
    checked in one match of the values joined by newlines (:meth:`all`)."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        body = pattern.removeprefix("^").removesuffix("$")
        self.one = re.compile(body)
        self.joined = re.compile(rf"(?:{body})(?:\n(?:{body}))*")

    def __call__(self, value: str) -> str:
        if not self.one.fullmatch(value):
            raise Unsure
        return value

    def all(self, values: list[str]) -> list[str]:
        """Every one of ``values`` matches. The joined text must hold exactly the
        joining newlines: a value with its own newline would pass as two."""
        joined = "\n".join(values)
        if joined.count("\n") != len(values) - 1 or not self.joined.fullmatch(joined):
            raise Unsure
        return values


# Checked here rather than by msgspec's ``Meta(pattern=...)``, which looks the pattern's
# ``search`` method up by name for every value.
UUID = Pattern(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
