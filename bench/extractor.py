"""``memstream bench extractor``: the extraction pipeline's own overhead.

What runs is the production path minus the model's latency: ``N`` conversation turns
(default 20,000; ``--quick`` 2,000) over 25 memory spaces and 100 sessions are produced
to a fresh ``messages`` topic; then the real :class:`ExtractorRunner` (its own Kafka
consumer group, the session buffer and triggers, the quality gate, prompt rendering,
JSON repair and validation, exact dedup against LanceDB, one embedding call per window
with the local embedder, candidate recall by vector, the batched judgment, provenance,
durable produce to ``events``) extracts them all. The memory spaces are seeded first
with 40 projected memories each, so dedup and recall query a non-empty table and the
judgment runs.

The LLM is scripted in process and answers at once (one memory per qualifying turn,
its text the turn's; every fifth judged memory an update of its first candidate), so
the figures are memstream's own. One turn in twenty is noise the gate drops, one in
twenty repeats a stored memory word for word (exact dedup across the space), one in
twenty repeats an earlier turn (no projector runs here, so those are only deduplicated
within their window: projection speed is ``bench projector``'s subject).

Figures:

* ``messages_per_s``: turns through the pipeline per second, from the first turn read
  to the last window's events acknowledged by the broker (the consumer group's
  start-up is reported apart as ``startup_s``);
* ``llm_calls_per_100_messages``: extraction plus judgment calls (one each per window
  of up to ``extract_max_new_turns`` turns at most, so 20 is the ceiling at the default
  10-turn window);
* ``embed_calls_per_100_messages``: embedding provider calls (one per window; recall
  reuses those vectors).

Every turn is checked to be consumed (nothing kept, nothing failed) before the figures
are reported. The topics are deleted afterwards.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from unittest import mock

from memstream.bench._events import bench_settings, create_topics, delete_topics, machine_info, print_table, status
from memstream.domain.events import MemoryAdded, MessageObserved, Scope
from memstream.domain.log import LogPosition, PositionedEvent
from memstream.llm import ChatResult
from memstream.projections.embedders import build_embedder
from memstream.projections.projector import Projector
from memstream.projections.store import LanceStore
from memstream.services.extraction import ExtractorRunner
from memstream.services.extraction import extractor as extractor_module
from memstream.services.extraction.extractor import KNOWN_MEMORIES
from memstream.settings import Settings
from memstream.streams.producers.producer import MemstreamProducer

__all__ = ["ScriptedExtractionModel", "run", "DEFAULT_TURNS", "QUICK_TURNS"]

DEFAULT_TURNS = 20_000
QUICK_TURNS = 2_000
_SPACES = 25
_SESSIONS_PER_SPACE = 4
_SEED_MEMORIES = 40
_T0 = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)

_PEOPLE = ["Ana", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "Jun"]
_THINGS = ["green tea", "pepperoni pizza", "jazz", "chess", "running", "sushi", "sci-fi novels", "hiking", "espresso", "cats"]
_PLACES = ["Porto", "Oslo", "Leeds", "Kyoto", "Lima", "Austin", "Lagos", "Turin", "Hanoi", "Quebec"]
_TEMPLATES = [
    "I really like {thing}.",
    "I moved to {place} last year.",
    "My friend {person} lives in {place}.",
    "I stopped liking {thing}, now I prefer {thing2}.",
    "Remind me to call {person} about {thing}.",
    "We are planning a trip to {place} with {person}.",
    "I work on the {thing} project with {person}.",
    "{person} recommended {thing} to me.",
]
_NOISE = ["ok", "/clear", "???", "thanks!", "HEARTBEAT_OK"]
_KNOWN_LINE = re.compile(r"^\[(k\d+)\](?: \([a-z_]+\))? (.*)$", re.MULTILINE)
_CHANGED = re.compile(r"^I stopped liking (.+?), now I prefer")
_TURN_LINE = re.compile(r"^\[(t\d+)\] [^|]*\| (?:user|assistant|system|tool)(?: [^:]*)?: (.*)$")


class ScriptedExtractionModel:
    """A :class:`memstream.llm.client.ChatModel` that answers at once, reading the prompt it got:
    one memory per new turn (citing it), and ``store`` for judged memories except every
    fifth, which updates its first candidate."""

    model = "scripted-instant"

    def __init__(self) -> None:
        self.extraction_calls = 0
        self.judgment_calls = 0
        self.tokens = {"extraction": 0, "judgment": 0}
        self.known_repeats_skipped = 0
        """New turns not extracted because they repeat a known memory shown in the call."""
        self.links_named = 0

    async def chat_json(
        self,
        system: str,
        user: str,
        *,
        schema: Mapping[str, Any] | None = None,
        schema_name: str = "answer",
    ) -> ChatResult:
        if user.startswith("NEW MEMORIES AND THEIR CANDIDATES"):
            self.judgment_calls += 1
            purpose = "judgment"
            answer = self._judge(user)
        else:
            self.extraction_calls += 1
            purpose = "extraction"
            answer = self._extract(user)
            memories = [m for s in answer["scenes"] for m in s["memories"]]
            self.known_repeats_skipped += answer.pop("skipped", 0)
            self.links_named += sum(len(m["links"]) for m in memories)
        text = json.dumps(answer)
        usage = {"prompt_tokens": (len(system) + len(user)) // 4, "completion_tokens": len(text) // 4}
        self.tokens[purpose] += usage["prompt_tokens"] + usage["completion_tokens"]
        return ChatResult(text=text, model=self.model, usage=usage, latency_ms=0.0, mode="json_schema")

    @staticmethod
    def _extract(user: str) -> dict[str, Any]:
        """One memory per new turn, except a turn that repeats a KNOWN memory word for
        word (counted in ``skipped``); a changed preference links the known memory of
        the old one (``preference_update``)."""
        known_part, new_part = user.split("NEW TURNS", 1) if "NEW TURNS" in user else ("", user)
        known = {m.group(2): m.group(1) for m in _KNOWN_LINE.finditer(known_part)}
        memories = []
        skipped = 0
        for line in new_part.splitlines():
            match = _TURN_LINE.match(line)
            if not match:
                continue
            alias, text = match.groups()
            if text in known:
                skipped += 1
                continue
            links = []
            changed = _CHANGED.match(text)
            if changed:
                old = next((a for content, a in known.items() if changed.group(1) in content), None)
                if old is not None:
                    links.append({"known": old, "relation": "preference_update"})
            memories.append(
                {
                    "content": text,
                    "type": "persona",
                    "priority": 60,
                    "source_ids": [alias],
                    "timestamp": None,
                    "timestamp_start": None,
                    "timestamp_end": None,
                    "entities": [{"name": p, "kind": "person"} for p in _PEOPLE if p in text][:3],
                    "links": links,
                }
            )
        return {"scenes": [{"title": "conversation", "message_ids": [], "memories": memories}], "skipped": skipped}

    @staticmethod
    def _judge(user: str) -> dict[str, Any]:
        decisions = []
        for block in user.split("\n\n")[1:]:
            head = block.split(" ", 1)[0]
            if not head.startswith("N"):
                continue
            number = int(head[1:])
            first = re.search(r"^\s+\[(\d+)\]", block, re.MULTILINE)
            if number % 5 == 0 and first:
                target = int(first.group(1))
                decisions.append(
                    {"new": number, "action": "update", "target": target,
                     "links": [{"target": target, "relation": "preference_update"}], "reason": "newer"}
                )
            else:
                decisions.append({"new": number, "action": "store", "target": None, "links": [], "reason": "new"})
        return {"decisions": decisions}


def _scope(space: int) -> Scope:
    return Scope(team_id=f"team{space}", user_id="bench", agent_id="agent")


def _seed_texts(space: int) -> list[str]:
    rng = random.Random(1000 + space)
    return [
        f"The user likes {rng.choice(_THINGS)} and knows {rng.choice(_PEOPLE)} from {rng.choice(_PLACES)} ({j})."
        for j in range(_SEED_MEMORIES)
    ]


def _turns(n: int, seed: int = 7) -> list[MessageObserved]:
    """Turns over the spaces and sessions: 5% noise the gate drops, 5% repeating a
    stored (seeded) memory word for word, 5% repeating an earlier turn, the rest new."""
    rng = random.Random(seed)
    out: list[MessageObserved] = []
    said: dict[int, list[str]] = {}
    for i in range(n):
        space = i % _SPACES
        session = (i // _SPACES) % _SESSIONS_PER_SPACE
        earlier = said.setdefault(space, [])
        roll = rng.random()
        if roll < 0.05:
            text = rng.choice(_NOISE)
        elif roll < 0.10:
            text = rng.choice(_seed_texts(space))  # already stored: exact dedup across the space
        elif roll < 0.15 and earlier:
            text = rng.choice(earlier)  # said before in this space
        else:
            text = rng.choice(_TEMPLATES).format(
                thing=rng.choice(_THINGS), thing2=rng.choice(_THINGS),
                place=rng.choice(_PLACES), person=rng.choice(_PEOPLE),
            ) + f" ({i})"
            earlier.append(text)
        out.append(
            MessageObserved(
                scope=_scope(space),
                session_id=f"s{session}",
                message_id=f"m{i}",
                role="user",
                speaker="User",
                content=text,
                occurred_at=_T0 + timedelta(seconds=i),
            )
        )
    return out


def _seed(settings: Settings, embedder: Any) -> Any:
    """Project ``_SEED_MEMORIES`` memories into every space (directly, not via Kafka)."""
    store = LanceStore.from_settings(settings.storage, settings.embeddings.dim)
    events: list[PositionedEvent] = []
    for space in range(_SPACES):
        for j, text in enumerate(_seed_texts(space)):
            event = MemoryAdded(scope=_scope(space), memory_id=f"seed-{space}-{j}", content=text, occurred_at=_T0)
            events.append(
                PositionedEvent(position=LogPosition(topic="bench.seed", partition=0, offset=len(events)), event=event)
            )
    result = Projector(store, embedder).apply(events)
    if result.failed:
        raise RuntimeError(f"seeding failed: {result.failed[0][1]}")
    return store


async def _measure(settings: Settings, n: int) -> dict[str, Any]:
    topics = await create_topics(settings)
    embedder = await asyncio.to_thread(build_embedder, settings)
    status(f"seeding {_SPACES} spaces with {_SEED_MEMORIES} memories each")
    store = await asyncio.to_thread(_seed, settings, embedder)

    turns = _turns(n)
    status(f"producing {n:,} turns to {topics.messages}")
    producer = MemstreamProducer(settings.streams, topics=topics, client_id="bench-extractor")
    await producer.start()
    try:
        for start in range(0, n, 2_000):
            await producer.send_many(turns[start : start + 2_000])

        model = ScriptedExtractionModel()
        runner = ExtractorRunner(settings, topics, llm=model, embedder=embedder, store=store, producer=producer)
        status("extracting")
        t_start = time.perf_counter()
        await runner.start()
        first_read: float | None = None
        deadline = time.monotonic() + max(600.0, n / 5)
        while True:
            if first_read is None and runner.stats.turns_read:
                first_read = time.perf_counter()
            done = (
                runner.stats.turns_read >= n
                and runner.buffer.pending_count == 0
                and not runner._jobs
            )
            if done:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"benchmark stalled: {runner.stats.turns_read} read, {runner.buffer.pending_count} pending"
                )
            await asyncio.sleep(0.01)
        t_end = time.perf_counter()
        stats = runner.stats
        await runner.stop()
    finally:
        await producer.stop()
    if stats.extractions_failed:
        raise RuntimeError(f"{stats.extractions_failed} extractions failed; see the log")
    assert first_read is not None
    seconds = t_end - first_read
    return {
        "turns": n,
        "seconds": round(seconds, 3),
        "startup_s": round(first_read - t_start, 3),
        "messages_per_s": round(n / seconds, 1),
        "llm_calls_per_100_messages": round(100.0 * stats.llm_calls / n, 2),
        "embed_calls_per_100_messages": round(100.0 * stats.embed_calls / n, 2),
        "extraction_calls": model.extraction_calls,
        "judgment_calls": model.judgment_calls,
        "windows": stats.extractions,
        "windows_without_memories": stats.extractions_nothing,
        "memories_added": stats.memories_added,
        "events_sent": stats.events_sent,
        "tokens_per_100_messages": round(100.0 * sum(model.tokens.values()) / n, 1),
        "extraction_tokens": model.tokens["extraction"],
        "judgment_tokens": model.tokens["judgment"],
        "known_repeats_skipped": model.known_repeats_skipped,
        "links_named_by_extraction": model.links_named,
    }


def run_known_ab(quick: bool = False, turns: int | None = None) -> dict[str, Any]:
    """``--known-ab``: the same turns without and with the known memories in the
    extraction call (``KNOWN_MEMORIES`` 0, then the default), side by side."""
    without = run(quick, turns, known=0)
    with_known = run(quick, turns)
    keys = ("llm_calls_per_100_messages", "tokens_per_100_messages", "judgment_calls", "memories_added")
    return {
        "without_known": without,
        "with_known": with_known,
        "ratios": {k: round(with_known[k] / without[k], 3) if without[k] else None for k in keys},
    }


def run(quick: bool = False, turns: int | None = None, known: int | None = None) -> dict[str, Any]:
    """Run the benchmark; prints a table and returns the figures (JSON-able). ``known``
    overrides the extractor's ``KNOWN_MEMORIES``."""
    n = turns or (QUICK_TURNS if quick else DEFAULT_TURNS)
    workdir = Path(tempfile.mkdtemp(prefix="memstream-bench-extractor-"))
    settings = bench_settings(workdir, extract_idle_seconds=0.2)
    shown = KNOWN_MEMORIES if known is None else known
    try:
        with mock.patch.object(extractor_module, "KNOWN_MEMORIES", shown):  # every extractor the runner makes
            figures = asyncio.run(_measure(settings, n))
    finally:
        try:
            asyncio.run(delete_topics(settings))
        except Exception as exc:  # noqa: BLE001 - cleanup must not hide the result
            status(f"could not delete the benchmark topics: {exc}")
        shutil.rmtree(workdir, ignore_errors=True)
    figures["machine"] = machine_info()
    figures["window_turns"] = settings.extraction.max_new_turns
    figures["known_memories_shown"] = shown
    print_table(
        f"extractor pipeline, {n:,} turns, instant scripted LLM",
        [
            ("messages_per_s", f"{figures['messages_per_s']:,.1f}", "first turn read -> last window acknowledged"),
            ("llm_calls_per_100_messages", f"{figures['llm_calls_per_100_messages']:.2f}", "extraction + judgment"),
            ("embed_calls_per_100_messages", f"{figures['embed_calls_per_100_messages']:.2f}", "one per window"),
            ("windows", f"{figures['windows']:,}", f"{figures['windows_without_memories']:,} without a qualifying turn"),
            ("memories_added", f"{figures['memories_added']:,}", "exact repeats and noise emit none"),
            ("tokens_per_100_messages", f"{figures['tokens_per_100_messages']:,.0f}", "prompt + completion, len/4"),
            ("known_repeats_skipped", f"{figures['known_repeats_skipped']:,}", "not extracted: a known memory"),
            ("startup_s", f"{figures['startup_s']:.2f}", "consumer group join, not in the rate"),
        ],
    )
    return figures

