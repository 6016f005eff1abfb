"""Trust for system events written before the worker signed its records.

A log written before signatures existed holds unsigned system events (lessons, expiries,
judgment links, the extractor's memories) that a replay would now dead-letter. The
operator says, once and explicitly, where that unsigned past ends: ``memstream
trust-legacy`` reads the end offset of every partition of the events topic and writes
them to ``legacy-trust.json`` beside the worker key (mode 0600). The projector and
``memstream replay`` then accept an unsigned system event only at an offset below its
partition's recorded end; above it, and whenever there is no file, such an event is
dead-lettered as before. Nothing is trusted by default.

Why a file and not a compacted topic: whoever can produce to Kafka could write such a
topic, and Kafka producers are exactly who the signature does not trust; the file is
as hard to write as the worker key it sits beside, and is distributed the same way.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from memstream.settings import StreamsConfig
from memstream.streams.admin import topic_partitions
from memstream.streams.topics import Topics
from memstream.streams.connect import kafka_options

__all__ = [
    "FILE_NAME",
    "LegacyTrust",
    "LegacyTrustError",
    "legacy_trust_path",
    "load_legacy_trust",
    "record_legacy_trust",
    "trusted_before",
]

FILE_NAME = "legacy-trust.json"

LegacyTrust = Mapping[tuple[str, int], int]
"""``(topic, partition) -> offset``: unsigned system events below it are trusted."""


class LegacyTrustError(ValueError):
    """The trust file cannot be used (malformed, writable by others) or written."""


def legacy_trust_path(worker_key_file: Path) -> Path:
    return worker_key_file.parent / FILE_NAME


def trusted_before(trust: LegacyTrust | None, topic: str, partition: int, offset: int) -> bool:
    """True when an unsigned system event at this position is in the trusted past."""
    return trust is not None and offset < trust.get((topic, partition), 0)


def load_legacy_trust(worker_key_file: Path) -> dict[tuple[str, int], int]:
    """The positions recorded beside ``worker_key_file``; empty (trust nothing) when there
    is no file. Raises :class:`LegacyTrustError` for a file that is malformed or writable
    by others."""
    path = legacy_trust_path(worker_key_file)
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise LegacyTrustError(f"{path}: cannot read ({exc.strerror})") from None
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise LegacyTrustError(f"{path}: writable by others, so it cannot say what to trust (chmod 600)")
    try:
        data = json.loads(text)
        topic = data["topic"]
        ends = {int(p): int(o) for p, o in data["ends"].items()}
        keys = data.get("keys") or {}
        key_ends = {(str(keys["topic"]), 0): int(keys["end"])} if keys else {}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise LegacyTrustError(f"{path}: not a legacy trust file (JSON with topic and ends)") from None
    if not isinstance(topic, str) or any(p < 0 or o < 0 for p, o in ends.items()):
        raise LegacyTrustError(f"{path}: not a legacy trust file (JSON with topic and ends)")
    return {**{(topic, p): o for p, o in ends.items()}, **key_ends}


async def record_legacy_trust(streams: StreamsConfig, *, extend: bool = False) -> dict[tuple[str, int], int]:
    """Record the events topic's current end offsets as the end of the trusted past and
    return them. Refuses to move an existing record unless ``extend``."""
    path = legacy_trust_path(streams.worker_key_file)
    if path.exists() and not extend:
        held = load_legacy_trust(streams.worker_key_file)
        raise LegacyTrustError(
            f"{path} already trusts unsigned system events below {_describe(held)}; pass --extend to move that to the log's end"
        )
    broker = streams.broker
    topic = Topics.from_settings(broker).events
    partitions = (await topic_partitions(broker, [topic])).get(topic)
    if not partitions:
        raise LegacyTrustError(f"the topic {topic} does not exist at {broker.bootstrap_servers}")
    consumer = AIOKafkaConsumer(**kafka_options(broker), client_id="memstream-trust-legacy")
    await consumer.start()
    keys_tp = TopicPartition(Topics.from_settings(broker).keys, 0)
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in partitions])
        keys_end = int((await consumer.end_offsets([keys_tp]))[keys_tp]) if streams.security.sealing else 0
    finally:
        await consumer.stop()
    by_partition = {tp.partition: int(offset) for tp, offset in ends.items()}
    _write(path, topic, by_partition, (keys_tp.topic, keys_end))
    return {**{(topic, p): o for p, o in by_partition.items()}, (keys_tp.topic, 0): keys_end}


def _write(path: Path, topic: str, ends: dict[int, int], keys: tuple[str, int]) -> None:
    """The file; ``keys`` is the key topic and its end: unsigned key records and
    tombstones below it (written before the worker signed them) are trusted too."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "topic": topic,
        "ends": {str(p): o for p, o in sorted(ends.items())},
        "keys": {"topic": keys[0], "end": keys[1]},
        "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(body, fh, indent=1)
        fh.write("\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)  # readers see the old record or the new one, never half


def _describe(trust: LegacyTrust) -> str:
    return ", ".join(f"{t}[{p}] offset {o}" for (t, p), o in sorted(trust.items())) or "nothing"
