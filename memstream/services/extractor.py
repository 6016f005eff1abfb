"""The extraction pipeline with its I/O: turns in, ADD-only events out.

:class:`Extractor` runs one window (a session's new turns plus a few earlier ones as
background) through the steps of :mod:`memstream.domain.extraction`:

1. quality gate, window numbering;
2. ONE LLM call for scenes and memories (retried once), JSON repair, per-memory
   validation; or, with no LLM configured, the documented heuristic;
3. exact dedup by content hash within the batch and across the turns' agent's memories
   in their memory space (``LanceStore.find_hashes_in_spaces``);
4. ONE embedding call for the remaining memories;
5. candidate recall per memory, inside the memory's own space and agent: the top
   ``dedup_candidates_k`` current memories by vector (with the vector just computed,
   no second embedding call), else by full text, else none;
6. ONE batched LLM judgment for every memory that has candidates (skipped when none
   has); if it fails after its retry, every memory is stored;
7. the events, each with its provenance, sent with the producer.

:meth:`Extractor.run_windows` runs several windows as one batch: each window stays its
own run (steps 1-2 and 5-6, its own provenance and correlation id), while steps 3, 4
and 7 are shared: one exact-dedup lookup per memory space, one embedding call, one
produce. Without an LLM those shared round trips were nearly all of the cost of a
window (a LanceDB query, an embedding request and a broker acknowledgement for a
dozen turns), so the agent batches whatever it has read across sessions.

Failure rules: if the extraction call fails (timeout, HTTP error, an answer that stays
unparsable after repair, after its retry), or the memory space cannot be read, or the
events cannot be produced, the outcome is ``failed`` and lists every new turn as
*kept*: the caller (:class:`TurnBuffer`) keeps them for the next run, so a turn is
never lost and never silently skipped. Memory and link ids are content-derived, so a
run repeated after a partial failure re-sends the same ids.

:class:`TurnBuffer` is the scheduling half of the extractor agent without Kafka or
Faust: turns grouped per session, the trigger rules (enough new turns, or idle; the
agent makes every turn due at once when no LLM is configured), the
turns kept after a failure (with back-off), and the offsets that are safe to commit
(never past a turn that has not been extracted).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar

import numpy as np

from memstream.domain.access import ReadScope
from memstream.domain.events import (
    EmbeddingPayload,
    EventBase,
    MemoryAdded,
    MemoryLinked,
    MessageObserved,
    Scope,
    new_event_id,
    utcnow,
)
from memstream.domain.extraction import (
    EXTRACTION_SCHEMA,
    JUDGMENT_SCHEMA,
    Action,
    Candidate,
    Decision,
    DraftIssue,
    EmptyExtraction,
    ExtractionParse,
    MemoryDraft,
    StageReport,
    Window,
    build_events,
    build_window,
    dedupe_batch,
    heuristic_drafts,
    parse_extraction,
    parse_judgment,
    plan_judgment,
    record_items,
    render_judgment,
    render_turns,
    split_known,
    store_all,
)
from memstream.domain.fallback import FALLBACK_STATUS, FallbackReason, fallback_reason, fallback_record
from memstream.domain.known import decide_by_links, pick_known, read_known_links, render_known, uncertain
from memstream.domain.log import LogPosition
from memstream.domain.prompts import Prompt, PromptError, PromptLibrary
from memstream.domain.repair import Repaired, repair_json
from memstream.domain.resume_marks import ResumeMark, encode_mark
from memstream.llm import ChatModel, LLMCall, LLMError, call_with_retry
from memstream.metrics import record_extraction_fallback, record_extraction_repairs
from memstream.projections.embedder import embed_array
from memstream.projections.schema import MEMORIES
from memstream.projections.search import RESULT_COLUMNS, SearchFilters, build_where, text_search
from memstream.projections.store import VECTOR_REFINE_FACTOR
from memstream.services.shard_routing import store_for
from memstream.settings import Settings

__all__ = [
    "EventSink",
    "CandidateRecall",
    "ExtractionOutcome",
    "Extractor",
    "WindowInput",
    "store_recall",
    "SessionKey",
    "WindowJob",
    "TurnBuffer",
    "RECENT_IDS",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class EventSink(Protocol):
    """Where events go (``MemstreamProducer`` in production)."""

    async def send_many(self, events: Sequence[EventBase]) -> list[LogPosition]: ...


class _Embedder(Protocol):
    model_id: str
    dim: int

    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


CandidateRecall = Callable[[ReadScope, Sequence[str], Sequence["Sequence[float] | None"], int], list[list[Candidate]]]
"""``(scope, contents, vectors (None where missing), k) -> candidates per content``;
synchronous (run off the event loop)."""


def store_recall(store: Any, embedder: Any) -> CandidateRecall:
    """Candidate recall from the LanceDB projection, for a whole window at once: the top
    ``k`` *current* memories (not superseded, not duplicates) the read scope sees (team,
    user and, pinned, agent: the isolation prefilter of
    :func:`memstream.projections.search.build_where`)
    for each content, by cosine similarity of its vector (one multi-vector query for
    the window), else (no vector, the vector query failed or found nothing) by BM25 full
    text, else none."""
    current = SearchFilters(include_superseded=False)

    def candidate(row: Mapping[str, Any], score: float | None) -> Candidate:
        return Candidate(
            memory_id=row["memory_id"],
            content=row["content"],
            memory_type=row.get("memory_type"),
            score=score,
            when=row.get("timestamp") or row.get("created_at"),
        )

    def by_vector(scope: ReadScope, vectors: list[list[float]], k: int) -> list[list[Candidate]]:
        query = (
            store_for(store, scope).table(MEMORIES)
            .search(vectors if len(vectors) > 1 else vectors[0], vector_column_name="vector")
            .distance_type("cosine")
            .where(build_where(scope, current), prefilter=True)
            .select([*RESULT_COLUMNS, "_distance"])
            .limit(k)
        )
        if store.has_vector_index():
            query = query.refine_factor(VECTOR_REFINE_FACTOR)
        out: list[list[Candidate]] = [[] for _ in vectors]
        for row in query.to_arrow().to_pylist():
            index = int(row.get("query_index") or 0)
            out[index].append(candidate(row, 1.0 - float(row["_distance"])))
        return out

    def recall(
        scope: ReadScope, contents: Sequence[str], vectors: Sequence[Sequence[float] | None], k: int
    ) -> list[list[Candidate]]:
        found: list[list[Candidate]] = [[] for _ in contents]
        with_vector = [i for i, v in enumerate(vectors) if v is not None]
        if with_vector:
            try:
                hits = by_vector(scope, [list(v) for v in vectors if v is not None], k)
                for i, cands in zip(with_vector, hits):
                    found[i] = cands[:k]
            except Exception as exc:  # noqa: BLE001 - recall degrades, never fails a run
                log.warning("vector recall failed, using full text: %s", exc)
        for i, content in enumerate(contents):
            if found[i]:
                continue
            try:
                results = text_search(store_for(store, scope), embedder, scope, content, k, current)
            except Exception as exc:  # noqa: BLE001
                log.warning("full-text recall failed, judging without candidates: %s", exc)
                continue
            found[i] = [
                Candidate(r.memory_id, r.content, r.memory_type, r.score, r.timestamp or r.created_at)
                for r in results[:k]
            ]
        return found

    return recall


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


class _CountingEmbedder:
    """Counts the provider calls made on behalf of one batch of runs."""

    def __init__(self, inner: _Embedder) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls += 1
        return self.inner.embed(texts)

    def embed_array(self, texts: Sequence[str]) -> np.ndarray:
        """float32 ``(len(texts), dim)``, through the inner embedder's own matrix form
        when it has one (:func:`memstream.projections.embedder.embed_array`)."""
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


_HEURISTIC_NOTE = "no LLM configured: one episodic memory per qualifying turn"


@dataclass
class _Run:
    """One window's state while its batch goes through the stages; ``outcome`` is set
    as soon as the run is finished (nothing to extract, or failed)."""

    run_id: str
    window: Window
    gate_record: tuple[Mapping[str, Any], ...]
    outcome: ExtractionOutcome | None = None
    drafts: list[MemoryDraft] = field(default_factory=list)
    issues: list[DraftIssue] = field(default_factory=list)
    extraction: StageReport = field(default_factory=lambda: StageReport("heuristic", note=_HEURISTIC_NOTE))
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


class Extractor:
    """Extraction runs, one per window, in batches (see the module docstring).

    ``llm`` is ``None`` for the no-LLM heuristic; ``embedder`` ``None`` means events
    carry no embedding (the projector embeds) and recall is by full text; ``store``
    ``None`` means an empty memory space (no dedup against history, no candidates);
    ``recall`` overrides the candidate recall (default: :func:`store_recall`).

    :meth:`run_windows` takes several windows at once: each window is still its own
    run (its own drafts, decisions, provenance and correlation id: the events are the
    ones a lone run would make), but the batch shares its I/O: one exact-dedup lookup
    per memory space, one embedding call, one produce of all the events. That is what
    makes the heuristic fast on a bulk import (a LanceDB query, an HTTP round trip and
    a broker round trip per window dominated it); with an LLM each window's calls run
    concurrently.
    """

    def __init__(
        self,
        settings: Settings,
        llm: ChatModel | None,
        embedder: _Embedder | None,
        store: Any | None,
        producer: EventSink,
        *,
        prompts: PromptLibrary | None = None,
        recall: CandidateRecall | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.settings = settings
        self.llm = llm
        self.embedder = embedder
        self.store = store
        self.producer = producer
        self.prompts = prompts or PromptLibrary(settings.prompts_dir)
        self.clock = clock
        if recall is not None:
            self._recall: CandidateRecall | None = recall
        elif store is not None:
            self._recall = store_recall(store, embedder)
        else:
            self._recall = None

    @property
    def method(self) -> Literal["llm", "heuristic"]:
        return "llm" if self.llm is not None else "heuristic"

    async def run_window(
        self,
        scope: Scope,
        session_id: str | None,
        turns: Sequence[MessageObserved],
        background: Sequence[MessageObserved] = (),
    ) -> ExtractionOutcome:
        """Extract memories from ``turns`` (new) with ``background`` as context."""
        (outcome,) = await self.run_windows([WindowInput(scope, session_id, turns, background)])
        return outcome

    async def run_windows(
        self, windows: Sequence[WindowInput], *, producing: Callable[[], None] | None = None
    ) -> list[ExtractionOutcome]:
        """Extract every window; one outcome per window, in order. A failure fails the
        runs it concerns (a memory space that cannot be read: its windows; the produce:
        every window that had events), never the others.

        ``producing`` is called once the extraction's own work is done and only the
        produce (mostly waiting for the broker's acknowledgements) is left: a caller
        that bounds how many extractions run at once can start the next one then."""
        if not windows:
            return []
        heuristic = self.llm is None
        # Pure CPU (gate, heuristic drafts, in-batch dedup) off the event loop: a bulk
        # batch of windows takes tens of milliseconds, which the loop's other work
        # (Kafka I/O, the projector's feed in the same worker) should not wait for.
        runs = await asyncio.to_thread(self._open_runs, windows, heuristic)
        if not heuristic:
            await asyncio.gather(*(self._llm_drafts(run) for run in runs if run.open))
            for run in runs:
                if run.open:
                    run.drafts, run.batch_dups = dedupe_batch(run.drafts)
        await self._exact_dedup(runs)
        await self._embed(runs)
        if not heuristic and self._recall is not None:
            await asyncio.gather(
                *(self._candidates_and_judgment(run) for run in runs if run.open and run.new and run.fallback is None)
            )
        await asyncio.to_thread(self._build_events, runs)
        if producing is not None:
            producing()
        await self._produce(runs)
        return [self._finish(run) for run in runs]

    # -- stages --------------------------------------------------------------------------
    def _open_runs(self, windows: Sequence[WindowInput], heuristic: bool) -> list[_Run]:
        runs: list[_Run] = []
        for w in windows:
            window = build_window(
                w.scope,
                w.session_id,
                w.turns,
                w.background,
                max_background=self.settings.extract_background_turns,
            )
            run = _Run("x-" + new_event_id().hex, window, tuple(record_items(window, (), ())))
            run.attempt, run.final, run.extra_record = w.attempt, w.final, tuple(w.record)
            if w.budget_s is not None:
                run.deadline = time.monotonic() + w.budget_s
            if not window.new_turns:
                log.debug("extraction %s: no qualifying turn among %d", run.run_id, len(window.new_message_ids))
                run.outcome = ExtractionOutcome(
                    "nothing",
                    self.method,
                    consumed=window.new_message_ids,
                    record=run.gate_record,
                    correlation_id=run.run_id,
                )
            elif heuristic:
                run.drafts, run.batch_dups = dedupe_batch(heuristic_drafts(window))
            runs.append(run)
        return runs

    def _fail(self, run: _Run, reason: str) -> None:
        w = run.window
        log.warning(
            "extraction %s failed for %s session %s (%d turns kept): %s",
            run.run_id, w.scope.space, w.session_id, len(w.new_message_ids), reason,
        )
        run.outcome = ExtractionOutcome(
            "failed",
            self.method,
            kept=w.new_message_ids,
            failure=reason,
            record=run.gate_record,
            llm_calls=run.llm_calls,
            embed_calls=run.embed_calls,
            correlation_id=run.run_id,
        )

    async def _llm_drafts(self, run: _Run) -> None:
        """ONE extraction call for the window (retried per ``llm_max_retries``)."""
        assert self.llm is not None
        window = run.window
        run.known = await self._known_memories(run)
        try:
            prompt = self.prompts.get("extraction", window.scope)
            background_text, new_text = render_turns(window)
            system, user = prompt.render(
                {
                    "background": background_text,
                    "turns": new_text,
                    "known": render_known(run.known),
                    "max_memories": self.settings.extract_max_memories,
                }
            )
        except PromptError as exc:
            self._fail(run, f"prompt: {exc}")
            return
        max_memories = self.settings.extract_max_memories
        left = run.budget_left()
        if left is not None and left <= 0:
            self._fall_back(run, FallbackReason.budget, "the retry budget was spent before this attempt")
            return
        try:
            async with asyncio.timeout(left):
                call = await self._ask(
                    system,
                    user,
                    EXTRACTION_SCHEMA,
                    "memstream_extraction",
                    lambda value: _counted(parse_extraction, value, window, max_memories),
                )
        except TimeoutError:
            budget = self.settings.extract_retry_budget_s
            self._fall_back(run, FallbackReason.budget, f"the retry budget ({budget:g} s) ran out during the call")
            return
        except LLMError as exc:
            run.llm_calls = exc.attempts
            error = f"extraction call: {exc.kind} after {exc.attempts} attempt(s): " + " | ".join(exc.errors)
            reason = fallback_reason(exc.kind, exc.status, " | ".join(exc.errors))
            if reason is None and run.final:
                spent = run.budget_left() == 0.0
                reason = FallbackReason.budget if spent else FallbackReason.attempts
            if reason is None:
                self._fail(run, error)
            else:
                self._fall_back(run, reason, error)
            return
        run.llm_calls += call.attempts
        repaired, parsed = call.value
        run.known_links = read_known_links(repaired.value, run.known)
        run.drafts = list(parsed.drafts)
        run.issues = list(parsed.issues)
        run.extraction = _llm_stage(prompt, call, repaired)

    async def _known_memories(self, run: _Run) -> list[Candidate]:
        """The memories of the turns' agent closest to the window's new turns, for the
        extraction call: the judgment's candidate recall (same scope), by the turns' vectors (one
        embedding call) else by full text; none if recall is off or fails."""
        limit = self.settings.extract_known_memories
        turns = run.window.new_turns
        if not limit or self._recall is None or not turns:
            return []
        texts = [t.text for t in turns]
        vectors: list[Sequence[float] | None] = [None] * len(texts)
        if self.embedder is not None:
            try:
                got = await asyncio.to_thread(embed_array, self.embedder, texts)
                vectors = [row.tolist() for row in got]
                run.embed_calls += 1
            except Exception as exc:  # noqa: BLE001 - full text instead
                log.warning("extraction %s: known memories by full text (%s)", run.run_id, exc)
        try:
            # pinned to the turns' agent: other agents' memories never reach the prompt
            found = await asyncio.to_thread(self._recall, ReadScope.pinned(run.scope), texts, vectors, limit)
        except Exception as exc:  # noqa: BLE001 - the call goes without them
            log.warning("extraction %s: known memories not recalled: %s", run.run_id, exc)
            return []
        return pick_known(found, limit)

    def _fall_back(self, run: _Run, reason: FallbackReason, error: str) -> None:
        """Store the window's turns as the heuristic would, recording why (the
        provenance status ``fallback`` and the record entry that lets
        ``memstream extract --retry-failed`` redo the window later)."""
        w = run.window
        log.warning(
            "extraction %s for %s session %s falls back to the heuristic after attempt %d (%s): %s",
            run.run_id, w.scope.space, w.session_id, run.attempt, reason.value, error,
        )
        run.fallback_reason = reason
        run.fallback = fallback_record(
            reason,
            error,
            run_id=run.run_id,
            attempts=run.attempt,
            window=w.new_message_ids,
            background=[t.message_id for t in w.background_turns],
        )
        run.drafts = heuristic_drafts(w)
        run.extraction = StageReport(
            "heuristic", status=FALLBACK_STATUS, note=f"fallback ({reason.value}): {' '.join(error.split())}"[:1000]
        )
        record_extraction_fallback(reason.value)

    async def _exact_dedup(self, runs: Sequence[_Run]) -> None:
        """Exact dedup across each memory space: one lookup for the whole batch.

        Each run's lookup is pinned to its turns' agent (``ReadScope.pinned``): another
        agent's memory of the same text is neither a duplicate nor a sign that the text
        exists. Spaces are keyed by their parts, never by the ``team/user`` string,
        which two spaces can share (ids may hold ``/``). If the batch's lookup fails,
        each space is looked up alone, so a space that cannot be read fails only its
        own windows."""
        by_space: dict[ReadScope, list[_Run]] = {}
        for run in runs:
            if run.open and run.drafts and self.store is not None:
                by_space.setdefault(ReadScope.pinned(run.scope), []).append(run)
        known: dict[ReadScope, Mapping[str, str] | BaseException] = {}
        if by_space:
            store = self.store
            assert store is not None
            wanted = {space: [d.content_hash for r in members for d in r.drafts] for space, members in by_space.items()}
            try:
                found_all = await asyncio.to_thread(store.find_hashes_in_spaces, wanted)
            except Exception as exc:  # noqa: BLE001 - retried space by space below
                log.warning("exact-dedup lookup of %d memory spaces failed (%s); one space at a time", len(wanted), exc)

                def lookup(space: ReadScope) -> Mapping[str, str]:
                    return dict(store.find_hashes(space, wanted[space]))

                results = await asyncio.gather(
                    *(asyncio.to_thread(lookup, space) for space in by_space), return_exceptions=True
                )
                for space, result in zip(by_space, results):
                    if isinstance(result, BaseException) and not isinstance(result, Exception):
                        raise result  # cancellation and the like are not a lookup failure
                    known[space] = result
            else:
                known = {space: found_all.get(space, {}) for space in by_space}
        for run in runs:
            if not run.open:
                continue
            found = known.get(ReadScope.pinned(run.scope), {})
            if isinstance(found, BaseException):
                problem = f"memory space unreadable: {type(found).__name__}: {found}"
                if not (run.final or run.fallback is not None):
                    self._fail(run, problem)
                    continue
                # The last attempt stores without the cross-space dedup: memory ids
                # derive from the content, so a repeat is absorbed by the projection.
                run.extraction = _with_note(run.extraction, problem + "; stored without exact dedup")
                found = {}
            run.new, run.duplicates = split_known(run.drafts, found)
            run.vectors = [None] * len(run.new)

    async def _embed(self, runs: Sequence[_Run]) -> None:
        """ONE embedding call for every new memory of the batch (the provider call is
        counted on the first run that embeds). If it fails, the events go without
        vectors and the projector embeds them."""
        todo = [run for run in runs if run.open and run.new]
        if not todo or self.embedder is None:
            return
        embedder = _CountingEmbedder(self.embedder)
        texts = [d.content for run in todo for d in run.new]
        try:
            got = await asyncio.to_thread(embedder.embed_array, texts)
            if got.shape != (len(texts), embedder.dim):
                raise ValueError(f"{got.shape[0]} vectors for {len(texts)} texts")
        except Exception as exc:  # noqa: BLE001 - events go without vectors
            note = f"embedding failed ({type(exc).__name__}: {exc}); the projector embeds"
            log.warning("extraction %s: %s", ", ".join(run.run_id for run in todo), note)
            for run in todo:
                run.embed_note = note
        else:
            got = np.ascontiguousarray(got, dtype="<f4")
            start = 0
            for run in todo:
                run.vectors = list(got[start : start + len(run.new)])
                start += len(run.new)
        todo[0].embed_calls += embedder.calls

    async def _candidates_and_judgment(self, run: _Run) -> None:
        """Candidate recall, then ONE batched judgment for the window's new memories."""
        assert self._recall is not None
        k = self.settings.dedup_candidates_k
        contents = [d.content for d in run.new]
        vectors: list[Sequence[float] | None] = [None if v is None else v.tolist() for v in run.vectors]
        try:
            # pinned to the turns' agent: other agents' memories never reach the judgment prompt
            candidates = await asyncio.to_thread(self._recall, ReadScope.pinned(run.scope), contents, vectors, k)
        except Exception as exc:  # noqa: BLE001 - recall degrades to "no candidates"
            log.warning("extraction %s: candidate recall failed, storing: %s", run.run_id, exc)
            candidates = [[] for _ in run.new]
        decided = decide_by_links(run.new, run.known_links)
        left = uncertain(candidates, run.known, decided)
        run.decisions, run.judgment, calls = await self._judge(run.scope, run.new, left, run.budget_left())
        for i, found in enumerate(candidates):
            if found and not left[i] and i not in decided:
                run.decisions[i] = Decision(
                    i,
                    Action.store,
                    reason="new: the extraction call saw its closest memory among the known ones and named no link",
                    candidates=tuple(c.memory_id for c in found),
                )
        run.decisions.update(decided)
        run.judged = True
        run.llm_calls += calls

    def _payloads(self, run: _Run) -> list[EmbeddingPayload | None]:
        """The vectors as event payloads: base64 of the little-endian float32 row (what
        :meth:`EmbeddingPayload.from_vector` makes), straight from the matrix's bytes.

        Valid by construction, which ``build_events`` relies on (it does not validate
        them again): each row is ``dim`` finite float32 values (a row that is not goes
        without a vector, and the projector embeds that memory itself), and the first
        payload of each model and dimension is validated by the model, so the model
        name and the dimension are checked too."""
        payloads: list[EmbeddingPayload | None] = []
        model = self.embedder.model_id if self.embedder is not None else None
        valid: dict[int, bool] = {}  # per dimension: did the model accept its first payload?
        for vec in run.vectors:
            if vec is None or model is None or vec.ndim != 1 or not np.isfinite(vec).all():
                payloads.append(None)
                continue
            dim = int(vec.shape[0])
            if valid.get(dim) is False:
                payloads.append(None)
                continue
            data = base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode("ascii")
            if valid.get(dim):
                payloads.append(EmbeddingPayload.model_construct(model=model, dim=dim, data=data))
                continue
            try:
                payloads.append(EmbeddingPayload(model=model, dim=dim, data=data))
                valid[dim] = True
            except ValueError as exc:  # e.g. a model name the event model refuses
                log.warning("extraction %s: vectors of %r go without (%s); the projector embeds", run.run_id, model, exc)
                payloads.append(None)
                valid[dim] = False
        return payloads

    def _build_events(self, runs: Sequence[_Run]) -> None:
        recorded_at = self.clock()
        for run in runs:
            if not run.open:
                continue
            if not run.judged:
                if self.llm is None or run.fallback is not None:
                    reason = "heuristic: no judgment"
                else:
                    reason = "no similar memories to judge against"
                run.decisions = store_all(len(run.new), reason)
            extraction = _with_note(run.extraction, run.embed_note) if run.embed_note else run.extraction
            record = record_items(run.window, [*run.issues, *run.batch_dups], run.duplicates)
            if run.fallback is not None:
                record.insert(0, run.fallback)
            record[:0] = [dict(entry) for entry in run.extra_record]
            try:
                built = build_events(
                    scope=run.scope,
                    session_id=run.session_id,
                    drafts=run.new,
                    decisions=run.decisions,
                    embeddings=self._payloads(run),
                    extraction=extraction,
                    judgment=run.judgment,
                    input_refs=run.window.input_refs,
                    batch_record=record,
                    recorded_at=recorded_at,
                    correlation_id=run.run_id,
                    own_refs=self.llm is None or run.fallback is not None,
                )
            except ValueError as exc:
                self._fail(run, f"events could not be built: {exc}")
                continue
            run.events = list(built.events)
            run.record = record + list(built.rejected)

    async def _produce(self, runs: Sequence[_Run]) -> None:
        """ONE produce of every event of the batch, in run order; if it fails, every run
        that had events fails (its turns are kept; a repeat sends the same ids)."""
        sending = [run for run in runs if run.open and run.events]
        if not sending:
            return
        try:
            positions = list(await self.producer.send_many([e for run in sending for e in run.events]))
        except Exception as exc:  # noqa: BLE001 - the broker is unavailable: retry later
            for run in sending:
                self._fail(run, f"events not produced: {type(exc).__name__}: {exc}")
            return
        start = 0
        for run in sending:
            run.positions = positions[start : start + len(run.events)]
            start += len(run.events)

    def _finish(self, run: _Run) -> ExtractionOutcome:
        if run.outcome is not None:
            return run.outcome
        window = run.window
        decision_dicts = tuple(
            {"memory": run.new[i].content[:200], **run.decisions[i].as_dict()} for i in sorted(run.decisions)
        )
        log.info(
            "extraction %s (%s) %s session %s: %d turns -> %d memories, %d links, %d duplicates, %d dropped",
            run.run_id, self.method, window.scope.space, window.session_id, len(window.new_message_ids),
            sum(isinstance(e, MemoryAdded) for e in run.events),
            sum(isinstance(e, MemoryLinked) for e in run.events),
            len(run.duplicates) + len(run.batch_dups),
            sum(d.action is Action.drop for d in run.decisions.values()),
        )
        return ExtractionOutcome(
            "extracted",
            self.method,
            consumed=window.new_message_ids,
            events=tuple(run.events),
            positions=tuple(run.positions),
            record=tuple(run.record),
            decisions=decision_dicts,
            llm_calls=run.llm_calls,
            embed_calls=run.embed_calls,
            correlation_id=run.run_id,
            fallback=run.fallback_reason.value if run.fallback_reason is not None else None,
        )

    async def _ask(
        self,
        system: str,
        user: str,
        schema: Mapping[str, Any],
        schema_name: str,
        interpret: Callable[[Any], _T],
    ) -> LLMCall[tuple[Repaired, _T]]:
        """One structured LLM call (extraction or judgment): the answer's JSON repaired,
        then read by ``interpret``; retried per ``llm_max_retries`` (raises
        :class:`LLMError` when every attempt failed)."""
        assert self.llm is not None

        def parse(text: str) -> tuple[Repaired, _T]:
            repaired = repair_json(text)
            return repaired, interpret(repaired.value)

        return await call_with_retry(
            self.llm,
            system,
            user,
            parse=parse,
            schema=schema,
            schema_name=schema_name,
            retries=self.settings.llm_max_retries,
        )

    async def _judge(
        self,
        scope: Scope,
        drafts: Sequence[MemoryDraft],
        candidates: Sequence[Sequence[Candidate]],
        budget_s: float | None = None,
    ) -> tuple[dict[int, Decision], StageReport | None, int]:
        """One batched judgment, cut short when ``budget_s`` runs out; every failure
        path stores all drafts."""
        assert self.llm is not None
        plan = plan_judgment(drafts, candidates)
        if plan.empty:
            return store_all(len(drafts), "no similar memories to judge against"), None, 0
        try:
            prompt = self.prompts.get("judgment", scope)
            system, user = prompt.render({"items": render_judgment(plan, drafts)})
        except PromptError as exc:
            reason = f"judgment prompt unusable ({exc}): stored all"
            return store_all(len(drafts), reason, candidates=candidates), StageReport(
                "llm", status="failed", note=reason
            ), 0

        try:
            async with asyncio.timeout(budget_s):
                call = await self._ask(
                    system,
                    user,
                    JUDGMENT_SCHEMA,
                    "memstream_judgment",
                    lambda value: parse_judgment(value, plan, len(drafts)),
                )
        except TimeoutError:
            reason = "judgment cut short by the retry budget: stored all"
            return store_all(len(drafts), reason, candidates=candidates), StageReport(
                "llm", status="failed", **prompt.ref(), model=self.llm.model, note=reason
            ), 1
        except LLMError as exc:
            reason = f"judgment failed ({exc.kind} after {exc.attempts} attempt(s)): stored all"
            log.warning("%s: %s", reason, " | ".join(exc.errors))
            stage = StageReport(
                "llm",
                status="failed",
                **prompt.ref(),
                model=self.llm.model,
                latency_ms=exc.latency_ms,
                token_usage=dict(exc.usage),
                note=reason + ": " + " | ".join(exc.errors),
            )
            return store_all(len(drafts), reason, candidates=candidates), stage, exc.attempts
        repaired, decisions = call.value
        return decisions, _llm_stage(prompt, call, repaired), call.attempts


