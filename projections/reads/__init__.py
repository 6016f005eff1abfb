"""The view read for a caller, besides search: the lessons for an agent's next
decision (``reflections``: :func:`context_for`), a session's turns read back for the
extractor (``session_turns``) and the web console's paged reads (``console``: one
page of decisions, lessons or timeline, never a space whole). Every read starts from
the scope filter of ``memstream.projections.store``."""

from __future__ import annotations

from memstream.projections.reads.console import (
    Cursor,
    TIMELINE_KINDS,
    decisions_page,
    ledger_statuses,
    lessons_page,
    session_context,
    team_spaces,
    timeline_window,
)
from memstream.projections.reads.reflections import context_for, list_reflections
from memstream.projections.reads.session_turns import turns_before, turns_by_id

__all__ = [
    "Cursor",
    "TIMELINE_KINDS",
    "context_for",
    "decisions_page",
    "ledger_statuses",
    "lessons_page",
    "list_reflections",
    "session_context",
    "team_spaces",
    "timeline_window",
    "turns_before",
    "turns_by_id",
]
