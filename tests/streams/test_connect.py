"""Starting a Kafka client while the broker is unreachable: retried, not fatal."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from tests.support import free_port

from memstream.streams import connect
from memstream.streams.connect import until_reachable, until_started


async def test_a_client_is_retried_until_the_broker_answers(kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first attempts point at a port where nothing listens (a real connection
    refusal from aiokafka); then the broker is "back" (the real one)."""
    monkeypatch.setattr(connect, "_FIRST_DELAY_S", 0.05)
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    targets = [dead, dead, kafka_bootstrap]
    tried: list[str] = []

    def make() -> AIOKafkaProducer:
        target = targets[min(len(tried), len(targets) - 1)]
        tried.append(target)
        return AIOKafkaProducer(bootstrap_servers=target, request_timeout_ms=2000)

    producer = await until_started(make, "test producer", max_delay_s=0.1)
    try:
        assert tried == [dead, dead, kafka_bootstrap]
        assert producer.client.cluster.brokers()  # bootstrapped: it knows the broker
    finally:
        await producer.stop()


async def test_other_errors_fail_at_once() -> None:
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("bad configuration")

    with pytest.raises(ValueError):
        await until_reachable(attempt, "test")
    assert calls == 1


async def test_waiting_stops_when_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connect, "_FIRST_DELAY_S", 0.01)

    async def attempt() -> None:
        raise KafkaConnectionError("unreachable")

    task = asyncio.ensure_future(until_reachable(attempt, "test", max_delay_s=0.02))
    await asyncio.sleep(0.1)
    assert not task.done()  # still retrying
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