def _counted(
    parse: Callable[..., ExtractionParse], value: Any, window: Window, max_memories: int
) -> ExtractionParse:
    """``parse`` with the answer's weak-output repairs counted in the metrics, whether
    memories are left or not (:class:`EmptyExtraction` carries its counts)."""
    try:
        parsed = parse(value, window, max_memories=max_memories)
    except EmptyExtraction as exc:
        _record_repairs(exc.parse)
        raise
    _record_repairs(parsed)
    return parsed


def _record_repairs(parsed: ExtractionParse) -> None:
    record_extraction_repairs(
        type_repairs=parsed.type_repairs,
        invented_ids_dropped=parsed.invented_ids_dropped,
        hallucination_suspects=parsed.hallucination_suspects,
    )


def _llm_stage(prompt: Prompt, call: LLMCall[Any], repaired: Repaired) -> StageReport:
    """The provenance of one successful LLM stage (extraction or judgment): prompt,
    model, latency, usage, and a note on what had to be repaired or retried."""
    notes = []
    if repaired.repairs:
        notes.append("json repaired: " + ", ".join(repaired.repairs))
    if call.errors:
        notes.append("retried after: " + " | ".join(call.errors))
    return StageReport(
        "llm",
        status="repaired" if repaired.repairs else "ok",
        **prompt.ref(),
        model=call.result.model,
        latency_ms=call.latency_ms,
        token_usage=dict(call.usage),
        note="; ".join(notes) or None,
    )


