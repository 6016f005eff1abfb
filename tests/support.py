"""Helpers several test packages share: free loopback ports, reading a topic from the
start, and waiting for a condition with an upper bound.

One copy each, so every test waits and reads the same way. The bounds only keep a
broken broker from hanging a test; no test asserts anything about time.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord

__all__ = ["SAFETY_S", "free_port", "read_records", "wait_until", "json_paths"]

SAFETY_S = 60.0
"""Upper bound of a wait on the broker, so a broken broker fails the test instead of
hanging it."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def read_records(
    bootstrap: str, topic: str, count: int, *, timeout: float = SAFETY_S
) -> list[ConsumerRecord[bytes, bytes]]:
    """The records of ``topic`` from offset 0 until ``count`` were read (or ``timeout``
    passed): no consumer group, so every partition is assigned, each read in order."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    try:
        records: list[ConsumerRecord[bytes, bytes]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(records) < count and loop.time() < deadline:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                records.extend(batch)
        return records
    finally:
        await consumer.stop()


async def wait_until(predicate: Callable[[], object], timeout: float = 30.0, what: str = "condition") -> None:
    """Return once ``predicate()`` is true; fail the test after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def json_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (keys and list indexes) into a JSON tree, for mutation fuzzing."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out.extend(json_paths(value, prefix + (key,)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out.extend(json_paths(value, prefix + (index,)))
    return out
