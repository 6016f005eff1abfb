"""Interoperability: records from a non-Python client (Kafka's own Java console
producer) are accepted, and the ``produce`` / ``tail`` commands work end to end."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.partitioner import DefaultPartitioner
from tests.support import SAFETY_S, read_records

from memstream.domain.events import MemoryAdded, MessageObserved, Scope
from memstream.settings.model import Settings
from memstream.streams.consumer import EventConsumer
from memstream.streams.dead_letters.publisher import DeadLetter, DeadLetterPublisher
from memstream.streams.producers.producer import MemstreamProducer
from memstream.codec.wire import decode_record, encode_event
from memstream.streams.topics import Topics

pytestmark = pytest.mark.kafka



def kafka_libs() -> Path:
    """The directory of Kafka's jars: the broker tooling's cache (what `.ci/run` and
    `memstream broker start` use); ``MEMSTREAM_KAFKA_LIBS`` points elsewhere for a
    broker started from other jars; else the cache is filled from Maven Central."""
    from memstream.streams.broker import local

    settings = Settings()
    libs = local.jar_dir(settings.resolved_kafka_cache_dir, settings.broker.kafka_version)
    if local.jar_cache_complete(libs):
        return libs
    override = os.environ.get("MEMSTREAM_KAFKA_LIBS")
    if override:
        return Path(override)
    return local.ensure_jars(settings.resolved_kafka_cache_dir, settings.broker.kafka_version)


def console_produce(bootstrap: str, topic: str, lines: list[str], *, with_headers: bool) -> None:
    """Send lines with Kafka's Java ConsoleProducer (``key<TAB>value``, optionally
    ``headers<TAB>key<TAB>value``)."""
    java = shutil.which("java")
    if java is None:
        pytest.fail("java is not on PATH (the broker needs it too)")
    command = [
        java,
        "-Xmx128m",
        "-cp",
        f"{kafka_libs()}/*",
        "org.apache.kafka.tools.ConsoleProducer",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--property",
        "parse.key=true",
        "--property",
        "key.separator=\t",
        "--producer-property",
        "acks=all",
    ]
    if with_headers:
        command += ["--property", "parse.headers=true"]
    done = subprocess.run(
        command, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=SAFETY_S, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]


def memstream_cli(args: list[str], settings: Settings, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real command line in a child process (``python -m memstream``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")}
    env.update(
        MEMSTREAM_BROKER_BOOTSTRAP_SERVERS=settings.broker.bootstrap_servers,
        MEMSTREAM_BROKER_TOPIC_PREFIX=settings.broker.topic_prefix,
        MEMSTREAM_BROKER_PARTITIONS=str(settings.broker.partitions),
        COLUMNS="200",
    )
    done = subprocess.run(
        [sys.executable, "-m", "memstream", *args],
        input=stdin,
        capture_output=True,
        cwd=cwd,
        env=env,
        timeout=SAFETY_S,
        check=False,
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace")
    )


def _wire(body: dict[str, object]) -> str:
    return json.dumps(body, ensure_ascii=False)


async def test_events_from_the_java_console_producer_are_accepted(
    kafka_bootstrap: str, fresh_topics: Topics, settings_for
) -> None:
    settings = settings_for(fresh_topics)
    turn_id, legacy_id, bad_id = (str(uuid.uuid4()) for _ in range(3))
    turn = {
        "type": "MessageObserved",
        "schema_version": 1,
        "event_id": turn_id,
        "occurred_at": "2025-01-31T09:30:00+01:00",
        "scope": {"team_id": "acme", "user_id": "ana", "agent_id": "java-bot"},
        "message_id": "java-1",
        "content": "Sent by Kafka's Java client: ünïcödé, commas, and colons: ok",
    }
    # an old-version memory, as a producer that never upgraded would still send it
    legacy = {
        "type": "MemoryAdded",
        "schema_version": 1,
        "event_id": legacy_id,
        "occurred_at": "2025-01-31T09:31:00Z",
        "scope": {"team_id": "acme", "user_id": "ana"},
        "memory_id": "java-mem-1",
        "content": "Ana prefers green tea",
        "kind": "preference",
    }
    bad = {**legacy, "event_id": bad_id, "priority": 101, "schema_version": 2, "memory_type": "persona"}
    bad.pop("kind")
    console_produce(kafka_bootstrap, fresh_topics.events, [f"acme/ana\t{_wire(turn)}"], with_headers=False)
    console_produce(
        kafka_bootstrap,
        fresh_topics.events,
        [
            f"memstream-type:MemoryAdded,memstream-schema-version:1,content-type:application/json\tacme/ana\t{_wire(legacy)}",
            f"memstream-type:MemoryAdded,memstream-schema-version:2\tacme/ana\t{_wire(bad)}",
        ],
        with_headers=True,
    )

    async with EventConsumer(fresh_topics.events, group_id=None, streams=settings.streams) as consumer:
        events, dead = [], []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SAFETY_S
        async for batch in consumer.batches(timeout_ms=500):
            events += batch.events
            dead += batch.dead
            if len(events) + len(dead) >= 3 or loop.time() > deadline:
                break

    assert [str(pe.event.event_id) for pe in events] == [turn_id, legacy_id], "in order, both accepted"
    first, second = events[0].event, events[1].event
    assert isinstance(first, MessageObserved)
    assert first.content == turn["content"]
    assert first.scope == Scope(team_id="acme", user_id="ana", agent_id="java-bot")
    assert first.occurred_at.isoformat() == "2025-01-31T08:30:00+00:00", "stored in UTC"
    assert isinstance(second, MemoryAdded)
    assert second.schema_version == 2 and second.memory_type == "persona", "upcast from v1"
    # Java's partitioner and ours agree: the same space lands on the same partition
    expected_partition = DefaultPartitioner()(b"acme/ana", [0, 1, 2], [0, 1, 2])
    assert {pe.position.partition for pe in events} == {expected_partition}
    # the invalid one is a dead letter, not a crash
    assert len(dead) == 1 and "priority" in dead[0].reason
    assert json.loads(dead[0].original_value or b"")["event_id"] == bad_id


async def test_produce_command_reports_bad_lines_and_sends_the_good_ones(
    kafka_bootstrap: str, fresh_topics: Topics, settings_for, tmp_path: Path
) -> None:
    settings = settings_for(fresh_topics)
    lines = [
        _wire({"type": "MemoryAdded", "scope": {"team_id": "acme", "user_id": "ana"}, "memory_id": "cli-1", "content": "Ana likes jazz"}),
        "",
        "this is not json",
        _wire({"type": "MessageObserved", "scope": {"team_id": "acme"}, "message_id": "cli-msg", "content": "hello"}),
        _wire({"type": "MemoryAdded", "scope": {"team_id": "acme"}, "memory_id": "cli-x", "content": "x", "priority": 500}),
        "\udcff",  # a non-UTF-8 byte (written below with surrogateescape)
        _wire({"type": "MemoryAdded", "schema_version": 1, "scope": {"team_id": "acme"}, "memory_id": "cli-2", "content": "old style", "kind": "episode"}),
        _wire({"type": "MemoryAdded", "memory_id": "cli-3", "content": "no scope"}),
    ]
    path = tmp_path / "events.jsonl"
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogateescape") + b"\n")

    done = memstream_cli(["produce", str(path)], settings, tmp_path)
    assert done.returncode == 1, done.stderr
    errors = done.stderr.strip().splitlines()
    assert errors[0].startswith("line 3: not JSON")
    assert errors[1].startswith("line 5: ") and "priority" in errors[1]
    assert errors[2].startswith("line 6: not UTF-8")
    assert errors[3].startswith("line 8: scope")
    assert len(errors) == 4, done.stderr
    assert "sent 3 events" in done.stdout and "rejected 4 lines" in done.stdout

    memories = await read_records(kafka_bootstrap, fresh_topics.events, 2)
    decoded = [decode_record(r.value, r.headers) for r in sorted(memories, key=lambda r: r.offset)]
    assert sorted(e.memory_id for e in decoded if isinstance(e, MemoryAdded)) == ["cli-1", "cli-2"]
    legacy = next(e for e in decoded if isinstance(e, MemoryAdded) and e.memory_id == "cli-2")
    assert legacy.memory_type == "episodic" and legacy.schema_version == 2
    turns = await read_records(kafka_bootstrap, fresh_topics.messages, 1)
    assert len(turns) == 1 and decode_record(turns[0].value).message_id == "cli-msg"  # type: ignore[attr-defined]

    # stdin, an explicit short topic name, and all lines valid: exit code 0
    line = _wire({"type": "MessageObserved", "scope": {"team_id": "acme"}, "message_id": "stdin-1", "content": "hi"})
    done = memstream_cli(["produce", "-", "--topic", "events"], settings, tmp_path, stdin=line.encode() + b"\n")
    assert done.returncode == 0, done.stderr
    assert "sent 1 event" in done.stdout and "rejected 0 lines" in done.stdout
    memories = await read_records(kafka_bootstrap, fresh_topics.events, 3)
    assert any(getattr(decode_record(r.value), "message_id", None) == "stdin-1" for r in memories)


def test_produce_command_errors_are_one_line(fresh_topics: Topics, settings_for, tmp_path: Path) -> None:
    settings = settings_for(fresh_topics)
    done = memstream_cli(["produce", str(tmp_path / "missing.jsonl")], settings, tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "missing.jsonl" in done.stderr
    assert "Traceback" not in done.stderr

    line = _wire({"type": "MessageObserved", "scope": {"team_id": "acme"}, "message_id": "m", "content": "hi"})
    missing = f"{fresh_topics.prefix}no-such-topic"
    done = memstream_cli(["produce", "-", "--topic", missing], settings, tmp_path, stdin=line.encode())
    assert done.returncode == 1
    assert f"{missing} does not exist" in done.stderr and "Traceback" not in done.stderr


async def test_tail_prints_events_and_dead_letters(
    kafka_bootstrap: str, fresh_topics: Topics, settings_for, tmp_path: Path
) -> None:
    settings = settings_for(fresh_topics)
    scope = Scope(team_id="acme", user_id="ana")
    async with MemstreamProducer(settings.streams, topics=fresh_topics) as producer:
        first = await producer.add_memory(scope, "Ana plays the cello", memory_id="tail-1")
        second = await producer.add_memory(scope, "Ana lives in Lyon", memory_id="tail-2")
    async with DeadLetterPublisher(fresh_topics.dead_letter, streams=settings.streams) as publisher:
        await publisher.publish(
            DeadLetter(
                reason="not JSON: Expecting value at line 1 column 1",
                source_topic=fresh_topics.events,
                source_partition=1,
                source_offset=17,
                original_value=b"garbage!",
                original_key=b"acme/ana",
            )
        )

    done = memstream_cli(["tail", "events", "--from-beginning", "--no-follow"], settings, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "MemoryAdded" in done.stdout and "tail-1" in done.stdout and "tail-2" in done.stdout
    assert done.stdout.index("tail-1") < done.stdout.index("tail-2"), "partition order"

    done = memstream_cli(["tail", "dead-letter", "--from-beginning", "--no-follow"], settings, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "DEAD LETTER" in done.stdout
    assert "not JSON: Expecting value" in done.stdout
    assert f"{fresh_topics.events}:1:17" in done.stdout and "garbage!" in done.stdout

    partition = second.position.partition
    done = memstream_cli(
        ["tail", fresh_topics.events, "--offset", str(second.position.offset), "--partition", str(partition), "--max", "1", "--raw"],
        settings,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.encode() == encode_event(second.event).value + b"\n"
    assert first.position.offset == second.position.offset - 1

    typo = f"{fresh_topics.prefix}evnets"
    done = memstream_cli(["tail", typo, "--no-follow"], settings, tmp_path)
    assert done.returncode == 1 and "does not exist" in done.stderr
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        assert typo not in await admin.list_topics(), "looking at a typo must not create it"
    finally:
        await admin.close()
    done = memstream_cli(["tail", "events", "--from-beginning", "--offset", "3"], settings, tmp_path)
    assert done.returncode == 1 and "either" in done.stderr
