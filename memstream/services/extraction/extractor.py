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
   ``DEDUP_CANDIDATES`` current memories by vector (with the vector just computed,
   no second embedding call), else by full text, else none;
6. ONE batched LLM judgment for every memory that has candidates (skipped when none
   has); if it fails after its retry, every memory is stored;
7. the events, each with its provenance, sent with the producer.

:meth:`Extractor.run_windows` runs several windows as one batch: each window stays its
own run (steps 1-2 and 5-6, its own provenance and correlation id), while steps 3, 4
and 7 are shared: one exact-dedup lookup per memory space, one embedding call, one
produce: without an LLM those round trips were nearly all of a window's cost.

Failure rules: a failed extraction call, an unreadable memory space or events that
cannot be produced make the outcome ``failed`` with every new turn *kept* for the next
run (:class:`~memstream.services.extraction.turn_buffer.TurnBuffer`); a window the model cannot
take falls back to the heuristic (:mod:`memstream.domain.extraction.fallback`), as does one it
declares empty while its turns state facts (``extract_declared_empty_fallback``). No
turn is lost or silently skipped; ids are content-derived, so a repeat re-sends them.

:class:`~memstream.services.extraction.turn_buffer.TurnBuffer` schedules the windows;
:class:`~memstream.services.extraction.service.ExtractorRunner` reads the turns from Kafka.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar

import numpy as np

from memstream.domain.access import ReadScope
from memstream.domain.events import (
    EmbeddingPayload,
    MemoryAdded,
    MemoryLinked,
    MessageObserved,
    Scope,
    new_event_id,
    utcnow,
)
from memstream.domain.extraction import (
    EXTRACTION_PROMPTS,
    MAX_MEMORIES,
    Action,
    Candidate,
    Decision,
    StageReport,
    build_events,
    build_window,
    dedupe_batch,
    extraction_schema,
    heuristic_drafts,
    memory_id_key,
    parse_extraction,
    record_items,
    render_turns,
    split_known,
    store_all,
)
from memstream.domain.extraction.stateable import declared_empty_with_facts
from memstream.domain.extraction.fallback import FALLBACK_STATUS, FallbackReason, fallback_reason, fallback_record
from memstream.domain.extraction.known import decide_by_links, pick_known, read_known_links, render_known, uncertain
from memstream.domain.prompts import PromptError, PromptLibrary
from memstream.llm import ChatModel, LLMError
from memstream.metrics import record_extraction_fallback
from memstream.projections.embedders import embed_array
from memstream.services.extraction.candidate_recall import DEDUP_CANDIDATES, CandidateRecall, store_recall
from memstream.services.extraction.calls import ask, counted, judge, llm_stage, with_note
from memstream.services.extraction.sources import SourceKeys
from memstream.services.extraction.run import (
    EventSink,
    ExtractionOutcome,
    WindowInput,
    CountingEmbedder,
    Embedder,
    WindowRun,
)
from memstream.settings import Settings
from memstream.streams.log_ids import log_id
from memstream.streams.trust.worker_identity import worker_key

