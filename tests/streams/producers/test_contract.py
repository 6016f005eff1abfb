"""docs/producers.md against a real broker: kcat with the documented flags puts a
space on the SDK's partition, and a record on another partition (kcat's crc32
default) is re-published to its key's partition by the worker, then projected, never
dead-lettered. Every example writes to the topic the default configuration (sealing
on) reads, and the documented records go through it into the log."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
import uuid
import zlib
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord
from tests.services.test_worker import WorkerProcess, read_dead_letters
from tests.support import read_records

from memstream.domain.events import MemoryAdded, Scope
from memstream.projections.store.lance_store import LanceStore, StoreError
from memstream.settings.model import SecuritySettings
from memstream.streams.consumer import EventConsumer
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.sealing.sealer import IngressSealer
from memstream.streams.rerouting import HEADER_REROUTED_FROM, home_partition
from memstream.codec.wire import encode_event
from memstream.streams.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

DOC = Path(__file__).parents[3] / "docs" / "producers.md"
PARTITIONS = 3


def kcat() -> str:
    path = shutil.which("kcat")
    if path is None:
        pytest.fail("kcat is not installed (`apt-get install kcat`; .ci/run installs it)")
    return path


def documented_kcat_flags() -> list[str]:
    """The flags of the documented kcat command that are not per-deployment values
    (broker, topic, key, file): the partitioner and the headers."""
    block = DOC.read_text().split("### kcat", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    command = " ".join(block.replace("\\\n", " ").split())
    assert command.startswith("kcat -P ")
    flags = re.findall(r"(-X \S+|-H \S+)", command)
    assert "-X topic.partitioner=murmur2_random" in flags
    return [part for flag in flags for part in flag.split(" ", 1)]


def crc32_partition(key: bytes) -> int:
    """librdkafka's consistent_random (kcat's default) for a keyed record."""
    return zlib.crc32(key) % PARTITIONS


def spaces(n: int, *, disagreeing: bool) -> list[Scope]:
    """Memory spaces whose crc32 and murmur2 partitions differ (or agree)."""
    out: list[Scope] = []
    i = 0
    while len(out) < n:
        scope = Scope(team_id="acme", user_id=f"u{uuid.uuid4().hex[:6]}{i}")
        key = scope.space.encode()
        if (crc32_partition(key) != home_partition(key, PARTITIONS)) == disagreeing:
            out.append(scope)
        i += 1
    return out


def kcat_produce(bootstrap: str, topic: str, event: MemoryAdded, flags: list[str], tmp_path: Path) -> None:
    record = encode_event(event)
    body = tmp_path / f"{event.memory_id}.json"
    body.write_bytes(record.value)
    run = subprocess.run(
        [kcat(), "-P", "-b", bootstrap, "-t", topic, "-k", record.key.decode(), *flags, str(body)],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 0, run.stderr


async def sdk_partitions(settings, scopes: list[Scope]) -> dict[str, int]:  # type: ignore[no-untyped-def]
    async with MemstreamProducer(settings.streams) as producer:
        return {
            s.space: (await producer.add_memory(s, f"sdk memory of {s.user_id}")).position.partition for s in scopes
        }


async def test_kcat_with_the_documented_flags_lands_on_the_sdks_partition(
    kafka_bootstrap: str, fresh_topics: Topics, settings_for, tmp_path: Path
) -> None:
    settings = settings_for(fresh_topics)
    scopes = spaces(3, disagreeing=True) + spaces(2, disagreeing=False)
    flags = documented_kcat_flags()
    for s in scopes:
        kcat_produce(kafka_bootstrap, fresh_topics.events, MemoryAdded(scope=s, memory_id=f"k-{s.user_id}", content="x"), flags, tmp_path)
    expected = await sdk_partitions(settings, scopes)
    records = await read_records(kafka_bootstrap, fresh_topics.events, 2 * len(scopes))
    landed: dict[str, set[int]] = {}
    for r in records:
        landed.setdefault(r.key.decode(), set()).add(r.partition)
    assert landed == {space: {p} for space, p in expected.items()}
    # and without the flag kcat would have put the first three elsewhere
    assert all(crc32_partition(s.space.encode()) != expected[s.space] for s in scopes[:3])


async def test_a_record_on_the_wrong_partition_is_rerouted_and_projected(
    kafka_bootstrap: str, fresh_topics: Topics, settings_for, tmp_path: Path
) -> None:
    settings = settings_for(fresh_topics, partitions=PARTITIONS, projector_batch_seconds=0.05)
    scope = spaces(1, disagreeing=True)[0]
    key = scope.space.encode()
    event = MemoryAdded(scope=scope, memory_id="crc", content="Alice prefers aisle seats")
    before = MemoryAdded(scope=scope, memory_id="first", content="sent before, correctly")
    after = MemoryAdded(scope=scope, memory_id="last", content="sent after, correctly")
    async with MemstreamProducer(settings.streams) as producer:
        await producer.send(before)
    # kcat's defaults (crc32), no headers: what a user gets without reading the doc
    kcat_produce(kafka_bootstrap, fresh_topics.events, event, [], tmp_path)
    async with MemstreamProducer(settings.streams) as producer:
        await producer.send(after)

    worker = WorkerProcess(settings, tmp_path)
    worker.start()
    try:
        deadline = time.monotonic() + 90
        found: list[str] = []
        while time.monotonic() < deadline:
            worker.assert_alive()
            try:
                store = LanceStore.from_settings(settings.storage, settings.embeddings.dim, create=False)
            except StoreError:  # the worker is still making its tables, one after another
                store = None
            if store is not None:
                found = sorted(store.table("memories").to_arrow().column("memory_id").to_pylist())
                if "crc" in found:
                    break
            await asyncio.sleep(0.5)
        assert found == ["crc", "first", "last"], worker.log_text()[-3000:]
    finally:
        assert worker.stop() == 0, worker.log_text()[-3000:]
    assert "re-publishing it there" in worker.log_text()

    records: list[ConsumerRecord] = await read_records(kafka_bootstrap, fresh_topics.events, 4)  # type: ignore[type-arg]
    original = [r for r in records if r.partition == crc32_partition(key)]
    home = sorted((r for r in records if r.partition == home_partition(key, PARTITIONS)), key=lambda r: r.offset)
    assert len(original) == 1 and len(home) == 3
    copy = home[-1]  # re-published after the two SDK records it was sent between
    assert copy.key == key and copy.value == original[0].value
    assert dict(copy.headers)[HEADER_REROUTED_FROM] == f"{fresh_topics.events}:{original[0].partition}:{original[0].offset}".encode()
    assert await read_dead_letters(settings, fresh_topics.dead_letter) == []


def documented_examples() -> dict[str, str]:
    """Each example's code block by its heading (kcat, Python, Java, Go, Node)."""
    section = DOC.read_text().split("## Examples", 1)[1].split("## Checking a producer", 1)[0]
    out = {}
    for part in section.split("### ")[1:]:
        heading, rest = part.split("\n", 1)
        out[heading.strip()] = rest.split("```", 2)[1]
    return out


