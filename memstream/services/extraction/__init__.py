"""The extractor service: conversation turns in, memories out. ``service`` is
the ``mode`` service with its own consumer group, ``turn_buffer`` gathers a session's
turns into windows, ``extractor`` turns a window into memory events with the LLM
(``calls``, ``run``), ``candidate_recall`` and ``tables`` look up what is already
known, ``sources`` names a memory's turns, ``commits`` commits offsets only behind
what was written, and ``retry`` re-runs the extraction of dead-lettered windows."""

from __future__ import annotations

from memstream.services.extraction.calls import ask
from memstream.services.extraction.commits import consumer_group
from memstream.services.extraction.extractor import Extractor
from memstream.services.extraction.retry import find_windows, parse_since, retry_windows
from memstream.services.extraction.service import ExtractorRunner, register_extractor

__all__ = [
    "Extractor",
    "ExtractorRunner",
    "ask",
    "consumer_group",
    "find_windows",
    "parse_since",
    "register_extractor",
    "retry_windows",
]
