"""Stable codes for dead-letter reasons: what an operator counts and a producer greps.

A reason is one line for people; its start is part of the producer contract
(docs/producers.md lists them), so a code follows from that start alone. Codes never
change meaning: a new kind of refusal gets a new code, and anything not recognised is
``invalid`` at the decode stage (a field of the event breaks a rule) or the stage's
own name at later stages (``project``, ``extract``, ``reflect``).
"""

from __future__ import annotations

import re

__all__ = ["REASON_CODES", "reason_code"]

# (code, pattern on the start of the reason); the first match wins.
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (code, re.compile(pattern))
    for code, pattern in (
        ("empty", r"record (has no value|value is empty)"),
        ("too-large", r"record is \d+ bytes; the limit is"),
        ("not-utf8", r"not UTF-8"),
        ("not-json", r"not JSON|not valid Unicode"),
        ("not-object", r"not a JSON object"),
        ("missing-type", r'invalid event: missing field "type"'),
        ("unknown-type", r"unknown event type"),
        ("header-mismatch", r"header \S+ .*(disagrees with|expected application/json)"),
        ("bad-header", r"header \S+ (has no value|is repeated|is not UTF-8|.* is not a positive integer)"),
        ("inflated-batch", r"offsets \d+-\d+: |a \S+ batch, which this worker cannot read"),
        ("refused-record", r"record key |record headers |a header is not|\d+ headers \(at most|headers of \d+ bytes|header '\S+' (has|appears|is set by)"),
        ("tampered", r"sealed record (cut short|with an unreadable header|does not open)"),
        ("not-sealable", r"cannot seal|\S+ is written by `memstream forget`"),
        ("forgotten", r"written before \S+ was forgotten"),
        ("quality-gate", r"a client memory refused by the quality gate"),
        ("not-signed", r".*the record does not carry the worker's producer identity"),
    )
)

REASON_CODES: tuple[str, ...] = (*(code for code, _ in _RULES), "invalid")
"""Every code a decode- or seal-stage reason can get (later stages use their name)."""


def reason_code(reason: str, stage: str = "decode") -> str:
    """The stable code of a dead letter's (opened) reason at ``stage``."""
    for code, pattern in _RULES:
        if pattern.match(reason):
            return code
    return "invalid" if stage in ("decode", "seal") else stage
