"""Which past lessons go into a new prompt, and how they are rendered within a token budget.

Token estimate (:func:`estimate_tokens`): ``ceil(ascii_chars / 4) + non_ascii_chars``.
Four characters per token is the usual figure for English with OpenAI's BPE
vocabularies; scripts outside ASCII take about one token per character or more, so
they count one each. The estimate errs high, the safe side for a budget."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memstream.domain.events import Rating
from memstream.domain.reflection.wording import pct, snippet

__all__ = [
    "SAME_SUBJECT_LIMIT",
    "OTHER_SUBJECT_LIMIT",
    "DECISION_SNIPPET_CHARS",
    "ReflectionRecord",
    "ReflectionContext",
    "estimate_tokens",
    "select_context",
    "format_context",
    "build_context",
]

SAME_SUBJECT_LIMIT = 5
OTHER_SUBJECT_LIMIT = 3
DECISION_SNIPPET_CHARS = 280
"""Decision texts can be long reports; the context shows this many characters of each."""


@dataclass(frozen=True)
class ReflectionRecord:
    """One settled reflection as the context builder needs it (a row of the
    projection's ``reflections`` table)."""

    reflection_id: str
    decision_id: str
    subject: str
    rating: Rating
    content: str
    occurred_at: datetime
    decision_text: str = ""
    outcome_id: str = ""
    raw_return: float | None = None
    alpha: float | None = None
    correct: bool | None = None
    lesson: str | None = None
    templated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "reflection_id": self.reflection_id,
            "decision_id": self.decision_id,
            "outcome_id": self.outcome_id,
            "subject": self.subject,
            "rating": Rating(self.rating).value,
            "decision_text": self.decision_text,
            "raw_return": self.raw_return,
            "alpha": self.alpha,
            "correct": self.correct,
            "content": self.content,
            "lesson": self.lesson,
            "templated": self.templated,
            "occurred_at": self.occurred_at.isoformat(),
        }


@dataclass(frozen=True)
class ReflectionContext:
    """Past lessons formatted for a prompt.

    ``same_subject`` and ``other_subjects`` are the records actually rendered into
    ``text`` (newest first); ``omitted`` counts selected records left out because the
    budget was spent.
    """

    subject: str
    text: str
    same_subject: tuple[ReflectionRecord, ...] = ()
    other_subjects: tuple[ReflectionRecord, ...] = ()
    token_estimate: int = 0
    budget_tokens: int = 0
    omitted: int = 0
    truncated_fields: int = 0

    @property
    def empty(self) -> bool:
        return not self.same_subject and not self.other_subjects

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "text": self.text,
            "same_subject": [r.to_dict() for r in self.same_subject],
            "other_subjects": [r.to_dict() for r in self.other_subjects],
            "token_estimate": self.token_estimate,
            "budget_tokens": self.budget_tokens,
            "omitted": self.omitted,
        }


def estimate_tokens(text: str) -> int:
    """``ceil(ascii_chars / 4) + non_ascii_chars`` (see the module docstring)."""
    ascii_chars = sum(1 for ch in text if ord(ch) < 128)
    return math.ceil(ascii_chars / 4) + (len(text) - ascii_chars)


def _newest_first(records: Iterable[ReflectionRecord]) -> list[ReflectionRecord]:
    # Ties (same timestamp) break on the id so the order is total and reproducible.
    return sorted(records, key=lambda r: (r.occurred_at, r.reflection_id), reverse=True)


def select_context(
    records: Iterable[ReflectionRecord],
    subject: str,
    *,
    same_limit: int = SAME_SUBJECT_LIMIT,
    other_limit: int = OTHER_SUBJECT_LIMIT,
) -> tuple[list[ReflectionRecord], list[ReflectionRecord]]:
    """The ``same_limit`` most recent reflections on ``subject`` and the
    ``other_limit`` most recent on any other subject, each newest first. A reflection
    seen twice (same id) counts once."""
    unique: dict[str, ReflectionRecord] = {}
    for record in records:
        unique.setdefault(record.reflection_id, record)
    ordered = _newest_first(unique.values())
    same = [r for r in ordered if r.subject == subject][: max(same_limit, 0)]
    other = [r for r in ordered if r.subject != subject][: max(other_limit, 0)]
    return same, other


