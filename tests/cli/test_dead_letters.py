"""``memstream dead-letters`` on the real broker: a producer's bad record sent to the
ingress (sealing on, the default) is listed with its full reason opened by the master
key of the host, counted by stable code and stage, filtered by topic, time and space;
without the master key it stays sealed. ``memstream tail ingress`` takes the short name."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from typer.testing import CliRunner, Result

from memstream.cli import CLIError, app
from memstream.cli.dead_letters import parse_time
from memstream.settings.model import Settings, get_settings, settings_env
from memstream.streams.consumer import EventConsumer
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.sealing.sealer import IngressSealer
from memstream.streams.topics import Topics

pytestmark = [pytest.mark.kafka]


def cli(settings: Settings, *args: str, **env: str) -> Result:
    """The command in this process (typer's runner), with exactly ``settings``."""
    get_settings.cache_clear()
    try:
        return CliRunner().invoke(app, list(args), env={**settings_env(settings), **env})
    finally:
        get_settings.cache_clear()


async def acli(settings: Settings, *args: str, **env: str) -> Result:
    return await asyncio.to_thread(cli, settings, *args, **env)


def lines(run: Result) -> list[dict]:  # type: ignore[type-arg]
    assert run.exit_code == 0, f"{run.output}{run.exception!r}"
    return [json.loads(line) for line in run.stdout.splitlines() if line.strip()]


async def test_an_operator_reads_counts_and_filters_sealed_dead_letters(
    fresh_topics: Topics, settings_for, tmp_path: Path
) -> None:
    settings = settings_for(fresh_topics, sealing=True)
    canary = f"zq{uuid.uuid4().hex[:8]}"
    misnamed = {  # docs/producers.md's MemoryAdded with "content" misspelt
        "type": "MemoryAdded", "schema_version": 2, "event_id": str(uuid.uuid4()), "occurred_at": "2026-12-01T10:00:00Z",
        "scope": {"team_id": "acme", "user_id": "alice"}, "memory_id": "m-1", "contnet": f"{canary} window seats",
    }
    producer = AIOKafkaProducer(bootstrap_servers=settings.broker.bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(fresh_topics.ingress, json.dumps(misnamed).encode(), key=b"acme/alice",
                                     headers=[("memstream-type", b"MemoryAdded"), ("memstream-schema-version", b"2")])
        await producer.send_and_wait(fresh_topics.ingress, b'{"type": "MemoryAdded"}', key=b"acme/bob")
    finally:
        await producer.stop()
    async with SubjectKeys(settings.streams, fresh_topics) as keys:
        await IngressSealer(settings.streams, settings.worker.app_id, keys, fresh_topics).run(until_idle=True)
    async with EventConsumer(fresh_topics.events, group_id=None, streams=settings.streams) as consumer:
        async for batch in consumer.batches(max_records=10, timeout_ms=500):
            if batch.dead:
                break

    listed = lines(await acli(settings, "dead-letters", "list", "--json"))
    by_code = {item["code"]: item for item in listed}
    assert set(by_code) == {"invalid", "not-sealable"}, listed
    decoded = by_code["invalid"]
    assert decoded["sealed"] and decoded["stage"] == "decode" and (decoded["team_id"], decoded["user_id"]) == ("acme", "alice")
    assert "content" in decoded["reason"] and "sealed" not in decoded["reason"]  # opened: the field is named
    assert by_code["not-sealable"]["reason"].startswith("cannot seal") and by_code["not-sealable"]["stage"] == "seal"

    [counted] = lines(await acli(settings, "dead-letters", "count", "--json"))
    assert sorted(counted, key=lambda c: c["code"]) == [
        {"code": "invalid", "stage": "decode", "count": 1}, {"code": "not-sealable", "stage": "seal", "count": 1}
    ]
    assert [i["code"] for i in lines(await acli(settings, "dead-letters", "list", "--json", "--topic", "ingress"))] == ["not-sealable"]
    assert [i["code"] for i in lines(await acli(settings, "dead-letters", "list", "--json", "--topic", "events"))] == ["invalid"]
    assert [i["code"] for i in lines(await acli(settings, "dead-letters", "list", "--json", "--team", "acme", "--user", "alice"))] == ["invalid"]
    assert lines(await acli(settings, "dead-letters", "list", "--json", "--team", "other")) == []
    assert len(lines(await acli(settings, "dead-letters", "list", "--json", "--since", "1h"))) == 2
    assert lines(await acli(settings, "dead-letters", "list", "--json", "--until", "2020-01-01")) == []
    assert lines(await acli(settings, "dead-letters", "list", "--json", "--code", "not-sealable"))[0]["team_id"] == "acme"

    shown = await acli(settings, "dead-letters", "show", str(decoded["offset"]))
    assert canary in json.loads(shown.stdout)["value"], shown.output  # the sealed original, opened
    missing = await acli(settings, "dead-letters", "show", "99")
    assert isinstance(missing.exception, CLIError) and "no dead letter at offset 99" in str(missing.exception)

    # another host (no master key): the letter is listed, its reason stays sealed
    elsewhere = await acli(settings, "dead-letters", "list", "--json", "--topic", "events",
                    MEMSTREAM_SECURITY_MASTER_KEY_FILE=str(tmp_path / "absent.key"))
    [shut] = lines(elsewhere)
    assert shut["code"] == "sealed" and "content" not in shut["reason"] and "master key" in elsewhere.stderr

    # the sealer deleted what it sealed from the ingress: a record sent now is still there
    producer = AIOKafkaProducer(bootstrap_servers=settings.broker.bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(fresh_topics.ingress, json.dumps({**misnamed, "memory_id": canary}).encode(), key=b"acme/alice")
    finally:
        await producer.stop()
    tail = await acli(settings, "tail", "ingress", "--from-beginning", "--no-follow")
    assert tail.exit_code == 0 and canary in tail.stdout, tail.output


def test_times_are_iso_or_an_age() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
    assert parse_time("2h", now) == int(datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc).timestamp() * 1000)
    assert parse_time("2026-12-01T10:00", now) == parse_time("2026-12-01T10:00:00Z", now)
    with pytest.raises(Exception, match="not a time"):
        parse_time("yesterday", now)
