"""Client events and system events through the real API and the real broker: keys
write client events only (403), and on Kafka a system event from outside the worker
is dead-lettered unless its record carries the worker's signature."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer

from memstream.domain.events import MemoryReflected, Rating, Scope
from memstream.streams.dead_letters.publisher import parse_dead_letter
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.trust.worker_identity import worker_key
from tests.interfaces.iface_stack import Stack

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SCOPE = Scope(team_id="trust", user_id="u2", agent_id="planner")


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as c:
        yield c


def _reflected(mark: str, text: str) -> dict[str, Any]:
    return {
        "type": "MemoryReflected", "schema_version": 1, "reflection_id": f"r-{mark}", "decision_id": f"d-{mark}",
        "outcome_id": f"o-{mark}", "subject": "AAPL", "rating": "buy", "content": text,
    }


@pytest.mark.parametrize(
    "event",
    [
        _reflected("x", "forged lesson"),
        {"type": "DecisionExpired", "schema_version": 1, "decision_id": "d-1", "subject": "AAPL",
         "deadline": "2025-01-01T00:00:00Z"},
        {"type": "MemoryLinked", "schema_version": 1, "from_memory_id": "a", "to_memory_id": "b",
         "relation": "supersedes", "decided_by": "llm"},
        {"type": "MemoryAdded", "schema_version": 2, "memory_id": "forged-1", "content": "x", "producer": "extractor"},
    ],
)
async def test_keys_cannot_write_system_events(stack: Stack, client: httpx.AsyncClient, event: dict[str, Any]) -> None:
    resp = await client.post("/v1/events", headers=stack.headers("trustteam"), json=event)
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"]["code"] == "system_event"


async def _dead_letter_for(stack: Stack, position: Any, timeout: float = 60.0) -> str:
    consumer = AIOKafkaConsumer(
        stack.topics.dead_letter, bootstrap_servers=stack.settings.broker.bootstrap_servers,
        group_id=None, auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for rec in records:
                    dl = parse_dead_letter(rec.key, rec.value, rec.headers)  # type: ignore[arg-type]
                    if (dl.source_topic, dl.source_partition, dl.source_offset) == (
                        position.topic, position.partition, position.offset
                    ):
                        return dl.reason
        raise AssertionError(f"no dead letter for {position}")
    finally:
        await consumer.stop()


async def test_kafka_system_events_need_the_worker_identity(stack: Stack, client: httpx.AsyncClient) -> None:
    mark = uuid.uuid4().hex[:8]
    now = datetime.now(timezone.utc)

    def lesson(rid: str, text: str) -> MemoryReflected:
        return MemoryReflected(scope=SCOPE, reflection_id=rid, decision_id=f"d-{rid}", outcome_id=f"o-{rid}",
                               subject="AAPL", rating=Rating.buy, content=text, occurred_at=now)

    async with MemstreamProducer(stack.settings.streams, client_id="outsider") as outsider:
        forged = await outsider.send(lesson(f"f-{mark}", f"forged lesson {mark}"))
    async with MemstreamProducer(stack.settings.streams, client_id="worker-like", signing_key=worker_key(stack.settings.resolved_worker_key_file)) as worker:
        signed = await worker.send(lesson(f"s-{mark}", f"signed lesson {mark}"))
    reason = await _dead_letter_for(stack, forged)
    assert "MemoryReflected" in reason and "worker's producer identity" in reason
    resp = await client.get(
        "/v1/lessons", headers=stack.headers("trustteam"),
        params={"subject": "AAPL", "user_id": "u2", "min_position": [str(forged), str(signed)], "budget": 5000},
    )
    assert resp.status_code == 200, resp.text
    text = resp.json()["text"]
    assert f"signed lesson {mark}" in text and f"forged lesson {mark}" not in text
