"""Rebuilding every view from offset 0 into a new table set while the worker keeps
projecting (``rebuild``): the build, then ``finish`` (compact, index, digest, verify,
swap), ``diff`` (the live and the rebuilt set compared) and ``report`` (what the run
found, as text and JSON)."""

from __future__ import annotations

from memstream.services.replay.finish import PHASE_VERIFY, ReplayError
from memstream.services.replay.rebuild import replay
from memstream.services.replay.report import PHASE_TIMES, ReplayProgress, RichProgress

__all__ = [
    "PHASE_TIMES",
    "PHASE_VERIFY",
    "ReplayError",
    "ReplayProgress",
    "RichProgress",
    "replay",
]
