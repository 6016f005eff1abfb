"""The shared keyring on the real broker: two nodes follow ``memstream.keys``."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from memstream.sealing import MasterKeyError, SealedHeader, Subject, UnreadableRecord, open_sealed, seal
from memstream.settings.model import Settings
from memstream.streams.admin import ensure_topics
from memstream.streams.broker import local
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.topics import Topics

pytestmark = pytest.mark.kafka

ALICE = Subject("acme", "alice")
BOB = Subject("acme", "bob")


async def _until(check, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def test_a_key_made_on_one_node_opens_on_another_and_forget_drops_it_everywhere(
    fresh_topics: Topics, settings_for
) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(fresh_topics)
    async with SubjectKeys(settings.streams) as a, SubjectKeys(settings.streams) as b:
        key = await a.key_for(ALICE)
        assert (await a.key_for(ALICE)).kid == key.kid  # the same key (the follower may hold a fresh copy of it)
        await a.key_for(BOB)
        sealed = seal(b'{"c":"canary"}', SealedHeader("e1", "MemoryAdded", 2, "acme", "alice", "default"), key)
        await b.ensure_readable([sealed])
        assert open_sealed(sealed, b.keyring) == b'{"c":"canary"}'  # type: ignore[arg-type]

        assert await b.forget("acme", "alice") == [ALICE]
        await _until(lambda: a.keyring.by_kid(key.kid) is None)  # type: ignore[union-attr]
        with pytest.raises(UnreadableRecord):
            open_sealed(sealed, a.keyring)  # type: ignore[arg-type]
        assert await a.forget("acme", "alice") == []  # twice: nothing left to forget
        assert a.keyring.subjects("acme") == [BOB]  # type: ignore[union-attr]

    # a node started later never sees the forgotten key, and a fresh key is a new one
    async with SubjectKeys(settings.streams) as c:
        assert c.keyring.subjects("acme") == [BOB]  # type: ignore[union-attr]
        assert (await c.key_for(ALICE)).kid != key.kid


async def test_forgetting_a_team_forgets_all_its_users(fresh_topics: Topics, settings_for) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(fresh_topics)
    async with SubjectKeys(settings.streams) as node:
        for s in (ALICE, BOB, Subject("globex", "alice")):
            await node.key_for(s)
        assert await node.forget("acme") == [ALICE, BOB]
    async with SubjectKeys(settings.streams) as later:
        assert later.keyring.subjects("acme") == []  # type: ignore[union-attr]
        assert later.keyring.subjects("globex") == [Subject("globex", "alice")]  # type: ignore[union-attr]


async def test_a_lost_master_key_is_an_error_at_start_never_a_new_key(
    fresh_topics: Topics, settings_for
) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(fresh_topics)
    async with SubjectKeys(settings.streams) as node:
        await node.key_for(ALICE)
    path = settings.resolved_master_key_file
    original = path.read_bytes()
    path.unlink()
    with pytest.raises(MasterKeyError, match="master key lost"):
        await SubjectKeys(settings.streams).start()
    assert not path.exists()

    other = settings_for(fresh_topics, master_key="A" * 43 + "=")  # another key, given by setting
    with pytest.raises(MasterKeyError, match="restore the original master key"):
        await SubjectKeys(other.streams).start()

    path.write_bytes(original)
    async with SubjectKeys(settings.streams) as node:
        assert node.keyring.subjects("acme") == [ALICE]  # type: ignore[union-attr]


@pytest.mark.slow
async def test_a_forgotten_key_leaves_the_brokers_disk_within_the_bound(topic_prefix: str, settings_for) -> None:  # type: ignore[no-untyped-def]
    """The bound of docs/security.md, on the local broker's files: segment roll
    (``Topics.keys_segment_ms``, here 3 s) + the roll record's second + the cleaner's back-off (15 s) +
    ``file.delete.delay.ms`` (1 s)."""
    env = Settings()
    if not local.is_local_bootstrap(env.broker):
        pytest.skip("needs the local broker's data directory")
    segment_ms = 3000
    topics = Topics(topic_prefix, 3, 1, keys_segment_ms=segment_ms)
    await ensure_topics(env.bootstrap_servers, topics)
    settings = settings_for(topics)
    partition_dir = local.BrokerPaths.at(env.resolved_broker_dir).data_dir / f"{topics.keys}-0"

    def holding(needle: bytes) -> list[str]:
        return [p.name for p in partition_dir.iterdir() if p.is_file() and needle in p.read_bytes()]

    async with SubjectKeys(settings.streams, topics) as node:
        await node.key_for(BOB)
        key = await node.key_for(ALICE)
        wrapped = next(v for k, v in await _key_records(settings.broker.bootstrap_servers, topics.keys) if k and key.kid.hex().encode() in k)
        needle = json.loads(wrapped)["wrapped"].encode()
        assert holding(needle)
        await node.forget("acme", "alice")
        bound_s = segment_ms / 1000 + 1 + 15 + 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        while holding(needle):
            assert loop.time() - started < 2 * bound_s, f"still on disk after {2 * bound_s:.0f} s: {holding(needle)}"
            await asyncio.sleep(1)
    async with SubjectKeys(settings.streams) as later:
        assert later.keyring.subjects("acme") == [BOB]  # type: ignore[union-attr]


async def _key_records(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        out: list[tuple[bytes | None, bytes | None]] = []
        while await consumer.position(tp) < end:
            out.extend((r.key, r.value) for r in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, ()))
        return out
    finally:
        await consumer.stop()