def _outcome_phrase(record: ReflectionRecord) -> str:
    parts = []
    if record.raw_return is not None:
        parts.append(f"return {pct(record.raw_return)}")
    if record.alpha is not None:
        parts.append(f"alpha {pct(record.alpha)}")
    verdict = {True: "right", False: "wrong", None: "unjudged"}[record.correct]
    return (", ".join(parts) + f" ({verdict})") if parts else f"({verdict})"


def _render_same(record: ReflectionRecord, *, with_decision: bool) -> str:
    head = (
        f"- {record.occurred_at.date().isoformat()} {Rating(record.rating).value.upper()} "
        f"{record.subject}: {_outcome_phrase(record)}"
    )
    lines = [head]
    if with_decision and record.decision_text.strip():
        lines.append(f"  Decision: {snippet(record.decision_text, DECISION_SNIPPET_CHARS)}")
    lines.append(f"  Reflection: {' '.join(record.content.split())}")
    return "\n".join(lines)


def _render_other(record: ReflectionRecord) -> str:
    return (
        f"- {record.occurred_at.date().isoformat()} {record.subject} "
        f"({Rating(record.rating).value}): {' '.join(record.content.split())}"
    )


def format_context(
    subject: str,
    same: Sequence[ReflectionRecord],
    other: Sequence[ReflectionRecord],
    budget_tokens: int,
) -> ReflectionContext:
    """Render the selected reflections as prompt text within ``budget_tokens``.

    Same-subject entries come first (decision, outcome and reflection each), then the
    other subjects (reflection only), each group newest first. Entries are added in
    that order while the estimate stays within the budget; a same-subject entry that
    does not fit is retried without its decision text. The first entry of a group that
    still does not fit ends that group, so an older lesson never displaces a newer one.
    A budget too small for any entry gives empty text.
    """
    budget = max(int(budget_tokens), 0)
    same_header = f"Past decisions on {subject} and what they taught (newest first):"
    other_header = "Lessons from other subjects (newest first):"
    blocks: list[str] = []
    kept_same: list[ReflectionRecord] = []
    kept_other: list[ReflectionRecord] = []
    shortened = 0

    def fits(extra: str) -> bool:
        candidate = "\n".join([*blocks, extra]) if blocks else extra
        return estimate_tokens(candidate) <= budget

    for record in same:
        header = [same_header] if not kept_same else []
        full = "\n".join([*header, _render_same(record, with_decision=True)])
        short = "\n".join([*header, _render_same(record, with_decision=False)])
        if fits(full):
            blocks.append(full)
        elif fits(short):
            blocks.append(short)
            shortened += 1
        else:
            break
        kept_same.append(record)
    for record in other:
        prefix: list[str] = []
        if not kept_other:
            prefix = ([""] if blocks else []) + [other_header]
        block = "\n".join([*prefix, _render_other(record)])
        if not fits(block):
            break
        blocks.append(block)
        kept_other.append(record)
    text = "\n".join(blocks)
    used = estimate_tokens(text) if text else 0
    omitted = (len(same) - len(kept_same)) + (len(other) - len(kept_other))
    return ReflectionContext(
        subject=subject,
        text=text,
        same_subject=tuple(kept_same),
        other_subjects=tuple(kept_other),
        token_estimate=used,
        budget_tokens=budget,
        omitted=omitted,
        truncated_fields=shortened,
    )


def build_context(
    records: Iterable[ReflectionRecord],
    subject: str,
    budget_tokens: int,
    *,
    same_limit: int = SAME_SUBJECT_LIMIT,
    other_limit: int = OTHER_SUBJECT_LIMIT,
) -> ReflectionContext:
    """:func:`select_context` then :func:`format_context`."""
    same, other = select_context(records, subject, same_limit=same_limit, other_limit=other_limit)
    return format_context(subject, same, other, budget_tokens)