def _with_note(stage: StageReport, note: str) -> StageReport:
    joined = f"{stage.note}; {note}" if stage.note else note
    return replace(stage, note=joined)


# ==========================================================================================
# Scheduling: sessions, triggers, kept turns, safe offsets
# ==========================================================================================

RECENT_IDS = 1_000
"""Turn ids remembered per session after extraction, to drop a turn sent twice."""

SessionKey = tuple[str, str, str, str]
"""``(team_id, user_id, agent_id, session_id or "")``: one conversation."""


@dataclass
class _Pending:
    message: MessageObserved
    position: LogPosition
    arrived: float


@dataclass
class _Session:
    key: SessionKey
    scope: Scope
    session_id: str | None
    pending: list[_Pending] = field(default_factory=list)
    history: deque[MessageObserved] = field(default_factory=deque)
    last_seen: float = 0.0
    in_flight: bool = False
    failures: int = 0
    retry_at: float = 0.0
    last_failure: str | None = None
    first_try: float | None = None
    """When the window now at the head of ``pending`` was first attempted."""
    history_loaded: bool = False
    """Whether the turns before this buffer first saw the session were read from the
    projection into ``history`` (see :meth:`TurnBuffer.load_history`)."""
    pending_ids: set[str] = field(default_factory=set)
    recent_ids: dict[str, None] = field(default_factory=dict)


