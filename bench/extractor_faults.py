"""``memstream bench extractor --faults``: windows the model never takes, and a restart.

Runs after the pipeline figures of :mod:`memstream.bench.extractor`, on fresh topics,
with the model behind the real ``openai`` client and the scripted OpenAI-compatible
server (:mod:`memstream.bench.openai_fake`). The conversation turns are the
benchmark's own; a few of them carry a marker the scripted model reacts to, always:

* ``[policy]``: a 400 for content policy (the client's JSON-mode fallbacks included);
* ``[overflow]``: a 400 "maximum context length" error;
* ``[garbled]``: prose where JSON is due (unparsable after repair and the call's retry);
* ``[flaky]``: a 503 on every attempt (retryable: the window's attempts and retry
  budget run out, at the product defaults).

Every other window is answered as the pipeline bench's scripted model answers. The
turns are projected into ``messages`` first (the worker's projector, caught up), then
the real :class:`ExtractorRunner` extracts them twice: once uninterrupted, and once
with the runner stopped after about half of the windows and a new one started in its
place (a worker restart mid-session; the resume marks of its commits and the
projection give it what the first one knew).

Figures: ``poison_windows`` (windows stored by the fallback), ``fallback_turns_stored``
(memories the fallback stored), ``turns_lost`` (turns no window consumed, worst of the
two runs), ``max_partition_stall_s`` (the longest time a partition's committed offset
stood still with turns read beyond it, restart included), ``restart_windows_equal``
(the set of windows, background and new turn ids, of the run with the restart equals
the uninterrupted run's).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memstream.bench._events import bench_settings, create_topics, delete_topics, print_table, status
from memstream.bench.extractor import ScriptedExtractionModel, _turns
from memstream.bench.extractor import run as run_pipeline
from memstream.bench.openai_fake import OpenAICompatServer, Reply
from memstream.domain.events import MessageObserved
from memstream.domain.log import PositionedEvent
from memstream.llm import LLMClient
from memstream.projections.embedders import build_embedder
from memstream.projections.projector import Projector
from memstream.projections.store import LanceStore
from memstream.services.extraction import ExtractorRunner
from memstream.settings import Settings
from memstream.streams.producers.producer import MemstreamProducer

__all__ = ["FAULTS", "fault_turns", "responder", "run", "run_faults", "QUICK_FAULT_TURNS", "FAULT_TURNS"]

QUICK_FAULT_TURNS = 2_000
FAULT_TURNS = 6_000
FAULTS: dict[str, list[int]] = {
    "[policy]": [101, 1502],
    "[overflow]": [203, 1604],
    "[garbled]": [305, 1706],
    "[flaky]": [1207],
}
"""Marker -> the indices of the turns that carry it. A session holds every 100th turn
(20 turns, two windows, in the quick run); ``[flaky]`` sits in a second window, which
the run with the restart extracts after it (a restart starts a window's attempts and
budget afresh: the attempt count is kept in memory)."""
_RUN_TIMEOUT_S = 600.0

Window = tuple[tuple[str, ...], tuple[str, ...]]


def fault_turns(n: int) -> list[MessageObserved]:
    """The pipeline bench's turns, a few of them carrying a fault marker."""
    turns = _turns(n, seed=11)
    for marker, indices in FAULTS.items():
        for i in indices:
            if i < n:
                turns[i] = turns[i].model_copy(update={"content": f"Please keep this note {marker} number {i}."})
    return turns


def responder(body: dict[str, Any]) -> Reply:
    """The scripted model: the pipeline bench's answers, and the faults' failures."""
    user = body["messages"][1]["content"]
    if user.startswith("NEW MEMORIES AND THEIR CANDIDATES"):
        return Reply(json_value=ScriptedExtractionModel._judge(user))
    new = user.split("NEW TURNS", 1)[-1]
    if "[policy]" in new:
        return Reply(status=400, error_message="Your request was flagged by the content policy.")
    if "[overflow]" in new:
        return Reply(
            status=400,
            error_message="This model's maximum context length is 8192 tokens; your messages resulted in 9120 tokens.",
        )
    if "[garbled]" in new:
        return Reply(content="I am sorry, I cannot answer that in JSON.")
    if "[flaky]" in new:
        return Reply(status=503, error_message="overloaded")
    answer = ScriptedExtractionModel._extract(user)
    answer.pop("skipped")
    return Reply(json_value=answer)


@dataclass
class _Run:
    windows: set[Window] = field(default_factory=set)
    consumed: set[str] = field(default_factory=set)
    fallbacks: Counter[str] = field(default_factory=Counter)
    fallback_memories: int = 0
    max_stall_s: float = 0.0
    seconds: float = 0.0
    restart_s: float | None = None
    after_restart: int = 0
    """Windows the runner started after the restart extracted."""

    def record(self, job: Any, outcome: Any) -> None:
        if self.restart_s is not None:
            self.after_restart += 1
        self.windows.add(
            (tuple(m.message_id for m in job.background), tuple(m.message_id for m in job.turns))
        )
        if outcome.ok:
            self.consumed.update(outcome.consumed)
        if outcome.fallback is not None:
            self.fallbacks[outcome.fallback] += 1
            self.fallback_memories += len(outcome.memories)


class _StallClock:
    """How long each partition's committed offset stood still with turns read past it."""

    def __init__(self) -> None:
        self.committed: dict[tuple[str, int], int] = {}
        self.since: dict[tuple[str, int], float] = {}
        self.worst = 0.0

    def sample(self, read: dict[tuple[str, int], int], committed: dict[tuple[str, int], int]) -> None:
        now = time.monotonic()
        for tp, end in read.items():
            offset = committed.get(tp, self.committed.get(tp))
            if offset is not None and offset != self.committed.get(tp):
                self.committed[tp] = offset
                self.since[tp] = now
            if offset is not None and offset >= end:
                self.since[tp] = now
                continue
            self.worst = max(self.worst, now - self.since.setdefault(tp, now))