__all__ = [
    "Extractor",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")
KNOWN_MEMORIES = 10
"""Similar existing memories shown in the extraction call: enough to link and skip repeats."""


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
        embedder: Embedder | None,
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
        self.known_memories = KNOWN_MEMORIES  # a test or benchmark may show fewer (0: none)
        self.sources: SourceKeys | None = None
        """With sealing on: the check that a window's keys are still held before its
        events are sealed (set by the runner, which shares the producer's keyring)."""
        self.prompts = prompts or PromptLibrary(settings.extraction.prompts_dir)
        self.clock = clock
        self.id_key = memory_id_key(worker_key(settings.resolved_worker_key_file))  # ids no client can compute
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
        self, scope: Scope, session_id: str | None, turns: Sequence[MessageObserved],
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
    def _open_runs(self, windows: Sequence[WindowInput], heuristic: bool) -> list[WindowRun]:
        runs: list[WindowRun] = []
        for w in windows:
            window = build_window(
                w.scope,
                w.session_id,
                w.turns,
                w.background,
                max_background=self.settings.extraction.background_turns,
            )
            run = WindowRun("x-" + new_event_id().hex, window, tuple(record_items(window, (), ())))
            run.attempt, run.final, run.extra_record = w.attempt, w.final, tuple(w.record)
            run.source_kids = w.source_kids
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

    def _fail(self, run: WindowRun, reason: str) -> None:
        w = run.window
        log.warning(
            "extraction %s failed for %s session %s (%d turns kept): %s",
            run.run_id, log_id(w.scope.space), log_id(w.session_id), len(w.new_message_ids), reason,
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

    def _forgotten(self, run: WindowRun) -> None:
        """The window's subject was forgotten while it was held: its turns are done
        with, and nothing made of them is written."""
        assert self.sources is not None
        self.sources.dropped_windows += 1
        log.info("extraction %s: %s was forgotten meanwhile; its window is dropped", run.run_id, log_id(run.scope.space))
        run.outcome = ExtractionOutcome(
            "nothing", self.method, consumed=run.window.new_message_ids, correlation_id=run.run_id
        )

    async def _llm_drafts(self, run: WindowRun) -> None:
        """ONE extraction call for the window (retried per ``llm_max_retries``)."""
        assert self.llm is not None
        window = run.window
        left = run.budget_left()
        if left is not None and left <= 0:
            self._fall_back(run, FallbackReason.budget, "the retry budget was spent before this attempt")
            return
        run.known = await self._known_memories(run)
        try:
            prompt = self.prompts.get(EXTRACTION_PROMPTS[self.settings.extraction.prompt], window.scope)
            background_text, new_text = render_turns(window)
            values = {"background": background_text, "turns": new_text, "known": render_known(run.known)}
            system, user = prompt.render({**values, "max_memories": MAX_MEMORIES})
        except PromptError as exc:
            self._fail(run, f"prompt: {exc}")
            return
        left = run.budget_left()
        if left is not None and left <= 0:
            self._fall_back(run, FallbackReason.budget, "the retry budget ran out before the call")
            return
        try:
            async with asyncio.timeout(left):
                call = await ask(
                    self.llm,
                    system,
                    user,
                    extraction_schema(self.settings.extraction.prompt, MAX_MEMORIES),
                    "memstream_extraction",
                    lambda value: counted(parse_extraction, value, window, MAX_MEMORIES),
                    retries=self.settings.extraction.llm_max_retries,
                )
        except TimeoutError:
            budget = self.settings.extraction.retry_budget_s
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
        run.extraction = llm_stage(prompt, call, repaired)
        flagged = declared_empty_with_facts(window) if parsed.nothing_to_remember else None
        if flagged is not None:
            run.issues.append(flagged)
            if self.settings.extraction.declared_empty_fallback:
                self._fall_back(run, FallbackReason.declared_empty, flagged.detail)

    async def _known_memories(self, run: WindowRun) -> list[Candidate]:
        """The memories of the turns' agent closest to the window's new turns, for the
        extraction call: the judgment's candidate recall (same scope), by the turns' vectors (one
        embedding call) else by full text; none if recall is off or fails."""
        limit = self.known_memories
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

    def _fall_back(self, run: WindowRun, reason: FallbackReason, error: str) -> None:
        """Store the window's turns as the heuristic would, recording why (the
        provenance status ``fallback`` and the record entry that lets
        ``memstream extract --retry-failed`` redo the window later)."""
        w = run.window
        log.warning(
            "extraction %s for %s session %s falls back to the heuristic after attempt %d (%s): %s",
            run.run_id, log_id(w.scope.space), log_id(w.session_id), run.attempt, reason.value, error,
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

    async def _exact_dedup(self, runs: Sequence[WindowRun]) -> None:
        """Exact dedup across each memory space: one lookup for the whole batch.

        Each run's lookup is pinned to its turns' agent (``ReadScope.pinned``): another
        agent's memory of the same text is neither a duplicate nor a sign that the text
        exists. Spaces are keyed by their parts, never by the ``team/user`` string,
        which two spaces can share (ids may hold ``/``). If the batch's lookup fails,
        each space is looked up alone, so a space that cannot be read fails only its
        own windows."""
        by_space: dict[ReadScope, list[WindowRun]] = {}
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
                run.extraction = with_note(run.extraction, problem + "; stored without exact dedup")
                found = {}
            run.new, run.duplicates = split_known(run.drafts, found)
            run.vectors = [None] * len(run.new)

    async def _embed(self, runs: Sequence[WindowRun]) -> None:
        """ONE embedding call for every new memory of the batch (the provider call is
        counted on the first run that embeds). If it fails, the events go without
        vectors and the projector embeds them."""
        todo = [run for run in runs if run.open and run.new]
        if not todo or self.embedder is None:
            return
        embedder = CountingEmbedder(self.embedder)
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

    async def _candidates_and_judgment(self, run: WindowRun) -> None:
        """Candidate recall, then ONE batched judgment for the window's new memories."""
        assert self._recall is not None
        contents = [d.content for d in run.new]
        vectors: list[Sequence[float] | None] = [None if v is None else v.tolist() for v in run.vectors]
        try:
            # pinned to the turns' agent: other agents' memories never reach the judgment prompt
            candidates = await asyncio.to_thread(self._recall, ReadScope.pinned(run.scope), contents, vectors, DEDUP_CANDIDATES)
        except Exception as exc:  # noqa: BLE001 - recall degrades to "no candidates"
            log.warning("extraction %s: candidate recall failed, storing: %s", run.run_id, exc)
            candidates = [[] for _ in run.new]
        decided = decide_by_links(run.new, run.known_links)
        assert self.llm is not None  # judged only with an LLM
        left = uncertain(candidates, run.known, decided)
        run.decisions, run.judgment, calls = await judge(
            self.llm, self.prompts, run.scope, run.new, left, run.budget_left(), retries=self.settings.extraction.llm_max_retries
        )
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

    def _payloads(self, run: WindowRun) -> list[EmbeddingPayload | None]:
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

    def _build_events(self, runs: Sequence[WindowRun]) -> None:
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
            extraction = with_note(run.extraction, run.embed_note) if run.embed_note else run.extraction
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
                    id_key=self.id_key,
                    correlation_id=run.run_id,
                    own_refs=self.llm is None or run.fallback is not None,
                )
            except ValueError as exc:
                self._fail(run, f"events could not be built: {exc}")
                continue
            run.events = list(built.events)
            run.record = record + list(built.rejected)

    async def _produce(self, runs: Sequence[WindowRun]) -> None:
        """ONE produce of every event of the batch, in run order; if it fails, every run
        that had events fails (its turns are kept; a repeat sends the same ids)."""
        sending = [run for run in runs if run.open and run.events]
        if sending and self.sources is not None:
            await self.sources.prepare((run.scope, run.source_kids) for run in sending)
            for run in sending:
                if not self.sources.live(run.scope, run.source_kids):
                    self._forgotten(run)
            sending = [run for run in sending if run.open]
        if not sending:
            return
        # Nothing may yield to the event loop between the check above and the sealing
        # inside send_many (extraction/sources.py): the keyring changes only on the loop.
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

    def _finish(self, run: WindowRun) -> ExtractionOutcome:
        if run.outcome is not None:
            return run.outcome
        window = run.window
        decision_dicts = tuple(
            {"memory": run.new[i].content[:200], **run.decisions[i].as_dict()} for i in sorted(run.decisions)
        )
        log.info(
            "extraction %s (%s) %s session %s: %d turns -> %d memories, %d links, %d duplicates, %d dropped",
            run.run_id, self.method, log_id(window.scope.space), log_id(window.session_id), len(window.new_message_ids),
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
