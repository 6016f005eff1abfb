"""``memstream bench extractor --replay DATA``: a recorded conversation replayed through
the extractor, without and then with the known memories in the extraction call.

The pipeline bench (:mod:`memstream.bench.extractor`) seeds its spaces once and runs no
projector, so the memories a window makes are never shown to a later one. Here a
transcript (LoCoMo's format; read in place, never copied) is replayed session by
session, as a user would have talked: each session's turns are produced to
``messages``, the real :class:`ExtractorRunner` extracts them (the pipeline bench's
scripted model: one memory per turn, none for a turn that repeats a known memory word
for word), and the events it produced are projected with the real projector before
the next session, so the next session's extraction call sees what the earlier ones
stored. Both runs replay the same turns on fresh topics; the figures are per 100
turns: model calls, tokens (prompt + completion, a quarter of the characters), the
judgment calls, memories stored, and the duplicates avoided (turns the call did not
extract again because they repeat a known memory).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

from memstream.bench._events import bench_settings, create_topics, delete_topics, machine_info, print_table, status
from memstream.bench.extractor import ScriptedExtractionModel
from memstream.bench.locomo import conversation_events, load_locomo
from memstream.domain.events import MessageObserved
from memstream.domain.log import PositionedEvent
from memstream.projections.embedders import build_embedder
from memstream.projections.projector import Projector
from memstream.projections.store import LanceStore
from memstream.services.extraction import ExtractorRunner
from memstream.services.extraction import extractor as extractor_module
from memstream.services.extraction.extractor import KNOWN_MEMORIES
from memstream.settings import Settings
from memstream.streams.producers.producer import MemstreamProducer

__all__ = ["run"]

_SETTLE_TIMEOUT_S = 300.0


async def _replay(settings: Settings, sessions: list[list[MessageObserved]]) -> dict[str, Any]:
    topics = await create_topics(settings)
    embedder = await asyncio.to_thread(build_embedder, settings.embeddings)
    store = await asyncio.to_thread(LanceStore.from_settings, settings.storage, settings.embeddings.dim)
    model = ScriptedExtractionModel()
    produced: list[PositionedEvent] = []
    producer = MemstreamProducer(settings.streams, topics=topics, client_id="bench-replay")
    await producer.start()

    class _Recording:
        """The runner's producer, keeping what it sends for the projector."""

        async def send_many(self, events: Any) -> Any:
            positions = await producer.send_many(events)
            produced.extend(PositionedEvent(position=p, event=e) for p, e in zip(positions, events))
            return positions

    runner = ExtractorRunner(settings, topics, llm=model, embedder=embedder, store=store, producer=_Recording())
    await runner.start()
    turns = 0
    try:
        for number, session in enumerate(sessions, 1):
            positions = await producer.send_many(session)
            await asyncio.to_thread(
                Projector(store, embedder).apply,
                [PositionedEvent(position=p, event=t) for p, t in zip(positions, session)],
            )
            turns += len(session)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + _SETTLE_TIMEOUT_S
            while runner.stats.turns_read < turns or runner.buffer.pending_count or runner._jobs:
                if loop.time() > deadline:
                    raise RuntimeError(f"session {number} not extracted in {_SETTLE_TIMEOUT_S:g} s")
                await asyncio.sleep(0.02)
            batch, produced[:] = list(produced), []
            result = await asyncio.to_thread(Projector(store, embedder).apply, batch)
            if result.failed:
                raise RuntimeError(f"projecting session {number} failed: {result.failed[0][1]}")
        stats = runner.stats
    finally:
        await runner.stop()
        await producer.stop()
    per_100 = 100.0 / max(1, turns)
    return {
        "turns": turns,
        "llm_calls_per_100_turns": round(stats.llm_calls * per_100, 2),
        "tokens_per_100_turns": round(sum(model.tokens.values()) * per_100, 1),
        "extraction_tokens": model.tokens["extraction"],
        "judgment_tokens": model.tokens["judgment"],
        "judgment_calls": model.judgment_calls,
        "extraction_calls": model.extraction_calls,
        "memories_added": stats.memories_added,
        "known_repeats_skipped": model.known_repeats_skipped,
        "links_named_by_extraction": model.links_named,
        "embed_calls_per_100_turns": round(stats.embed_calls * per_100, 2),
    }


def run(data: Path, conversations: int = 2) -> dict[str, Any]:
    """Replay the first ``conversations`` of ``data`` twice (known memories off, on)."""
    convs = load_locomo(data)[:conversations]
    sessions: list[list[MessageObserved]] = []
    for conversation in convs:
        by_session: dict[str | None, list[MessageObserved]] = {}
        for event in conversation_events(conversation):
            by_session.setdefault(event.session_id, []).append(event)
        sessions.extend(by_session.values())
    figures: dict[str, Any] = {}
    for label, known in (("without_known", 0), ("with_known", None)):
        workdir = Path(tempfile.mkdtemp(prefix="memstream-bench-replay-"))
        settings = bench_settings(workdir, extract_idle_seconds=0.3)
        status(f"replaying {sum(map(len, sessions)):,} turns in {len(sessions)} sessions ({label})")
        try:
            shown = KNOWN_MEMORIES if known is None else known
            with mock.patch.object(extractor_module, "KNOWN_MEMORIES", shown):  # every extractor the runner makes
                figures[label] = asyncio.run(_replay(settings, sessions))
            figures[label]["known_memories_shown"] = shown
        finally:
            try:
                asyncio.run(delete_topics(settings))
            except Exception as exc:  # noqa: BLE001 - cleanup must not hide the result
                status(f"could not delete the benchmark topics: {exc}")
            shutil.rmtree(workdir, ignore_errors=True)
    off, on = figures["without_known"], figures["with_known"]
    keys = ("llm_calls_per_100_turns", "tokens_per_100_turns", "judgment_calls", "memories_added")
    figures["ratios"] = {k: round(on[k] / off[k], 3) if off[k] else None for k in keys}
    figures["data"] = data.name
    figures["conversations"] = len(convs)
    figures["machine"] = machine_info()
    print_table(
        f"extractor replay of {len(convs)} conversation(s), {on['turns']:,} turns, scripted model",
        [(k, f"{off[k]} -> {on[k]}", "without -> with known memories") for k in (*keys, "known_repeats_skipped")],
    )
    return figures
