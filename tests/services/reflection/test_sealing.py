"""The reflector's own state on a sealed log: its work topic and its tables' changelogs
hold no plaintext of a decision, and forgetting the subject leaves nothing readable
there (entries dropped, records unopenable), while another subject's decision goes on
to its reflection. Real broker, the reflector in a Faust app in this process."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from aiokafka import AIOKafkaConsumer
from tests.services.reflection.test_reflector import reflector_app, wait_for
from tests.support import read_to_end, record_bytes

from memstream.domain.events import Scope, utcnow
from memstream.services.reflection.reflector import DecisionState
from memstream.services.reflection.agent import state_topics
from memstream.settings.model import Settings
from memstream.streams.sealing.forget import forget
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.topics import Topics

pytestmark = [pytest.mark.kafka]

ALICE = Scope(team_id="acme", user_id="alice")
BOB = Scope(team_id="acme", user_id="bob")


async def _topic_names(bootstrap: str) -> set[str]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        return set(await consumer.topics())
    finally:
        await consumer.stop()


async def raw_bytes(bootstrap: str, topics: list[str], partitions: int) -> list[bytes]:
    """Key, value and headers of every record of ``topics``, as one blob each."""
    existing = await _topic_names(bootstrap)
    assert set(topics) <= existing, set(topics) - existing
    return [record_bytes(r) for r in await read_to_end(bootstrap, topics, partitions)]


async def test_the_reflectors_state_is_sealed_and_forgotten_with_its_subject(
    fresh_topics: Topics, settings_for: Callable[..., Settings], kafka_bootstrap: str
) -> None:
    settings = settings_for(fresh_topics, reflection_poll_seconds=0.3, sealing=True)
    canary = f"zq{uuid.uuid4().hex[:10]}"
    later = utcnow() + timedelta(days=30)
    async with reflector_app(settings, provider=None) as handle:
        async with MemstreamProducer(streams=settings.streams) as producer:
            alice_d, bob_d = f"{canary}-d1", f"qz{uuid.uuid4().hex[:10]}-d2"  # decision ids are personal too
            await producer.record_decision(ALICE, alice_d, f"{canary}-subject", "buy", f"{canary} thinks rates fall", later)
            await producer.record_decision(BOB, bob_d, "AAPL", "buy", "Buy AAPL: services compound.", later)
            await wait_for(lambda: handle.core.counts().get("pending") == 2, what="both decisions pending")
            names = state_topics(settings)
            blobs = await raw_bytes(kafka_bootstrap, names, fresh_topics.partitions)
            assert blobs  # the work records and the changelogs exist, and hold no text of a decision
            assert not [b for b in blobs if canary.encode() in b or b"services compound" in b or bob_d.encode() in b]
            bob_key = handle.core.key_of(BOB, bob_d)
            assert bob_key.startswith("acme|bob|#") and bob_d not in bob_key

            await forget(settings.streams, "acme", "alice")
            await wait_for(lambda: handle.stats.get("forgotten_entries", 0) >= 1, what="alice's entry dropped")
            assert handle.core.counts().get("pending") == 1  # alice's entry is gone, its key with it
            assert handle.core.state(bob_key) is DecisionState.pending

            # bob's decision still settles and is reflected
            await producer.observe_outcome(BOB, "o2", "AAPL", 0.05, 5, decision_id=bob_d, benchmark_return=0.02, alpha=0.03)
            await wait_for(lambda: handle.stats.get("reflected", 0) == 1, what="bob's reflection written")
            assert handle.core.state(bob_key) is DecisionState.reflected
    blobs = await raw_bytes(kafka_bootstrap, names, fresh_topics.partitions)
    assert not [b for b in blobs if canary.encode() in b or bob_d.encode() in b]  # nor in the finished marker
