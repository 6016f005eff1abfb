"""Turns the extractor holds when their subject is forgotten never come back: not from a
window waiting for more turns, not from an LLM call in flight. Nothing of them is
written, no key is made for the forgotten subject, and the subject's later writes (a
new life, under a new key) are extracted as usual. Real broker, real LanceDB, the
scripted LLM endpoint behind the real ``openai`` client; the log is sealed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

import pytest
from tests.domain.extraction.helpers import memory as mem
from tests.fakes.openai_server import FakeOpenAI, Reply, fake_llm  # noqa: F401 - the fixture
from tests.support import read_to_end, wait_until

from memstream.domain.events import MessageObserved, Scope
from memstream.llm.client import LLMClient
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.store.lance_store import LanceStore
from memstream.sealing import Subject, is_sealed, sealed_header, sealed_kid
from memstream.services.extraction import extractor as extractor_module
from memstream.services.extraction.service import ExtractorRunner
from memstream.settings.model import Settings
from memstream.streams.sealing.forget import forget
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.topics import Topics

pytestmark = [pytest.mark.kafka]

ALICE = Scope(team_id="acme", user_id="alice", agent_id="bot")
BOB = Scope(team_id="acme", user_id="bob", agent_id="bot")
T0 = datetime(2024, 5, 8, 15, 30, tzinfo=timezone.utc)


def _turn(scope: Scope, mid: str, content: str) -> MessageObserved:
    return MessageObserved(scope=scope, session_id="s1", message_id=mid, role="user", speaker="X", content=content, occurred_at=T0)


def _one_memory_per_turn(delay: float) -> Any:
    """The model: one memory per new turn, quoting it, after ``delay`` seconds."""

    def respond(body: dict[str, Any]) -> Reply:
        user = body["messages"][1]["content"]
        if "NEW MEMORIES AND THEIR CANDIDATES" in user:
            count = user.count("\nN") + (1 if user.startswith("N") else 0)
            decisions = [{"new": i + 1, "action": "store", "target": None, "links": [], "reason": "new"} for i in range(count)]
            return Reply(json_value={"decisions": decisions})
        memories = []
        for line in user.split("NEW TURNS", 1)[1].splitlines():
            if line.startswith("[t"):
                memories.append(mem(f"Said: {line.split(': ', 1)[1]}", [line[1 : line.index("]")]]))
        return Reply(json_value={"scenes": [{"title": "Chat", "message_ids": [], "memories": memories}]}, delay=delay)

    return respond


async def _event_records(settings: Settings, topics: Topics) -> list[tuple[bytes, bytes]]:
    """(record key, value) of everything in the events topic."""
    records = await read_to_end(settings.broker.bootstrap_servers, [topics.events], topics.partitions)
    return [(r.key or b"", r.value or b"") for r in records]


async def _keys_of(settings: Settings, topics: Topics, subject: Subject) -> list[bytes]:
    async with SubjectKeys(settings.streams, topics, client_id="test-keys") as keys:
        assert keys.keyring is not None
        return keys.keyring.kids_of(subject)


async def _send(settings: Settings, turns: list[MessageObserved]) -> None:
    """Through a fresh SDK producer (its keyring read from the start: no stale key)."""
    async with MemstreamProducer(settings.streams, client_id="test-sdk") as producer:
        await producer.send_many(turns)


def _sealed_memories(records: list[tuple[bytes, bytes]], space: bytes) -> list[bytes]:
    """The key ids of the sealed MemoryAdded records of one space."""
    return [
        sealed_kid(v) for k, v in records if k == space and is_sealed(v) and sealed_header(v).type == "MemoryAdded"
    ]


@pytest.fixture
async def sealed(fresh_topics: Topics, settings_for: Any, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Settings, FakeOpenAI]]:  # noqa: F811
    settings = settings_for(
        fresh_topics,
        sealing=True,
        llm_base_url=fake_llm.base_url,
        llm_model="fake-model",
        llm_timeout_s=20.0,
        extract_min_new_turns=2,
        extract_idle_seconds=600.0,  # a lone turn waits: held in memory
    )
    monkeypatch.setattr(extractor_module, "KNOWN_MEMORIES", 0)
    yield settings, fake_llm


async def _runner(settings: Settings, topics: Topics) -> ExtractorRunner:
    store = await asyncio.to_thread(LanceStore.from_settings, settings.storage, settings.embeddings.dim)
    runner = ExtractorRunner(
        settings, topics, llm=LLMClient.from_settings(settings), embedder=LocalEmbedder(settings.embeddings.dim), store=store
    )
    await runner.start()
    return runner


async def test_a_waiting_window_of_a_forgotten_subject_is_dropped_and_its_next_life_extracted(
    sealed: tuple[Settings, FakeOpenAI], fresh_topics: Topics
) -> None:
    settings, fake = sealed
    fake.chat.responder = _one_memory_per_turn(0.0)
    canary = f"zq{uuid.uuid4().hex[:10]}"
    runner = await _runner(settings, fresh_topics)
    try:
        await _send(settings, [_turn(ALICE, "a1", f"{canary} my pin is 1234"), _turn(BOB, "b1", "bob likes tea")])
        await wait_until(lambda: runner.stats.turns_read == 2, what="both turns buffered")
        old = await _keys_of(settings, fresh_topics, Subject("acme", "alice"))

        await forget(settings.streams, "acme", "alice")
        await wait_until(lambda: runner.stats.forgotten_turns == 1, what="alice's held turn dropped")
        await runner.drain()  # every held window due now: alice's must not be among them
        records = await _event_records(settings, fresh_topics)
        assert not _sealed_memories(records, b"acme/alice")
        assert len(_sealed_memories(records, b"acme/bob")) == 1
        assert await _keys_of(settings, fresh_topics, Subject("acme", "alice")) == []

        # alice writes again: a new life under a new key, extracted as usual
        await _send(settings, [_turn(ALICE, "a2", "I moved to Lyon"), _turn(ALICE, "a3", "I run on Sundays")])
        await wait_until(lambda: runner.stats.memories_added == 3, what="alice's new turns extracted")
        new = await _keys_of(settings, fresh_topics, Subject("acme", "alice"))
        assert new and not set(new) & set(old)
        records = await _event_records(settings, fresh_topics)
        assert sorted(set(_sealed_memories(records, b"acme/alice"))) == new
    finally:
        await runner.stop()
    assert canary not in str(fake.chat.requests[-1])  # the new life's window never saw the old turn


async def test_an_llm_call_in_flight_when_the_subject_is_forgotten_writes_nothing(
    sealed: tuple[Settings, FakeOpenAI], fresh_topics: Topics
) -> None:
    settings, fake = sealed
    fake.chat.responder = _one_memory_per_turn(3.0)  # long enough to forget meanwhile
    runner = await _runner(settings, fresh_topics)
    try:
        await _send(settings, [_turn(ALICE, "a1", "my pin is 1234"), _turn(ALICE, "a2", "my dog is Rex")])
        await wait_until(lambda: fake.chat.count == 1, what="the extraction call under way")
        await forget(settings.streams, "acme", "alice")
        await wait_until(lambda: runner.stats.extractions == 1, what="the call answered")
        records = await _event_records(settings, fresh_topics)
        assert not _sealed_memories(records, b"acme/alice")
        assert runner.extractor is not None and runner.extractor.sources is not None
        assert runner.extractor.sources.dropped_windows == 1
        assert await _keys_of(settings, fresh_topics, Subject("acme", "alice")) == []
        # the forget is written to messages too (a barrier there): the commit passes it and the turns
        await wait_until(lambda: sum(runner.committed().values()) >= 2, what="the commit past the dropped turns")
    finally:
        await runner.stop()