def documented_records() -> list[bytes]:
    """The minimal records the examples send (the JSON block before them)."""
    block = DOC.read_text().split("A minimal `MemoryAdded`", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    records, current = [], ""
    for line in block.strip().splitlines():
        current += line.strip() + " "
        if line.rstrip().endswith("}"):
            records.append(current.strip().encode())
            current = ""
    return records


async def test_every_example_writes_where_the_default_configuration_reads(
    fresh_topics: Topics, settings_for
) -> None:
    examples = documented_examples()
    assert len(examples) == 5, list(examples)
    default = Topics()  # sealing is on by default: the worker reads plain records from the ingress
    for name, code in examples.items():
        assert set(re.findall(r"memstream\.[a-z-]+", code)) == {default.ingress}, name

    assert SecuritySettings.model_fields["sealing"].default is True
    settings = settings_for(fresh_topics, sealing=True)
    records = documented_records()
    assert [json.loads(r)["type"] for r in records] == ["MemoryAdded", "MessageObserved"]
    producer = AIOKafkaProducer(bootstrap_servers=settings.broker.bootstrap_servers)
    await producer.start()
    try:
        for value in records:  # as every example sends it: key and the three headers
            kind = json.loads(value)
            headers = [("memstream-type", kind["type"].encode()), ("memstream-schema-version", str(kind["schema_version"]).encode()),
                       ("content-type", b"application/json")]
            await producer.send_and_wait(fresh_topics.resolve("ingress"), value, key=b"acme/alice", headers=headers)
    finally:
        await producer.stop()
    async with SubjectKeys(settings.streams, fresh_topics) as keys:
        sealer = IngressSealer(settings.streams, settings.worker.app_id, keys, fresh_topics)
        await sealer.run(until_idle=True)
        assert (sealer.sealed, sealer.dead_lettered) == (2, 0)
    read = []
    async with EventConsumer([fresh_topics.events, fresh_topics.messages], group_id=None, streams=settings.streams) as consumer:
        async for batch in consumer.batches(max_records=10, timeout_ms=500):
            read += batch.events
            assert not batch.dead, batch.dead
            if len(read) == 2:
                break
    assert sorted(p.event.type for p in read) == ["MemoryAdded", "MessageObserved"]
    assert {p.event.content for p in read} == {"Alice prefers window seats", "I moved to Lisbon last week"}  # type: ignore[attr-defined]
