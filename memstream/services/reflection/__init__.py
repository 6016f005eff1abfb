"""The reflector: a Faust agent (``agent``) that keeps pending decisions in Faust
tables, pairs them with outcomes (from events or from ``outcomes`` providers), asks
the LLM for a lesson (``reflector``, ``runner``) and writes it (``writers``), sealed
where the space asks for it (``sealing``)."""

from __future__ import annotations

from memstream.services.reflection.agent import ReflectorHandle, register_reflector, state_topics
from memstream.services.reflection.writers import LLMReflectionWriter

__all__ = [
    "LLMReflectionWriter",
    "ReflectorHandle",
    "register_reflector",
    "state_topics",
]
