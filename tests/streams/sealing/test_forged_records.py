"""Holes 1-3 of the Kafka side, tried as an attacker would on the real broker: a
forged ``SubjectForgotten``, forged key records and tombstones, and hostile headers.
Each does nothing to any tenant: dead-lettered or ignored (and counted), never a
dropped key, a deleted row, a stalled partition or a process that cannot start."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from tests.support import read_to_end

from memstream.bench._common import WorkerProcess
from memstream.codec.wire import encode_event
from memstream.domain.events import MemoryAdded, Scope, SubjectForgotten
from memstream.metrics import FORGED_RECORDS
from memstream.projections.projector.forget import subject_where
from memstream.projections.store.lance_store import LanceStore, StoreError
from memstream.projections.store.table_sets import TableSets
from memstream.sealing import Subject
from memstream.sealing.keyring import key_record_key
from memstream.services.replay.rebuild import replay
from memstream.streams.dead_letters.publisher import parse_dead_letter
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.topics import Topics

pytestmark = pytest.mark.kafka

ALICE = Scope(team_id="acme", user_id="alice")
BOB = Scope(team_id="globex", user_id="bob")


def _forged(kind: str, log: str) -> float:
    return FORGED_RECORDS.labels(log=log, kind=kind)._value.get()


async def _send_raw(settings, topic: str, records: list[tuple[bytes | None, bytes | None, list]]) -> None:  # type: ignore[no-untyped-def,type-arg]
    """Records written by a plain Kafka producer: what anyone with producer rights can do."""
    raw = AIOKafkaProducer(bootstrap_servers=settings.broker.bootstrap_servers)
    await raw.start()
    try:
        for key, value, headers in records:
            await raw.send_and_wait(topic, value, key=key, headers=headers, partition=0 if topic.endswith("keys") else None)
    finally:
        await raw.stop()


def _forged_forget(victim_kid: bytes) -> tuple[bytes, bytes, list]:  # type: ignore[type-arg]
    """The issue's record: plaintext on ``events``, keyed globex/bob, naming alice's key."""
    event = SubjectForgotten(scope=BOB, whole_team=False, key_ids=(victim_kid.hex(),), producer="memstream-forget")
    rec = encode_event(event)
    return rec.key, rec.value, rec.headers


async def _events_records(settings, topic: str) -> list:  # type: ignore[no-untyped-def,type-arg]
    return [r for r in await read_to_end(settings.broker.bootstrap_servers, [topic], settings.broker.partitions)]


async def test_a_forged_subject_forgotten_drops_no_key(fresh_topics: Topics, settings_for) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(fresh_topics, sealing=True)
    async with SubjectKeys(settings.streams) as keys:
        alice_kid = (await keys.key_for(Subject("acme", "alice"))).kid
        await _send_raw(settings, fresh_topics.events, [_forged_forget(alice_kid)])
        before = _forged("forget", "events")
        records = await _events_records(settings, fresh_topics.events)
        await keys.prepare((r.value, r.headers) for r in records)  # what every reader does before decoding
        assert keys.keyring.by_kid(alice_kid) is not None  # type: ignore[union-attr]
        assert _forged("forget", "events") == before + 1


async def test_forged_key_records_never_shred_and_never_stop_a_start(fresh_topics: Topics, settings_for) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(fresh_topics, sealing=True)
    bob = Subject("globex", "bob")
    async with SubjectKeys(settings.streams) as keys:
        bob_kid = (await keys.key_for(bob)).kid
    before = (_forged("tombstone", "keys"), _forged("key", "keys"))
    bogus_key = key_record_key(Subject("acme", "mallory"), b"\x01" * 16)
    [original] = [r for r in await read_to_end(settings.broker.bootstrap_servers, [fresh_topics.keys], 1) if r.value]
    await _send_raw(
        settings,
        fresh_topics.keys,
        [
            (original.key, original.value, []),  # bob's real key record, copied without its signature
            (key_record_key(bob, bob_kid), None, []),  # a forged tombstone: a permanent crypto-shred on main
            (bogus_key, json.dumps({"wrapped": "AAAA", "wrapped_by": "deadbeefdeadbeef"}).encode(), []),
        ],
    )
    async with SubjectKeys(settings.streams) as later:  # starts (on main: a misleading master-key error)
        assert later.keyring.by_kid(bob_kid) is not None  # type: ignore[union-attr]
        assert later.keyring.forgotten_subjects("globex") == []  # type: ignore[union-attr]
    assert (_forged("tombstone", "keys"), _forged("key", "keys")) >= (before[0] + 1, before[1] + 1)


def _memories(settings, scope: Scope) -> set[str]:  # type: ignore[no-untyped-def]
    try:
        store = LanceStore.from_settings(settings.storage, settings.embeddings.dim, TableSets(settings.storage.root).current(), create=False)
        rows = store.table("memories").search().where(subject_where(scope.team_id, scope.user_id)).limit(None).to_list()
    except StoreError:
        return set()
    return {r["memory_id"] for r in rows}


async def _until(check, what: str, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.3)


async def _dead_reasons(settings, topics: Topics) -> dict[tuple[str, int, int], str]:  # type: ignore[no-untyped-def]
    out = {}
    for r in await read_to_end(settings.broker.bootstrap_servers, [topics.dead_letter], 1):  # one partition
        dl = parse_dead_letter(r.key, r.value, r.headers)
        out[(dl.source_topic, dl.source_partition, dl.source_offset)] = dl.reason
    return out


@pytest.mark.slow
async def test_hostile_records_on_a_live_worker_leave_every_tenant_whole(
    fresh_topics: Topics, settings_for, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(fresh_topics, embedder="local", embedding_dim=32, sealing=True)
    async with MemstreamProducer(settings.streams) as producer:
        await producer.send_many([MemoryAdded(scope=s, memory_id="m1", content=f"{s.user_id} likes tea") for s in (ALICE, BOB)])
    worker = WorkerProcess(settings, tmp_path / "worker", services=["projector", "sealer"])
    worker.start()
    try:
        await _until(lambda: _memories(settings, ALICE) == {"m1"} and _memories(settings, BOB) == {"m1"}, "first memories")
        async with SubjectKeys(settings.streams) as keys:
            await keys.sync()
            alice_kid = keys.keyring.kids_of(Subject("acme", "alice"))[0]  # type: ignore[union-attr]
        hostile = [
            _forged_forget(alice_kid),  # hole 1
            (b"globex/bob", b"{not json", [("memstream-opened", b"zz")]),  # hole 3
            (b"globex/bob", b"\xff\xfe", [("memstream-type", b"MemoryAdded"), ("memstream-type", b"\xff")]),
            (b"globex/bob", None, [("memstream-unopened", b"")]),
        ]
        await _send_raw(settings, fresh_topics.events, hostile)
        await _send_raw(settings, fresh_topics.ingress, [(b"acme/alice", b'{"type":"MemoryAdded"}', [("memstream-opened", b"zz")])])
        async with MemstreamProducer(settings.streams) as producer:  # the next good records, both tenants
            await producer.send_many([MemoryAdded(scope=s, memory_id="m2", content=f"{s.user_id} likes jazz") for s in (ALICE, BOB)])
        await _until(lambda: _memories(settings, ALICE) == {"m1", "m2"} and _memories(settings, BOB) == {"m1", "m2"}, "the next memories")
        dead = await _dead_reasons(settings, fresh_topics)
        for _ in range(100):  # the sealer's dead letter of the ingress record may come a moment later
            if any(topic == fresh_topics.ingress for topic, _, _ in dead):
                break
            await asyncio.sleep(0.3)
            dead = await _dead_reasons(settings, fresh_topics)
        refused = [reason for (topic, _, _), reason in dead.items() if topic == fresh_topics.events]
        assert len(refused) >= 4 and all(reason.strip() and "\n" not in reason for reason in refused)
        assert any("memstream-opened" in reason for (topic, _, _), reason in dead.items() if topic == fresh_topics.ingress)
    finally:
        worker.stop()
    replayed = settings.model_copy(update={"lance_dir": tmp_path / "replayed"})
    await replay(replayed)  # on main: "forgotten subjects skipped", alice gone for good
    assert _memories(replayed, ALICE) == {"m1", "m2"} and _memories(replayed, BOB) == {"m1", "m2"}


async def test_a_key_written_before_signatures_is_still_forgotten_by_its_own_tombstone(
    fresh_topics: Topics, settings_for
) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(fresh_topics, sealing=True)
    old = Subject("acme", "olga")
    async with SubjectKeys(settings.streams) as keys:
        await keys.key_for(Subject("acme", "alice"))  # a signed key: the master key exists
        _, record_key, value = keys.keyring.new_key(old)  # type: ignore[union-attr]
    await _send_raw(settings, fresh_topics.keys, [(record_key, value, [])])  # unsigned, as before signatures
    async with SubjectKeys(settings.streams) as node:
        assert node.keyring.key_for(old) is not None  # type: ignore[union-attr]  # it unwraps: taken in
    await _send_raw(settings, fresh_topics.keys, [(record_key, None, [])])  # and its unsigned forget
    async with SubjectKeys(settings.streams) as later:
        assert later.keyring.key_for(old) is None  # type: ignore[union-attr]  # forgotten, never resurrected
        assert later.keyring.key_for(Subject("acme", "alice")) is not None  # type: ignore[union-attr]
