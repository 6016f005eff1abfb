"""What one extraction run takes, carries and returns: the window in, the run's state
through the stages, the outcome out."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
import numpy as np

from memstream.domain.events import EventBase, MemoryAdded, MemoryLinked, MessageObserved, Scope
from memstream.domain.extraction import Candidate, Decision, DraftIssue, MemoryDraft, StageReport, Window
from memstream.domain.extraction.fallback import FallbackReason
from memstream.domain.log import LogPosition
from memstream.projections.embedders import embed_array

__all__ = ["EventSink", "ExtractionOutcome", "WindowInput"]


class EventSink(Protocol):
    """Where events go (``MemstreamProducer`` in production)."""

    async def send_many(self, events: Sequence[EventBase]) -> list[LogPosition]: ...


class Embedder(Protocol):
    model_id: str
    dim: int

    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


@dataclass(frozen=True)
class ExtractionOutcome:
    """What one run did.

    ``status``: ``extracted`` (events sent, possibly none because everything was a
    duplicate or dropped), ``nothing`` (no new turn passed the quality gate), or
    ``failed`` (nothing sent; ``kept`` lists the turns to retry). ``consumed`` lists the
    new turns this run is done with (all of them unless it failed).
    """

    status: Literal["extracted", "nothing", "failed"]
    method: Literal["llm", "heuristic"]
    consumed: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    events: tuple[EventBase, ...] = ()
    positions: tuple[LogPosition, ...] = ()
    failure: str | None = None
    fallback: str | None = None
    """The :class:`FallbackReason` when the model failed the window and its turns were
    stored by the heuristic instead (the outcome is then ``extracted``)."""
    record: tuple[Mapping[str, Any], ...] = ()
    decisions: tuple[Mapping[str, Any], ...] = ()
    llm_calls: int = 0
    embed_calls: int = 0
    correlation_id: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    @property
    def memories(self) -> tuple[MemoryAdded, ...]:
        return tuple(e for e in self.events if isinstance(e, MemoryAdded))

    @property
    def links(self) -> tuple[MemoryLinked, ...]:
        return tuple(e for e in self.events if isinstance(e, MemoryLinked))


class CountingEmbedder:
    """Counts the provider calls made on behalf of one batch of runs."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls += 1
        return self.inner.embed(texts)

    def embed_array(self, texts: Sequence[str]) -> np.ndarray:
        """float32 ``(len(texts), dim)``, through the inner embedder's own matrix form
        when it has one (:func:`memstream.projections.embedders.factory.embed_array`)."""
        self.calls += 1
        return embed_array(self.inner, texts)


@dataclass(frozen=True)
class WindowInput:
    """One window to extract: a session's new turns and its background turns."""

    scope: Scope
    session_id: str | None
    turns: Sequence[MessageObserved]
    background: Sequence[MessageObserved] = ()
    attempt: int = 1
    """Which attempt at this window this is (1 for the first)."""
    final: bool = False
    """The last attempt: any failure of the extraction call falls back to the heuristic."""
    budget_s: float | None = None
    """What is left of the window's retry budget: the model calls are cut short when
    it runs out, and the window falls back (``None``: no budget)."""
    record: tuple[Mapping[str, Any], ...] = ()
    """Entries added to the run's record (e.g. the fallback run a retry redoes)."""
    source_kids: frozenset[bytes] = frozenset()
    """The data keys the window's turns were sealed under (empty: plaintext)."""


HEURISTIC_NOTE = "no LLM configured: one episodic memory per qualifying turn"


@dataclass
class WindowRun:
    """One window's state while its batch goes through the stages; ``outcome`` is set
    as soon as the run is finished (nothing to extract, or failed)."""

    run_id: str
    window: Window
    gate_record: tuple[Mapping[str, Any], ...]
    outcome: ExtractionOutcome | None = None
    drafts: list[MemoryDraft] = field(default_factory=list)
    issues: list[DraftIssue] = field(default_factory=list)
    extraction: StageReport = field(default_factory=lambda: StageReport("heuristic", note=HEURISTIC_NOTE))
    llm_calls: int = 0
    embed_calls: int = 0
    batch_dups: list[DraftIssue] = field(default_factory=list)
    new: list[MemoryDraft] = field(default_factory=list)
    duplicates: list[tuple[MemoryDraft, str]] = field(default_factory=list)
    vectors: list[np.ndarray | None] = field(default_factory=list)
    """float32 little-endian rows (None: no vector for that memory)."""
    embed_note: str | None = None
    decisions: dict[int, Decision] = field(default_factory=dict)
    judgment: StageReport | None = None
    judged: bool = False
    events: list[EventBase] = field(default_factory=list)
    positions: list[LogPosition] = field(default_factory=list)
    record: list[dict[str, Any]] = field(default_factory=list)
    attempt: int = 1
    final: bool = False
    deadline: float | None = None
    """``time.monotonic()`` by which the model calls must be done (the retry budget)."""
    fallback: dict[str, Any] | None = None
    """The fallback's record entry once the window falls back to the heuristic."""
    fallback_reason: FallbackReason | None = None
    extra_record: tuple[Mapping[str, Any], ...] = ()
    known: list[Candidate] = field(default_factory=list)
    """The space's memories shown to the extraction call (similar to the new turns)."""
    known_links: dict[str, Any] = field(default_factory=dict)
    """Links to them the model named, by the memory's content."""
    source_kids: frozenset[bytes] = frozenset()
    """The data keys of the window's turns (:class:`WindowInput`)."""

    def budget_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    @property
    def scope(self) -> Scope:
        return self.window.scope

    @property
    def session_id(self) -> str | None:
        return self.window.session_id

    @property
    def open(self) -> bool:
        return self.outcome is None