@dataclass(frozen=True)
class WindowJob:
    """One scheduled extraction: the session, its new turns (with their log positions)
    and the background turns. ``generation`` ties it to the partition assignment it was
    made under (a job of a revoked partition is not completed into the buffer)."""

    key: SessionKey
    scope: Scope
    session_id: str | None
    turns: tuple[MessageObserved, ...]
    positions: tuple[LogPosition, ...]
    background: tuple[MessageObserved, ...]
    generation: int
    trigger: Literal["turns", "idle", "flush"]
    attempt: int = 1
    final: bool = False
    """The last attempt (``max_attempts`` reached or the budget spent): the extractor
    falls back to the heuristic rather than fail."""
    budget_s: float | None = None
    """What is left of the window's retry budget."""
    load_history: bool = False
    """The session's earlier turns are not in memory yet (its first window since this
    buffer saw it): the caller may read them from the projection."""


class TurnBuffer:
    """Turns waiting for extraction, per session, with the trigger rules.

    A session is due when it has ``min_new`` pending turns, or when it has any and no
    new turn arrived for ``idle_seconds``. A job takes at most ``max_new`` of the oldest
    pending turns plus up to ``max_background`` of the session's latest extracted turns.
    One job per session at a time. After a failed job its turns stay pending and the
    session waits ``backoff(failures)`` seconds before it is due again, but never past
    the window's retry budget (``retry_budget_s`` from its first attempt): the job
    that reaches ``max_attempts`` or the end of the budget is ``final`` (the extractor
    then stores the turns by its fallback instead of failing), so a failing window
    holds its partition's commit for at most about that budget.

    :meth:`safe_offsets` gives, per partition, the offset Kafka may commit: the lowest
    offset of any pending (or in-flight) turn, or one past the last record seen when
    nothing is pending. A restart therefore re-reads every turn not yet extracted.
    ``clock`` is monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        *,
        min_new: int,
        idle_seconds: float,
        max_new: int,
        max_background: int,
        clock: Callable[[], float] = time.monotonic,
        backoff: Callable[[int], float] | None = None,
        max_attempts: int | None = None,
        retry_budget_s: float | None = None,
    ) -> None:
        if min_new < 1 or max_new < 1:
            raise ValueError("min_new and max_new must be at least 1")
        self.min_new = min(min_new, max_new)
        self.idle_seconds = idle_seconds
        self.max_new = max_new
        self.max_background = max_background
        self.clock = clock
        self.backoff = backoff or (lambda failures: float(min(60.0, 2.0 ** min(failures, 6))))
        self.max_attempts = max_attempts
        self.retry_budget_s = retry_budget_s
        self.forget_after = max(3600.0, 10 * idle_seconds)
        """A session with nothing pending and no turn for this long is forgotten."""
        self.generation = 0
        self._sessions: dict[SessionKey, _Session] = {}
        self._seen: dict[tuple[str, int], int] = {}
        self._resume: dict[tuple[str, int], ResumeMark] = {}

    # -- input -----------------------------------------------------------------------------
    @staticmethod
    def key_of(message: MessageObserved) -> SessionKey:
        s = message.scope
        return (s.team_id, s.user_id, s.agent_id, message.session_id or "")

    def observe(self, position: LogPosition) -> None:
        """Note a record that carries no turn (a dead letter, another event type)."""
        tp = (position.topic, position.partition)
        self._seen[tp] = max(self._seen.get(tp, 0), position.offset + 1)

    def add(self, message: MessageObserved, position: LogPosition) -> bool:
        """Buffer one turn; ``False`` when this turn id is already pending or was among
        the session's last :data:`RECENT_IDS` extracted turns (a producer retry sent it
        twice), in which case it is only observed."""
        self.observe(position)
        key = self.key_of(message)
        session = self._sessions.get(key)
        if session is None:
            session = _Session(
                key,
                message.scope,
                message.session_id,
                history=deque(maxlen=max(self.max_background, 1)),
            )
            self._sessions[key] = session
        mid = message.message_id
        if mid in session.pending_ids or mid in session.recent_ids:
            return False
        mark = self._resume.get((position.topic, position.partition))
        if mark is not None and mark.done(position.offset):
            self._remember(session, message)  # extracted before a restart: background
            return False
        now = self.clock()
        session.pending.append(_Pending(message, position, now))
        session.pending_ids.add(mid)
        session.last_seen = now
        return True

    # -- scheduling --------------------------------------------------------------------------
    @property
    def pending_count(self) -> int:
        return sum(len(s.pending) for s in self._sessions.values())

    def sessions(self) -> int:
        return len(self._sessions)

    def due(self, *, flush: bool = False, limit: int | None = None, max_turns: int | None = None) -> list[WindowJob]:
        """Jobs for the sessions that should extract now (marks them in flight), at most
        ``limit`` of them, the longest-waiting first; with ``max_turns``, no further job
        once the jobs taken hold that many new turns (the first is always taken).
        ``flush`` makes every session with pending turns due (shutdown, tests)."""
        now = self.clock()
        jobs: list[WindowJob] = []
        if limit is not None and limit <= 0:
            return jobs
        order = sorted(
            self._sessions.items(),
            key=lambda kv: kv[1].pending[0].arrived if kv[1].pending else 0.0,
        )
        taken = 0
        for key, session in order:
            if limit is not None and len(jobs) >= limit:
                break
            if max_turns is not None and taken >= max_turns:
                break
            if not session.pending and not session.in_flight:
                if now - session.last_seen >= self.forget_after:
                    del self._sessions[key]  # a finished conversation: free its history
                continue
            if session.in_flight:
                continue
            if not flush and now < session.retry_at:
                continue
            trigger: Literal["turns", "idle", "flush"]
            if len(session.pending) >= self.min_new:
                trigger = "turns"
            elif now - session.last_seen >= self.idle_seconds:
                trigger = "idle"
            elif flush:
                trigger = "flush"
            else:
                continue
            take = session.pending[: self.max_new]
            background = tuple(session.history)[-self.max_background :] if self.max_background else ()
            session.in_flight = True
            taken += len(take)
            if session.first_try is None:
                session.first_try = now
            budget = None
            if self.retry_budget_s is not None:
                budget = max(0.0, session.first_try + self.retry_budget_s - now)
            attempt = session.failures + 1
            final = (self.max_attempts is not None and attempt >= self.max_attempts) or budget == 0.0
            jobs.append(
                WindowJob(
                    key=session.key,
                    scope=session.scope,
                    session_id=session.session_id,
                    turns=tuple(p.message for p in take),
                    positions=tuple(p.position for p in take),
                    background=background,
                    generation=self.generation,
                    trigger=trigger,
                    attempt=attempt,
                    final=final,
                    budget_s=budget,
                    load_history=not session.history_loaded,
                )
            )
        return jobs

    def complete(self, job: WindowJob, outcome: ExtractionOutcome) -> None:
        """Apply a finished job: consumed turns leave the buffer (and become background),
        kept turns stay pending; a failure schedules the session's retry."""
        session = self._sessions.get(job.key)
        if job.generation != self.generation or session is None:
            return  # the partition was revoked meanwhile: the new owner re-reads the turns
        session.in_flight = False
        if not outcome.ok:
            session.failures += 1
            session.last_failure = outcome.failure
            session.retry_at = self.clock() + self.backoff(session.failures)
            if self.retry_budget_s is not None and session.first_try is not None:
                session.retry_at = min(session.retry_at, session.first_try + self.retry_budget_s)
            return
        session.first_try = None
        session.failures = 0
        session.last_failure = None
        session.retry_at = 0.0
        done = set(outcome.consumed)
        remaining: list[_Pending] = []
        for p in session.pending:
            mid = p.message.message_id
            if mid in done:
                session.pending_ids.discard(mid)
                self._remember(session, p.message)
            else:
                remaining.append(p)
        session.pending = remaining
        # A session's pending list may receive turns while its job runs: those stay.

    @staticmethod
    def _remember(session: _Session, message: MessageObserved) -> None:
        """An extracted turn: background for the session's next windows, and an id
        whose repeat is ignored."""
        session.history.append(message)
        session.recent_ids[message.message_id] = None
        if len(session.recent_ids) > RECENT_IDS:
            session.recent_ids.pop(next(iter(session.recent_ids)))

    def load_history(self, job: WindowJob, earlier: Sequence[MessageObserved]) -> tuple[MessageObserved, ...]:
        """Put ``earlier`` (the session's turns before this buffer saw it, read from
        the projection, oldest first) in front of its in-memory history, and return
        the job's background as it would have been had the buffer seen them all."""
        session = self._sessions.get(job.key)
        known = {m.message_id for m in job.background} | {m.message_id for m in job.turns}
        merged = [m for m in earlier if m.message_id not in known] + list(job.background)
        background = tuple(merged[-self.max_background :]) if self.max_background else ()
        if session is None or job.generation != self.generation:
            return background
        in_memory = list(session.history)
        ids = {m.message_id for m in in_memory}
        session.history.clear()
        for m in [m for m in earlier if m.message_id not in ids] + in_memory:
            session.history.append(m)
        session.history_loaded = True
        return background

    def resume(self, partition: tuple[str, int], mark: ResumeMark | None) -> None:
        """Read ``partition`` from its commit knowing which turns after it were
        extracted already (the mark its commit carried; ``None``: none)."""
        if mark is None:
            self._resume.pop(partition, None)
        else:
            self._resume[partition] = mark

    def commit_marks(self, offsets: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], str]:
        """The :mod:`~memstream.domain.resume_marks` metadata to commit with each of
        ``offsets``: which turns read after the offset are still pending."""
        pending: dict[tuple[str, int], list[int]] = {}
        for session in self._sessions.values():
            for p in session.pending:
                pending.setdefault((p.position.topic, p.position.partition), []).append(p.position.offset)
        marks: dict[tuple[str, int], str] = {}
        for tp, off in offsets.items():
            end, still = self._seen.get(tp, 0), pending.get(tp, [])
            earlier = self._resume.get(tp)
            if earlier is not None and earlier.end > end:
                # Not re-read yet since the restart: what the last mark said still holds.
                still = still + [o for o in earlier.pending if o >= end]
                end = earlier.end
            marks[tp] = encode_mark(off, end, still)
        return marks

    def release(self, job: WindowJob) -> None:
        """A job that never ran (cancelled): its session may be scheduled again."""
        session = self._sessions.get(job.key)
        if session is not None and job.generation == self.generation:
            session.in_flight = False

    def failing_sessions(self) -> dict[SessionKey, tuple[int, str | None]]:
        """Sessions whose last run failed: ``key -> (failures, last reason)``."""
        return {k: (s.failures, s.last_failure) for k, s in self._sessions.items() if s.failures}

    # -- offsets ----------------------------------------------------------------------------
    def safe_offsets(self) -> dict[tuple[str, int], int]:
        """``(topic, partition) -> offset`` Kafka may commit (see the class docstring)."""
        lowest: dict[tuple[str, int], int] = {}
        for session in self._sessions.values():
            for p in session.pending:
                tp = (p.position.topic, p.position.partition)
                if tp not in lowest or p.position.offset < lowest[tp]:
                    lowest[tp] = p.position.offset
        out = dict(self._seen)
        out.update(lowest)
        return out

    def read_offsets(self) -> dict[tuple[str, int], int]:
        """``(topic, partition) -> `` one past the last record read."""
        return dict(self._seen)

    def drop_partitions(self, partitions: Sequence[tuple[str, int]]) -> int:
        """Forget everything read from these partitions (revoked: their turns will be
        re-read from the committed offset by whoever owns them next). Returns how many
        pending turns were dropped. In-flight jobs become stale (see :meth:`complete`)."""
        gone = set(partitions)
        if not gone:
            return 0
        self.generation += 1
        dropped = 0
        for key in list(self._sessions):
            session = self._sessions[key]
            keep = [p for p in session.pending if (p.position.topic, p.position.partition) not in gone]
            dropped += len(session.pending) - len(keep)
            session.pending = keep
            session.pending_ids = {p.message.message_id for p in keep}
            session.in_flight = False
            if not keep:
                session.first_try = None
                session.failures = 0
            if not session.pending and not session.history:
                del self._sessions[key]
        for tp in gone:
            self._seen.pop(tp, None)
            self._resume.pop(tp, None)
        return dropped
