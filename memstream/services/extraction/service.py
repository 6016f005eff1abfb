"""The extractor in the worker: ``memstream.messages`` in, memories on ``memstream.events``.

A ``mode`` service with its own consumer group (``<app_id>.extractor``) that commits by
hand, per partition, only up to the oldest turn not extracted yet, so a crash re-reads
exactly the turns whose memories were not produced. docs/architecture-services.md
says why it is not a Faust stream agent, and how it batches, backs off and resumes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from aiokafka import TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import IllegalStateError, KafkaError
from mode import Service

from memstream.streams.log_ids import log_id
from memstream.domain.events import MessageObserved
from memstream.domain.log import LogPosition
from memstream.llm import ChatModel, build_llm
from memstream.projections.embedders import build_embedder, warm_up
from memstream.projections.reads import turns_before
from memstream.services.extraction.candidate_recall import store_recall
from memstream.services.extraction.run import EventSink, ExtractionOutcome, WindowInput
from memstream.services.extraction.extractor import Extractor
from memstream.services.extraction.commits import ExtractorCommits, consumer_group
from memstream.services.extraction.sources import SourceKeys, kid_of
from memstream.services.extraction.tables import ExtractorTables
from memstream.services.extraction.turn_buffer import TurnBuffer, WindowJob
from memstream.sealing import Subject
from memstream.settings import Settings
from memstream.streams.clients import KafkaConsumer, create_consumer
from memstream.streams.connect import until_started
from memstream.streams.records.codec import read_record
from memstream.streams.dead_letters.publisher import DeadLetter
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.rerouting import is_misrouted
from memstream.streams.sealing.sealed_records import RecordOpener
from memstream.streams.topics import Topics
from memstream.streams.trust.worker_identity import worker_key

__all__ = [
    "MAX_PENDING_TURNS",
    "MAX_CONCURRENT_BATCHES",
    "MAX_CONCURRENT_EXTRACTIONS",
    "ExtractorStats",
    "ExtractorRunner",
    "ExtractorService",
    "register_extractor",
    "consumer_group",
]

log = logging.getLogger(__name__)

MAX_PENDING_TURNS = 20_000
"""Above this many buffered turns the consumer pauses; it resumes below half."""
MAX_CONCURRENT_EXTRACTIONS = 4
"""Extraction tasks in flight at once, across sessions, with an LLM: each is one
window, most of whose time is its LLM round trips."""
MAX_CONCURRENT_BATCHES = 3
"""Without an LLM: batches of windows in flight at once. A batch is interpreter work
but for its lookup, embedding call and produce; other batches fill those waits, and
beyond that they only take turns on the interpreter lock (the choice is measured in
docs/benchmarks-history.md)."""
BATCH_TURNS = 500
"""Without an LLM: about this many new turns go through the extractor together (one
lookup, embedding call and produce per batch instead of per window)."""
_POLL_MS = 200
_STOP_GRACE_S = 5.0


@dataclass
class ExtractorStats:
    """Counters for logs, tests and the bench."""

    turns_read: int = 0
    records_skipped: int = 0
    extractions: int = 0
    extractions_failed: int = 0
    extractions_nothing: int = 0
    events_sent: int = 0
    memories_added: int = 0
    llm_calls: int = 0
    embed_calls: int = 0
    fallbacks: Counter[str] = field(default_factory=Counter)
    """Windows stored by the heuristic fallback, per reason."""
    fallback_turns: int = 0
    """New turns in those windows."""
    forgotten_turns: int = 0
    """Turns held when their subject was forgotten, dropped unextracted."""
    recent: deque[ExtractionOutcome] = field(default_factory=lambda: deque(maxlen=256))


class _Listener(ConsumerRebalanceListener):
    def __init__(self, runner: "ExtractorRunner") -> None:
        self.runner = runner

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.runner.commits.on_revoked(self.runner._consumer, revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("extractor assigned %d partition(s) of %s", len(assigned), self.runner.topics.messages)
        await self.runner.commits.on_assigned(assigned)


class ExtractorRunner:
    """Consume turns, schedule windows, run the :class:`Extractor`, commit safely.

    Components default to what ``settings`` configures (:func:`memstream.llm.client.build_llm`,
    ``build_embedder``, ``LanceStore.from_settings``, a ``MemstreamProducer``); tests and
    the bench may pass their own. The LanceDB store is opened on first use, in a thread.
    """

    def __init__(
        self,
        settings: Settings,
        topics: Topics,
        *,
        llm: ChatModel | None | Literal["settings"] = "settings",
        embedder: Any | None = None,
        store: Any | None = None,
        producer: EventSink | None = None,
        clock: Callable[[], float] | None = None,
        concurrency: int | None = None,
        on_outcome: Callable[[WindowJob, ExtractionOutcome], None] | None = None,
    ) -> None:
        self.settings = settings
        self.topics = topics
        self._llm_arg = llm
        self._embedder = embedder
        self._store = store
        self._producer: EventSink | None = producer
        self._own_producer: MemstreamProducer | None = None
        """The producer this runner created (and so stops), when none was passed."""
        self._owns_llm = llm == "settings"
        self._concurrency_arg = concurrency
        self._on_outcome = on_outcome
        """Told of every finished window (the job as run, background included), for
        the bench and tests."""
        self.concurrency = max(1, concurrency or MAX_CONCURRENT_EXTRACTIONS)
        """Tasks in flight at once (``concurrency``, else :data:`MAX_CONCURRENT_EXTRACTIONS`
        with an LLM and :data:`MAX_CONCURRENT_BATCHES` without one)."""
        buffer_kwargs: dict[str, Any] = {}
        if clock is not None:
            buffer_kwargs["clock"] = clock
        self.buffer = TurnBuffer(
            min_new=settings.extraction.min_new_turns,
            idle_seconds=settings.extraction.idle_seconds,
            max_new=settings.extraction.max_new_turns,
            max_background=settings.extraction.background_turns,
            max_attempts=settings.extraction.max_attempts,
            retry_budget_s=settings.extraction.retry_budget_s,
            **buffer_kwargs,
        )
        self.stats = ExtractorStats()
        self.extractor: Extractor | None = None
        self._consumer: KafkaConsumer | None = None
        self._jobs: dict[asyncio.Task[None], list[WindowJob]] = {}
        self._computing: set[asyncio.Task[None]] = set()
        """The jobs still extracting (not yet only waiting for the produce to be
        acknowledged): at most ``concurrency`` of them."""
        self.commits = ExtractorCommits(settings, self.buffer)
        self._batching = False
        """Several sessions' windows per task (set at start when no LLM is configured)."""
        self._paused = False
        self._stopping = False
        self._loop_task: asyncio.Task[None] | None = None
        self.tables = ExtractorTables(settings, self._attach_store)
        self._keys: SubjectKeys | None = None
        self._opener: RecordOpener | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Build the components, connect, and start consuming in a background task.
        A failure on the way releases whatever was already started, then raises."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        settings = self.settings
        llm = build_llm(settings) if isinstance(self._llm_arg, str) else self._llm_arg
        self._llm = llm
        if self._embedder is None:
            self._embedder = await asyncio.to_thread(build_embedder, settings.embeddings)
            await asyncio.to_thread(warm_up, self._embedder)  # before its first batch, not in it
        if settings.security.sealing:
            self._keys = await until_started(
                lambda: SubjectKeys(settings.streams, self.topics, client_id="memstream-extractor-keys"), "extractor keyring"
            )
            self._opener = RecordOpener(self._keys.keyring)
        if self._producer is None:
            producer = await until_started(
                lambda: MemstreamProducer(
                    settings.streams, topics=self.topics, client_id="memstream-extractor", signing_key=worker_key(settings.resolved_worker_key_file),
                    keys=self._keys,
                ),
                "extractor producer",
            )
            self._producer = self._own_producer = producer
        self.extractor = Extractor(settings, llm, self._embedder, None, self._producer)
        if self._keys is not None:
            self.extractor.sources = SourceKeys(self._keys)
            self._keys.on_forget(self._subject_forgotten)
        if llm is None:
            # The heuristic makes each memory from its own turn alone: holding turns
            # until a session has enough of them, or falls idle, would only delay them
            # (by up to ``extract_idle_seconds``). Every turn read is due at once, and
            # the turns read together are extracted together, across sessions, in
            # batches of about ``BATCH_TURNS``. A session's pending turns go
            # in one window, not ``extract_max_new_turns`` at a time (a bound the
            # LLM's prompt needs): one session at a time is in flight, so a session
            # read in one burst would be extracted in a chain of sequential batches,
            # and the longest session would set the pace.
            self.buffer.min_new = 1
            self.buffer.max_new = max(self.buffer.max_new, BATCH_TURNS)
            self.buffer.retry_budget_s = None  # the heuristic makes no call that could stall
            self._batching = True
            if self._concurrency_arg is None:
                self.concurrency = MAX_CONCURRENT_BATCHES
        if self._store is not None:
            self.tables.attach(self._store)

        def make_consumer() -> KafkaConsumer:
            consumer = create_consumer(
                settings.broker,
                group_id=consumer_group(settings),
                client_id="memstream-extractor",
                enable_auto_commit=False,
                auto_offset_reset="earliest",
            )
            consumer.subscribe([self.topics.messages], listener=_Listener(self))
            return consumer

        self._consumer = await until_started(make_consumer, "extractor consumer")
        if self.extractor.store is None:
            self.tables.start_prefetch()
        self._loop_task = asyncio.create_task(self._run(), name="memstream-extractor")
        log.info(
            "extractor started (%s) on %s as group %s",
            "LLM " + getattr(llm, "model", "?") if llm is not None else "heuristic, no LLM configured",
            self.topics.messages,
            consumer_group(settings),
        )

    def _subject_forgotten(self, subject: Subject) -> None:
        """The subject's last key is gone: the turns held for it are dropped, never
        extracted (their records no longer open, so a restart does not read them)."""
        dropped = self.buffer.drop_subject(subject.team_id, subject.user_id)
        self.stats.forgotten_turns += dropped
        log.info("extractor: %s forgotten; %d held turn(s) dropped", log_id(subject), dropped)

    def _attach_store(self, store: Any) -> None:
        assert self.extractor is not None
        self._store = store
        self.extractor.store = store
        self.extractor._recall = store_recall(store, self._embedder)

    async def stop(self) -> None:
        """Stop reading, let running extractions finish briefly, commit, disconnect."""
        self._stopping = True
        await self.tables.stop()
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None
        if self._jobs:
            done, pending = await asyncio.wait(list(self._jobs), timeout=_STOP_GRACE_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._consumer is not None:
            await self.commits.commit(self._consumer, force=True)
            await self._consumer.stop()
            self._consumer = None
        await self.commits.close()
        own, self._own_producer = self._own_producer, None
        if own is not None:
            await own.stop()
            self._producer = None
        keys, self._keys = self._keys, None
        if keys is not None:
            await keys.stop()
        llm = getattr(self, "_llm", None)
        if self._owns_llm and llm is not None and hasattr(llm, "close"):
            await llm.close()

    # -- the loop ----------------------------------------------------------------------------
    async def _run(self) -> None:
        assert self._consumer is not None
        consumer = self._consumer
        while not self._stopping:
            try:
                polled = await consumer.getmany(timeout_ms=_POLL_MS, max_records=500)
            except (KafkaError, IllegalStateError) as exc:
                log.warning("extractor poll failed (retrying): %s", exc)
                await asyncio.sleep(1.0)
                continue
            unread = [tp for tp in polled if (tp.topic, tp.partition) not in self.commits.marks_read]
            if unread:
                # aiokafka may hand out records before the assignment listener ran
                await self.commits.read_marks(unread)
            if self._keys is not None:
                await self._keys.prepare((r.value, r.headers) for records in polled.values() for r in records)
            for records in polled.values():
                for r in records:
                    self._ingest(r.topic, r.partition, r.offset, r.key, r.value, r.headers)
            await self.tables.follow_current_set()
            self._backpressure()
            self._schedule()
            # Once everything read is extracted, say so at once (a no-op if nothing
            # changed): lag monitors and a restart then see it done, not a second later.
            await self.commits.commit(self._consumer, force=not self._jobs and self.buffer.pending_count == 0)

    def _ingest(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] | None,
    ) -> None:
        position = LogPosition(topic=topic, partition=partition, offset=offset)
        kid = kid_of(value)
        if self._consumer is not None and is_misrouted(key, partition, len(self._consumer.partitions_for_topic(topic) or ())):
            # The projector re-publishes it to its key's partition: the copy is read there.
            self.stats.records_skipped += 1
            self.buffer.observe(position)
            return
        item = read_record(self._opener, topic, partition, offset, key, value, headers)
        if item is None:  # a forgotten subject's turn: never extracted
            self.stats.records_skipped += 1
            self.buffer.observe(position)
            return
        if isinstance(item, DeadLetter):
            self.stats.records_skipped += 1
            log.warning("extractor skipped an invalid record at %s: %s", position, item.reason)
            self.buffer.observe(position)
            return
        event = item.event
        if not isinstance(event, MessageObserved):
            self.stats.records_skipped += 1
            self.buffer.observe(position)
            return
        if self.buffer.add(event, position, kid):
            self.stats.turns_read += 1

    def _backpressure(self) -> None:
        assert self._consumer is not None
        pending = self.buffer.pending_count
        assigned = self._consumer.assignment()
        if not self._paused and pending > MAX_PENDING_TURNS and assigned:
            self._consumer.pause(*assigned)
            self._paused = True
            log.warning("extractor paused reading: %d turns wait for extraction", pending)
        elif self._paused and pending <= MAX_PENDING_TURNS // 2:
            self._consumer.resume(*assigned)
            self._paused = False
            log.info("extractor resumed reading (%d turns pending)", pending)

    def _schedule(self, *, flush: bool = False) -> list[asyncio.Task[None]]:
        """Start extraction tasks for the due sessions while fewer than ``concurrency``
        are extracting (tasks only waiting for their produce to be acknowledged do not
        count, up to as many again): one window per task with an LLM, a batch of
        windows without one. With an LLM, the windows whose retry budget ran out while
        they waited start at once, slot or not (:meth:`TurnBuffer.expired`)."""
        started: list[asyncio.Task[None]] = []
        if not self._batching:
            # windows whose budget ran out while they waited: stored by the fallback,
            # with no model call, so they need no slot (nothing stalls behind a slow model)
            for job in self.buffer.expired():
                started.append(self._start_job([job]))
        while len(self._computing) < self.concurrency and len(self._jobs) < 2 * self.concurrency:
            if self._batching:
                jobs = self.buffer.due(flush=flush, max_turns=BATCH_TURNS)
            else:
                jobs = self.buffer.due(flush=flush, limit=1)
            if not jobs:
                break
            started.append(self._start_job(jobs))
        return started

    def _start_job(self, jobs: list[WindowJob]) -> asyncio.Task[None]:
        name = f"extract:{jobs[0].key}" + (f"+{len(jobs) - 1}" if len(jobs) > 1 else "")
        task = asyncio.create_task(self._execute(jobs), name=name)
        self._jobs[task] = jobs
        self._computing.add(task)
        task.add_done_callback(self._job_done)
        return task

    def _job_done(self, task: "asyncio.Task[None]") -> None:
        """Start the next due window as soon as one finishes, not at the next poll:
        with the topic drained a poll waits its full timeout, which capped extraction
        at ``concurrency`` windows per poll interval (about 20 windows/s)."""
        self._jobs.pop(task, None)
        self._computing.discard(task)
        if not self._stopping:
            self._schedule()

    def _producing(self, task: "asyncio.Task[None] | None") -> None:
        """A job's extraction is done and its produce is under way: the broker's
        acknowledgements need no
        slot, so the next due batch starts meanwhile. Its commit still waits for them."""
        if task is None or task not in self._computing:
            return
        self._computing.discard(task)
        if not self._stopping:
            self._schedule()

    async def _execute(self, jobs: list[WindowJob]) -> None:
        assert self.extractor is not None
        me = asyncio.current_task()
        try:
            await self.tables.ensure()
            if not self._batching:
                jobs = [await self._with_history(job) for job in jobs]
            outcomes = await self.extractor.run_windows(
                [
                    WindowInput(
                        job.scope,
                        job.session_id,
                        job.turns,
                        job.background,
                        attempt=job.attempt,
                        final=job.final,
                        budget_s=job.budget_s,
                        source_kids=job.source_kids,
                    )
                    for job in jobs
                ],
                producing=lambda: self._producing(me),
            )
        except asyncio.CancelledError:
            for job in jobs:
                self.buffer.release(job)
            raise
        except Exception as exc:  # noqa: BLE001 - a bug must not lose the turns
            log.exception("extraction of %s crashed; its turns are kept", ", ".join(log_id(j.key) for j in jobs))
            outcomes = [
                ExtractionOutcome(
                    "failed",
                    self.extractor.method,
                    kept=tuple(m.message_id for m in job.turns),
                    failure=f"unexpected {type(exc).__name__}: {exc}",
                )
                for job in jobs
            ]
        s = self.stats
        for job, outcome in zip(jobs, outcomes):
            self.buffer.complete(job, outcome)
            if self._on_outcome is not None:
                self._on_outcome(job, outcome)
            s.extractions += 1
            s.llm_calls += outcome.llm_calls
            s.embed_calls += outcome.embed_calls
            if outcome.status == "failed":
                s.extractions_failed += 1
            elif outcome.status == "nothing":
                s.extractions_nothing += 1
            if outcome.fallback is not None:
                s.fallbacks[outcome.fallback] += 1
                s.fallback_turns += len(outcome.consumed)
            s.events_sent += len(outcome.positions)
            s.memories_added += len(outcome.memories)
            s.recent.append(outcome)
        if not self._stopping:
            # Once everything read is extracted, say so at once (lag monitors and a
            # restart see it done); otherwise at most every ``_COMMIT_EVERY_S``.
            await self.commits.commit(self._consumer, force=self.buffer.pending_count == 0)

    async def _with_history(self, job: WindowJob) -> WindowJob:
        """The job with the background it would have had without a restart: for a
        session's first window since this runner saw it, its earlier turns are read
        from the ``messages`` projection (the in-memory history is empty after a
        restart or a partition move). If the read fails the window goes with what
        is in memory."""
        max_background = self.buffer.max_background
        if not job.load_history or not max_background or self.extractor is None or self.extractor.store is None:
            return job
        first = job.positions[0]
        try:
            earlier = await asyncio.to_thread(
                turns_before, self.extractor.store, job.scope, job.session_id, first.partition, first.offset, max_background
            )
        except Exception as exc:  # noqa: BLE001 - less context, nothing lost
            log.warning("extractor: earlier turns of %s not read from the projection: %s", log_id(job.key), exc)
            return job
        return replace(job, background=self.buffer.load_history(job, earlier))

    # -- helpers for tests and tools -------------------------------------------------------
    async def drain(self, timeout: float = 30.0) -> None:
        """Extract every pending turn now (ignoring the triggers) and wait for it; turns
        whose extraction fails stay pending. Used at shutdown by tools and in tests."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            failed_before = self.stats.extractions_failed
            started = self._schedule(flush=True)
            windows = sum(len(self._jobs.get(task, ())) for task in started)
            if not self._jobs:
                return
            await asyncio.wait(list(self._jobs), timeout=max(0.0, deadline - loop.time()))
            if windows and self.stats.extractions_failed - failed_before >= windows:
                return  # every extraction of this round failed: the turns stay pending
        raise TimeoutError(f"extractions still running after {timeout:g} s")

    def committed(self) -> dict[tuple[str, int], int]:
        """The offsets this runner last committed."""
        return dict(self.commits.offsets)


class ExtractorService(Service):
    """Runs an :class:`ExtractorRunner` for the lifetime of the Faust worker."""

    logger = logging.getLogger("memstream.faust")

    def __init__(self, runner: ExtractorRunner) -> None:
        super().__init__()
        self.runner = runner

    async def on_start(self) -> None:
        await self.runner.start()

    async def on_stop(self) -> None:
        await self.runner.stop()


def register_extractor(app: Any, settings: Settings, topics: Topics) -> ExtractorRunner:
    """Add the extractor to the Faust ``app`` (called by ``build_app``)."""
    runner = ExtractorRunner(settings, topics)
    app.service(ExtractorService(runner))
    return runner