async def _project_turns(settings: Settings, store: Any, embedder: Any, turns: list[MessageObserved]) -> None:
    producer = MemstreamProducer(settings.streams, client_id="bench-faults")
    await producer.start()
    try:
        positions = await producer.send_many(turns)
    finally:
        await producer.stop()
    events = [PositionedEvent(position=p, event=t) for p, t in zip(positions, turns)]
    result = await asyncio.to_thread(Projector(store, embedder).apply, events)
    if result.failed:
        raise RuntimeError(f"projecting the turns failed: {result.failed[0][1]}")


async def _extract(settings: Settings, turns: list[MessageObserved], restart_after: int | None) -> _Run:
    """One run over fresh topics: produce and project the turns, extract them all
    (with a restart once ``restart_after`` windows are done)."""
    topics = await create_topics(settings)
    embedder = await asyncio.to_thread(build_embedder, settings.embeddings)
    store = await asyncio.to_thread(LanceStore.from_settings, settings.storage, settings.embeddings.dim)
    await _project_turns(settings, store, embedder, turns)
    run = _Run()
    clock = _StallClock()
    wanted = {t.message_id for t in turns}
    llm = LLMClient.from_settings(settings)
    producer = MemstreamProducer(settings.streams, topics=topics, client_id="bench-faults-extractor")
    await producer.start()

    def runner() -> ExtractorRunner:
        return ExtractorRunner(
            settings, topics, llm=llm, embedder=embedder, store=store, producer=producer, on_outcome=run.record
        )

    current = runner()
    start = time.monotonic()
    try:
        await current.start()
        while wanted - run.consumed or current._jobs:
            if time.monotonic() - start > _RUN_TIMEOUT_S:
                status(f"giving up after {_RUN_TIMEOUT_S:g} s: {len(wanted - run.consumed)} turns not consumed")
                break
            clock.sample(current.buffer.read_offsets(), current.committed())
            if restart_after is not None and run.restart_s is None and len(run.windows) >= restart_after:
                status(f"restarting the extractor after {len(run.windows)} windows")
                t0 = time.monotonic()
                await current.stop()
                current = runner()
                await current.start()
                run.restart_s = time.monotonic() - t0
            await asyncio.sleep(0.05)
        run.seconds = time.monotonic() - start
    finally:
        await current.stop()
        await producer.stop()
        await llm.close()
    run.max_stall_s = clock.worst
    run.consumed &= wanted
    return run


def run(quick: bool = False) -> dict[str, Any]:
    """``bench extractor --faults``: the pipeline figures, then the fault figures, in one
    JSON object."""
    figures = run_pipeline(quick=quick)
    figures.update(run_faults(quick=quick))
    return figures


def run_faults(quick: bool = False) -> dict[str, Any]:
    """Both runs; returns the fault figures (JSON-able)."""
    n = QUICK_FAULT_TURNS if quick else FAULT_TURNS
    turns = fault_turns(n)
    runs: list[_Run] = []
    budget = 0.0
    with OpenAICompatServer() as server:
        server.chat.responder = responder
        for label, restart in (("uninterrupted", None), ("with a restart", -1)):
            workdir = Path(tempfile.mkdtemp(prefix="memstream-bench-faults-"))
            settings = bench_settings(
                workdir,
                extract_idle_seconds=1.0,
                llm_base_url=server.base_url,
                llm_model="scripted-faults",
                llm_timeout_s=10.0,
            )
            budget = settings.extraction.retry_budget_s
            restart_after = None if restart is None else max(1, len(runs[0].windows) // 2)
            status(f"fault run {label}: {n:,} turns")
            try:
                runs.append(asyncio.run(_extract(settings, turns, restart_after)))
            finally:
                try:
                    asyncio.run(delete_topics(settings))
                except Exception as exc:  # noqa: BLE001 - cleanup must not hide the result
                    status(f"could not delete the benchmark topics: {exc}")
                shutil.rmtree(workdir, ignore_errors=True)
    plain, restarted = runs
    figures: dict[str, Any] = {
        "fault_turns": n,
        "poison_windows": sum(plain.fallbacks.values()),
        "fallbacks_by_reason": dict(sorted(plain.fallbacks.items())),
        "fallback_turns_stored": plain.fallback_memories,
        "turns_lost": max(n - len(plain.consumed), n - len(restarted.consumed)),
        "max_partition_stall_s": round(max(plain.max_stall_s, restarted.max_stall_s), 2),
        "retry_budget_s": budget,
        "restart_windows_equal": plain.windows == restarted.windows,
        "restart_windows_differing": len(plain.windows ^ restarted.windows),
        "fault_windows": len(plain.windows),
        "restart_s": round(restarted.restart_s or 0.0, 2),
        "windows_after_restart": restarted.after_restart,
        "fault_run_seconds": round(plain.seconds, 2),
    }
    print_table(
        f"extractor faults, {n:,} turns, scripted model over HTTP",
        [
            ("poison_windows", str(figures["poison_windows"]), str(figures["fallbacks_by_reason"])),
            ("fallback_turns_stored", str(figures["fallback_turns_stored"]), "memories stored by the fallback"),
            ("turns_lost", str(figures["turns_lost"]), "turns no window consumed (worst run)"),
            ("max_partition_stall_s", f"{figures['max_partition_stall_s']:.2f}", f"budget {figures['retry_budget_s']:g} s"),
            ("restart_windows_equal", str(figures["restart_windows_equal"]), f"{figures['fault_windows']} windows"),
        ],
    )
    return figures
