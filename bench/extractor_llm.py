"""``memstream bench extractor --llm-url URL``: extraction against a real model server.

Where ``bench extractor`` measures memstream's own overhead with an instant scripted
model, this runs the same production path (the real :class:`ExtractorRunner` on the
real broker, LanceDB, the local embedder) against any OpenAI-compatible endpoint, and
reports what a real model does to it: how many windows it turned into memories, what
the weak-output rules had to repair or drop, its latency, and whether the pipeline
stayed live (no turn lost, no partition's commit stalled).

The conversations are built in (:func:`conversations`): short sessions of four user
turns, each stating plain personal facts (a move, a job, a relative, a habit, a
request about answers), over three memory spaces; ``--quick`` runs 6 sessions (24
turns), the full run 20 (80 turns). Each session is one window.

Figures (the last line's JSON):

* ``turns``, ``windows``, ``windows_with_memories``, ``fallback_windows`` (windows
  stored by the heuristic after the model failed them);
* ``windows_by_model`` (memories the model wrote), ``windows_by_fallback``,
  ``windows_declared_empty`` (the model's explicit "nothing"), of which
  ``declared_empty_with_facts`` (turns that plainly state facts; such a window falls
  back unless ``extract_declared_empty_fallback`` is off), ``windows_failed`` (failed
  attempts, retried); ``model_answered``: false when no window was extracted or
  declared empty by the model: the run then warns and ``memstream bench extractor``
  exits non-zero;
* ``turns_lost``: turns the run is done with that no memory cites (by source id, or in
  the provenance of the memories the model wrote from their window), that the quality
  gate did not reject, and whose window the model did not explicitly declare empty;
  ``turns_pending``: turns still waiting for a successful extraction when the run ends;
* ``invented_ids_dropped``, ``hallucination_suspects``, ``type_repairs``: the
  weak-output rules' counts (:mod:`memstream.domain.weak_output`, from the process's
  ``memstream_extraction_repairs`` metric);
* ``llm_p50_ms`` (and p90, max): latency of each chat call, refusals included;
* ``max_partition_stall_s``: the longest time any partition's extraction commit stood
  still while turns behind it waited, sampled every 0.1 s;
* ``output_mode``: the mode the client settled on for this endpoint and model.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import statistics
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY

from memstream.bench._events import bench_settings, create_topics, delete_topics, machine_info, print_table, status
from memstream.domain.events import MessageObserved, Scope
from memstream.llm import ChatResult, LLMClient
from memstream.projections.embedders import build_embedder
from memstream.projections.store import LanceStore
from memstream.services.extraction import ExtractorRunner
from memstream.settings import Settings
from memstream.streams.producers.producer import MemstreamProducer

__all__ = ["conversations", "TimedChat", "TurnAccount", "account_turns", "StallMeter", "run"]

QUICK_SESSIONS = 6
DEFAULT_SESSIONS = 20
_SPACES = 3
_T0 = datetime(2026, 3, 2, 18, 0, tzinfo=timezone.utc)

_NAMES = ["Alice", "Bruno", "Chiara", "Dmitri", "Esther", "Farid", "Greta", "Hiro", "Ines", "Jonas"]
_PLACES = ["Lisbon", "Porto", "Oslo", "Leeds", "Kyoto", "Lima", "Austin", "Turin"]
_JOBS = ["nurse", "baker", "teacher", "software engineer", "architect", "pharmacist"]
_THINGS = ["green tea", "jazz", "chess", "sushi", "hiking", "sci-fi novels", "cycling", "gardening"]
_RELATIVES = ["sister", "brother", "mother", "cousin"]
_TURNS = [
    "Hi, I'm {name}. I moved to {place} last month to start a new job as a {job}.",
    "My {relative} {other} lives in {place2} and visits me every Sunday.",
    "I really love {thing}, I spend most evenings on it.",
    "Please keep your answers short and always give me the key point first.",
]
_REACTIONS = [
    "I'm allergic to peanuts, so please never suggest recipes with them.",
    "I run five kilometres every morning before work.",
    "I have a dog called Pepper who is three years old.",
    "I am learning Japanese for a trip to {place2} in October.",
]


def conversations(sessions: int, seed: int = 24) -> list[list[MessageObserved]]:
    """``sessions`` short conversations of four user turns each (see the module
    docstring), deterministic for a seed."""
    rng = random.Random(seed)
    out: list[list[MessageObserved]] = []
    for i in range(sessions):
        name = _NAMES[i % len(_NAMES)]
        scope = Scope(team_id="bench", user_id=f"user{i % _SPACES}", agent_id="assistant")
        values = {
            "name": name,
            "place": rng.choice(_PLACES),
            "place2": rng.choice(_PLACES),
            "job": rng.choice(_JOBS),
            "relative": rng.choice(_RELATIVES),
            "other": rng.choice([n for n in _NAMES if n != name]),
            "thing": rng.choice(_THINGS),
        }
        texts = [t.format(**values) for t in _TURNS[:3]]
        texts.append(rng.choice([*_REACTIONS, _TURNS[3]]).format(**values))
        out.append(
            [
                MessageObserved(
                    scope=scope,
                    session_id=f"s{i}",
                    message_id=f"s{i}-m{j}",
                    role="user",
                    speaker=name,
                    content=text,
                    occurred_at=_T0 + timedelta(days=i, minutes=j),
                )
                for j, text in enumerate(texts)
            ]
        )
    return out


class TimedChat:
    """A :class:`memstream.llm.client.ChatModel` that times every call of the client it wraps."""

    def __init__(self, inner: LLMClient) -> None:
        self.inner = inner
        self.model = inner.model
        self.latencies_ms: list[float] = []

    async def chat_json(
        self,
        system: str,
        user: str,
        *,
        schema: Mapping[str, Any] | None = None,
        schema_name: str = "answer",
    ) -> ChatResult:
        start = time.perf_counter()
        try:
            return await self.inner.chat_json(system, user, schema=schema, schema_name=schema_name)
        finally:
            self.latencies_ms.append((time.perf_counter() - start) * 1000)


@dataclass
class TurnAccount:
    """Where every turn of a run ended up (message ids; see :func:`account_turns`)."""

    cited: set[str] = field(default_factory=set)
    read: set[str] = field(default_factory=set)
    gated: set[str] = field(default_factory=set)
    declared_empty: set[str] = field(default_factory=set)
    pending: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)
    windows: int = 0
    windows_with_memories: int = 0
    fallback_windows: int = 0


def _is_fallback(outcome: Any) -> bool:
    """A window the model failed and the heuristic stored (the runner marks it)."""
    if getattr(outcome, "fallback", False):
        return True
    return any(m.provenance is not None and m.provenance.method == "heuristic" for m in outcome.memories)


def account_turns(turns: Iterable[str], outcomes: Iterable[Any], pending: Iterable[str]) -> TurnAccount:
    """Sort every turn into: ``cited`` (a memory's source), ``read`` (in the provenance
    inputs of the memories written from its window), ``gated`` (the quality gate kept
    it out), ``declared_empty`` (its window's answer was an explicit "nothing to
    remember"), ``pending`` (still waiting) or else ``lost``."""
    account = TurnAccount()
    consumed: set[str] = set()
    for outcome in outcomes:
        account.windows += 1
        memories = outcome.memories
        if memories:
            account.windows_with_memories += 1
        if _is_fallback(outcome):
            account.fallback_windows += 1
        consumed.update(outcome.consumed)
        for memory in memories:
            account.cited.update(memory.source_message_ids)
            if memory.provenance is not None:
                account.read.update(memory.provenance.input_refs)
        for item in outcome.record:
            if "gate" in item and item.get("gate") != "passed":
                account.gated.add(str(item.get("message_id")))
            if item.get("issue") == "nothing_to_remember":
                account.declared_empty.update(outcome.consumed)
    waiting = set(pending)
    for turn in turns:
        if turn in waiting and turn not in account.cited:
            account.pending.add(turn)
        elif not ({turn} & (account.cited | account.read | account.gated | account.declared_empty)):
            account.lost.add(turn)
    return account


class StallMeter:
    """The longest time a partition's committed offset stood still below its end."""

    def __init__(self, ends: Mapping[tuple[str, int], int]) -> None:
        self.ends = dict(ends)
        self.since: dict[tuple[str, int], tuple[int, float]] = {}
        self.max_stall_s = 0.0

    def sample(self, committed: Mapping[tuple[str, int], int], now: float) -> None:
        for key, end in self.ends.items():
            offset = committed.get(key, -1)
            last = self.since.get(key)
            if last is None or last[0] != offset:
                self.since[key] = (offset, now)
                continue
            if offset < end:
                self.max_stall_s = max(self.max_stall_s, now - last[1])

    def done(self, committed: Mapping[tuple[str, int], int]) -> bool:
        return all(committed.get(key, -1) >= end for key, end in self.ends.items())


def _issue(outcome: Any, kind: str) -> bool:
    return any(item.get("issue") == kind for item in outcome.record)


def _by_whom(outcomes: Sequence[Any]) -> dict[str, Any]:
    """Who made each finished window: the model (memories it wrote), the fallback, or
    nobody because the model declared it empty; ``model_answered`` is false when no
    window got a usable answer from the model at all."""
    finished = [o for o in outcomes if o.status != "failed"]
    by_model = sum(1 for o in finished if o.method == "llm" and not _is_fallback(o) and o.memories)
    declared = sum(1 for o in finished if _issue(o, "nothing_to_remember"))
    return {
        "windows_by_model": by_model,
        "windows_by_fallback": sum(1 for o in finished if _is_fallback(o)),
        "windows_declared_empty": declared,
        "declared_empty_with_facts": sum(1 for o in finished if _issue(o, "declared_empty_with_facts")),
        "model_answered": by_model + declared > 0,
    }


def _repairs() -> dict[str, int]:
    out = {}
    for kind, name in (
        ("type_repair", "type_repairs"),
        ("invented_id_dropped", "invented_ids_dropped"),
        ("hallucination_suspect", "hallucination_suspects"),
    ):
        value = REGISTRY.get_sample_value("memstream_extraction_repairs_total", {"kind": kind})
        out[name] = int(value or 0)
    return out


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def _measure(settings: Settings, sessions: int, deadline_s: float) -> dict[str, Any]:
    topics = await create_topics(settings)
    embedder = await asyncio.to_thread(build_embedder, settings.embeddings)
    store = await asyncio.to_thread(LanceStore.from_settings, settings.storage, settings.embeddings.dim)
    turns = [t for conversation in conversations(sessions) for t in conversation]
    client = LLMClient.from_settings(settings)
    chat = TimedChat(client)
    producer = MemstreamProducer(settings.streams, topics=topics, client_id="bench-extractor-llm")
    await producer.start()
    before = _repairs()
    try:
        positions = await producer.send_many(turns)
        ends: dict[tuple[str, int], int] = {}
        for p in positions:
            key = (p.topic, p.partition)
            ends[key] = max(ends.get(key, 0), p.offset + 1)
        runner = ExtractorRunner(settings, topics, llm=chat, embedder=embedder, store=store, producer=producer)
        runner.stats.recent = deque()  # every outcome, for the account
        meter = StallMeter(ends)
        status(f"extracting {len(turns)} turns in {sessions} sessions with {settings.extraction.llm_model} at {settings.extraction.llm_base_url}")
        t0 = time.monotonic()
        await runner.start()
        try:
            while not meter.done(runner.committed()) and time.monotonic() - t0 < deadline_s:
                meter.sample(runner.committed(), time.monotonic())
                await asyncio.sleep(0.1)
            meter.sample(runner.committed(), time.monotonic())
            seconds = time.monotonic() - t0
            outcomes = list(runner.stats.recent)
            # not consumed by any outcome: waiting for a retry, or in flight at the deadline
            pending = {t.message_id for t in turns} - {mid for o in outcomes for mid in o.consumed}
        finally:
            await runner.stop()
    finally:
        await producer.stop()
        await client.close()
    after = _repairs()
    account = account_turns((t.message_id for t in turns), outcomes, pending)
    latencies = chat.latencies_ms
    return {
        "turns": len(turns),
        "turns_lost": len(account.lost),
        "turns_pending": len(account.pending),
        "turns_cited": len(account.cited & {t.message_id for t in turns}),
        "windows": account.windows,
        "windows_with_memories": account.windows_with_memories,
        "fallback_windows": account.fallback_windows,
        **_by_whom(outcomes),
        "windows_failed": sum(1 for o in outcomes if o.status == "failed"),
        "memories_added": sum(len(o.memories) for o in outcomes),
        **{name: after[name] - before[name] for name in after},
        "llm_calls": len(latencies),
        "llm_p50_ms": round(statistics.median(latencies), 1) if latencies else 0.0,
        "llm_p90_ms": round(_pct(latencies, 0.9), 1),
        "llm_max_ms": round(max(latencies, default=0.0), 1),
        "max_partition_stall_s": round(meter.max_stall_s, 2),
        "seconds": round(seconds, 2),
        "output_mode": client.output_mode,
        "refused_modes": list(client.refused_modes),
        "model": settings.extraction.llm_model,
    }


def run(
    llm_url: str,
    llm_model: str | None = None,
    quick: bool = False,
    sessions: int | None = None,
    timeout_s: float = 120.0,
    max_tokens: int = 768,
) -> dict[str, Any]:
    """Run the benchmark against ``llm_url``; prints a table and returns the figures."""
    n = sessions or (QUICK_SESSIONS if quick else DEFAULT_SESSIONS)
    workdir = Path(tempfile.mkdtemp(prefix="memstream-bench-extractor-llm-"))
    overrides: dict[str, Any] = {
        "llm_base_url": llm_url,
        "llm_timeout_s": timeout_s,
        "llm_max_tokens": max_tokens,
        "extract_min_new_turns": 4,
        "extract_idle_seconds": 1.0,
    }
    if llm_model:
        overrides["llm_model"] = llm_model
    settings = bench_settings(workdir, **overrides)
    try:
        figures = asyncio.run(_measure(settings, n, deadline_s=max(600.0, 120.0 * n)))
    finally:
        try:
            asyncio.run(delete_topics(settings))
        except Exception as exc:  # noqa: BLE001 - cleanup must not hide the result
            status(f"could not delete the benchmark topics: {exc}")
        shutil.rmtree(workdir, ignore_errors=True)
    figures["machine"] = machine_info()
    print_table(
        f"extraction against {settings.extraction.llm_model} at {llm_url}, {figures['turns']} turns",
        [
            ("turns_lost", str(figures["turns_lost"]), f"{figures['turns_pending']} still pending"),
            ("windows_by_model", f"{figures['windows_by_model']} / {figures['windows']}",
             f"{figures['windows_by_fallback']} by the fallback, {figures['windows_failed']} failed attempts"),
            ("windows_declared_empty", str(figures["windows_declared_empty"]),
             f"{figures['declared_empty_with_facts']} of them although their turns state facts"),
            ("type_repairs", str(figures["type_repairs"]), "types not one of the seven"),
            ("invented_ids_dropped", str(figures["invented_ids_dropped"]), "cited ids not in the window"),
            ("hallucination_suspects", str(figures["hallucination_suspects"]), "memories sharing no word with their sources"),
            ("llm_p50_ms", f"{figures['llm_p50_ms']:,.0f}", f"p90 {figures['llm_p90_ms']:,.0f}, {figures['llm_calls']} calls"),
            ("max_partition_stall_s", f"{figures['max_partition_stall_s']:.1f}", "longest commit standstill"),
            ("output_mode", figures["output_mode"], "refused: " + (", ".join(figures["refused_modes"]) or "none")),
        ],
    )
    if not figures["model_answered"]:
        status(
            f"WARNING: the model answered nothing usable: 0 of {figures['windows']} windows extracted or declared "
            f"empty by {settings.extraction.llm_model} ({figures['windows_by_fallback']} stored by the fallback)"
        )
    return figures
