"""Helpers several test packages share: free loopback ports, reading a topic from the
start, waiting for a condition with an upper bound, and the strategies of the
mutation fuzzing that the fast read paths' contract tests share.

One copy each, so every test waits and reads the same way. The bounds only keep a
broken broker from hanging a test; no test asserts anything about time.
"""

from __future__ import annotations

import asyncio
import copy
import socket
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from hypothesis import strategies as st

__all__ = [
    "SAFETY_S", "free_port", "read_records", "wait_until", "json_paths", "json_values", "mutate",
    "event_strategies",
]

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


async def read_to_end(bootstrap: str, topics: Sequence[str], partitions: int) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of ``topics`` (``partitions`` each) up to their end offsets as of
    now, partition by partition: no consumer group."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[ConsumerRecord[bytes, bytes]] = []
        for tp in tps:
            while await consumer.position(tp) < ends[tp]:
                out.extend((await consumer.getmany(tp, timeout_ms=1000)).get(tp, ()))
        return out
    finally:
        await consumer.stop()


def record_bytes(record: ConsumerRecord[bytes, bytes]) -> bytes:
    """A record's key, value and header values as one blob (for raw canary scans)."""
    return b"".join([record.key or b"", record.value or b"", *(v or b"" for _, v in record.headers or ())])


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


def json_values(tricky: list[Any], keys: list[str]) -> Any:
    """A hypothesis strategy of JSON values for mutation fuzzing: scalars, ``tricky``
    values (fresh copies: a mutation test edits them in place), and lists and objects
    of them whose keys are often the record's own field names ``keys``."""
    leaves = st.sampled_from(tricky).map(copy.deepcopy)
    return st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12) | leaves,
        lambda inner: st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=6) | st.sampled_from(keys), inner, max_size=4),
        max_leaves=12,
    )


def mutate(data: Any, body: dict[str, Any], values: Any) -> dict[str, Any]:
    """``body`` after one to three random edits drawn from ``data`` (a hypothesis
    ``st.data()``): a value anywhere in the tree replaced by one of ``values``, or a
    key deleted."""
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        path = data.draw(st.sampled_from(json_paths(body)), label="path")
        parent: Any = body
        for part in path[:-1]:
            parent = parent[part]
        action = data.draw(st.sampled_from(["replace", "delete"]), label="action")
        if action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(values, label="value")
    return body


def event_strategies() -> tuple[Any, Any, Any]:
    """Hypothesis strategies for generated events: texts (valid UTF-8, no lone
    surrogates), ids (the ``Identifier`` alphabet) and aware times (UTC or any zone,
    1900-2200)."""
    texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=40)
    ids = st.from_regex(r"[A-Za-z0-9_.:@/+=-]{1,20}", fullmatch=True)
    times = st.datetimes(
        min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1),
        timezones=st.sampled_from([timezone.utc]) | st.timezones(),
    )
    return texts, ids, times
