"""``memstream bench reflection``: settling pending decisions through the real reflector.

What it measures, on the configured broker (``MEMSTREAM_BROKER_BOOTSTRAP_SERVERS``), with
private topics that are deleted afterwards:

1. ``N`` decisions (10,000; 2,000 with ``--quick``) spread over 40 memory spaces and 250
   subjects are produced and wait, pending, in the reflector's changelog-backed Faust
   tables. ``pending_table_mb`` is the in-memory size of those tables then (keys and
   JSON values, measured object by object; MiB), ``pending_bytes_per_decision`` the same
   per decision.
2. ``N`` outcomes, one per decision, are produced. ``settled_per_s`` is ``N`` divided by
   the time from the first outcome sent to the last ``MemoryReflected`` acknowledged on
   the events topic: forwarding, settling, one (instant, scripted) LLM call per decision
   through the real prompt rendering and answer parsing, the candidate's round trip
   through the work topic, and the durable emit.

The LLM is scripted in process and answers at once, so the figure is the reflector's
own overhead, not a model's latency. Every reflection is checked on the events topic
(exactly ``N``, one per decision) before the figures are reported.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any


from memstream.domain.events import DecisionRecorded, EventBase, OutcomeObserved, Rating, Scope, utcnow
from memstream.llm import ChatResult
from memstream.services.app import build_app
from memstream.services.reflection import LLMReflectionWriter, ReflectorHandle, register_reflector
from memstream.settings import Settings, get_settings
from memstream.streams.admin import ensure_topics
from memstream.streams.clients import create_admin, create_consumer
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.topics import Topics

__all__ = ["ScriptedChat", "deep_sizeof", "run"]

_SPACES = 40
_SUBJECTS = 250
_RATINGS = list(Rating)


class ScriptedChat:
    """A :class:`memstream.llm.client.ChatModel` that answers every reflection at once."""

    model = "scripted-instant"

    def __init__(self) -> None:
        self.calls = 0
        self._answer = json.dumps(
            {
                "reflection": "The call was judged on its alpha over the full horizon. "
                "The recorded reasoning matched what happened.",
                "lesson": "Keep weighing the same evidence the same way.",
            }
        )

    async def chat_json(
        self,
        system: str,
        user: str,
        *,
        schema: Mapping[str, Any] | None = None,
        schema_name: str = "answer",
    ) -> ChatResult:
        self.calls += 1
        return ChatResult(
            text=self._answer,
            model=self.model,
            usage={"prompt_tokens": len(user) // 4, "completion_tokens": 40},
        )


def deep_sizeof(obj: Any) -> int:
    """Bytes held by ``obj`` and everything it references (each object counted once)."""
    seen: set[int] = set()
    stack = [obj]
    total = 0
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
    return total


def _say(line: str) -> None:
    print(line, flush=True)


async def _wait(condition: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"benchmark stalled: {what} not reached within {timeout:.0f} s")
        await asyncio.sleep(0.02)


async def _send_in_chunks(producer: MemstreamProducer, events: Sequence[EventBase], size: int = 500) -> None:
    """Send in chunks: encoding 10,000 events at once would hold the event loop (which
    the worker under test shares) for a second or more."""
    for start in range(0, len(events), size):
        await producer.send_many(events[start : start + size])
        await asyncio.sleep(0)


def _scope(i: int) -> Scope:
    return Scope(team_id=f"team{i % _SPACES}", user_id="bench", agent_id="agent")


async def _count_reflections(settings: Settings, topic: str, expected: int) -> int:
    consumer = create_consumer(settings.broker, topic, client_id="memstream-bench", auto_offset_reset="earliest")
    await consumer.start()
    ids: set[bytes] = set()
    try:
        deadline = time.monotonic() + 60
        while len(ids) < expected and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500, max_records=5000)
            for records in batch.values():
                for rec in records:
                    if dict(rec.headers).get("memstream-type") == b"MemoryReflected":
                        ids.add(rec.value)
        # a little longer: a duplicate would arrive now
        for _ in range(3):
            batch = await consumer.getmany(timeout_ms=300, max_records=5000)
            for records in batch.values():
                for rec in records:
                    if dict(rec.headers).get("memstream-type") == b"MemoryReflected":
                        ids.add(rec.value)
    finally:
        await consumer.stop()
    return len(ids)


async def _delete_topics(settings: Settings, prefix: str, app_id: str) -> None:
    admin = create_admin(settings.broker, client_id="memstream-bench")
    await admin.start()
    try:
        names = [t for t in await admin.list_topics() if t.startswith(prefix) or t.startswith(f"{app_id}-")]
        if names:
            await admin.delete_topics(names)
    finally:
        await admin.close()


async def _run(n: int) -> dict[str, Any]:
    base = get_settings()
    tag = uuid.uuid4().hex[:8]
    home = Path(tempfile.mkdtemp(prefix="memstream-bench-reflection-"))
    settings = base.model_copy(
        update={
            "topic_prefix": f"bench-{tag}.",
            "app_id": f"bench-reflection-{tag}",
            "home": home,
            "lance_dir": home / "lance",
            "reflection_poll_seconds": 1.0,
        }
    )
    topics = Topics.from_settings(settings.broker)
    await ensure_topics(settings.broker.bootstrap_servers, topics)
    chat = ScriptedChat()
    app = build_app(settings, services=[])
    handle: ReflectorHandle = register_reflector(
        app, settings, topics, writer=LLMReflectionWriter(chat, retries=0), provider=None, concurrency=8
    )
    deadline = utcnow() + timedelta(days=365)
    decided = utcnow() - timedelta(days=10)
    try:
        await app.start()
        _say(f"reflection bench: {n:,} decisions, {topics.partitions} partitions, broker {settings.broker.bootstrap_servers}")
        decisions = [
            DecisionRecorded(
                scope=_scope(i),
                occurred_at=decided,
                decision_id=f"d{i}",
                subject=f"SYM{i % _SUBJECTS}",
                rating=_RATINGS[i % len(_RATINGS)],
                decision_text=f"Decision {i}: the evidence on SYM{i % _SUBJECTS} points one way; "
                "earnings revisions, flows and valuation were weighed.",
                horizon_days=5,
                deadline=deadline,
            )
            for i in range(n)
        ]
        outcomes = [
            OutcomeObserved(
                scope=_scope(i),
                outcome_id=f"o{i}",
                decision_id=f"d{i}",
                subject=f"SYM{i % _SUBJECTS}",
                raw_return=((i % 21) - 10) / 200,
                benchmark_return=0.01,
                alpha=((i % 21) - 10) / 200 - 0.01,
                horizon_days=5,
            )
            for i in range(n)
        ]
        async with MemstreamProducer(streams=settings.streams, client_id="memstream-bench") as producer:
            started = time.perf_counter()
            await _send_in_chunks(producer, decisions)
            # len() of a Faust table is O(1); counting states would scan it every poll
            await _wait(lambda: len(handle.core.decisions) >= n, "all decisions pending", 600)
            pending_s = time.perf_counter() - started
            # Values are replaced, never mutated, so shallow copies are stable snapshots;
            # the walk over every object runs in a thread to keep the worker's loop free.
            snapshots = [dict(t.items()) for t in (handle.core.decisions, handle.core.subjects, handle.core.early)]
            size = sum([await asyncio.to_thread(deep_sizeof, snap) for snap in snapshots])
            _say(f"  {n:,} decisions pending after {pending_s:.1f} s; tables hold {size / 2**20:.1f} MiB")

            started = time.perf_counter()
            await _send_in_chunks(producer, outcomes)
            await _wait(lambda: handle.stats.get("reflected", 0) >= n, "all decisions reflected", 900)
            settle_s = time.perf_counter() - started
        _say(f"  {n:,} decisions settled and reflected in {settle_s:.1f} s ({n / settle_s:,.0f}/s)")
        emitted = await _count_reflections(settings, topics.events, n)
        if emitted != n or chat.calls != n:
            raise RuntimeError(f"expected {n} reflections from {n} LLM calls; found {emitted} from {chat.calls}")
        _say(f"  checked: {emitted:,} MemoryReflected on {topics.events}, {chat.calls:,} LLM calls")
        return {
            "decisions": n,
            "partitions": topics.partitions,
            "settled_per_s": round(n / settle_s, 1),
            "settle_seconds": round(settle_s, 2),
            "decisions_pending_per_s": round(n / pending_s, 1),
            "pending_table_mb": round(size / 2**20, 2),
            "pending_bytes_per_decision": round(size / n),
            "llm_calls": chat.calls,
            "reflections": emitted,
        }
    finally:
        await app.stop()
        try:
            await _delete_topics(settings, settings.broker.topic_prefix, settings.worker.app_id)
        except Exception as exc:  # noqa: BLE001 - cleanup must not hide the result
            _say(f"  (could not delete the bench topics: {exc})")


def run(quick: bool = False, decisions: int | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the figures (the CLI prints them as the last line)."""
    n = decisions or (2_000 if quick else 10_000)
    return asyncio.run(_run(n))
