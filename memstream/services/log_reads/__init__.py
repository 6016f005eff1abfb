"""What the operator reads straight from the log, because the view does not
hold it: the newest dead letters (``dead_letters``), the decisions still pending in
the reflector (``pending``) and where a forget stands against the projection's
positions (``forget_progress``). Each reads a bounded tail of its topics, never a
whole topic."""

from __future__ import annotations

from memstream.services.log_reads.dead_letters import recent_dead_letters
from memstream.services.log_reads.forget_progress import (
    ForgetProgress,
    forget_positions,
    progress,
    wait_applied,
)
from memstream.services.log_reads.pending import read_pending

__all__ = [
    "ForgetProgress",
    "forget_positions",
    "progress",
    "read_pending",
    "recent_dead_letters",
    "wait_applied",
]
