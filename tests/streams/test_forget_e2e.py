"""Forgetting end to end on the real broker and LanceDB: a worker (projector and
sealer) killed around a forget converges after restart, no byte of the forgotten user
is left in the kept-forever topics or the table files, a replay brings nothing back,
and the other user's rows are untouched.

Covers ``forget``."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from memstream.bench._common import WorkerProcess
from memstream.domain.events import MemoryAdded, MessageObserved, Scope
from memstream.projections.forget import SCOPED_TABLES, subject_where
from memstream.services.replay import replay
from memstream.projections.store import LanceStore, StoreError
from memstream.projections.table_sets import TableSets
from memstream.streams.forget import forget
from memstream.streams.producer import MemstreamProducer
from memstream.codec.wire import encode_event
from memstream.streams.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ALICE = Scope(team_id="acme", user_id="alice")
BOB = Scope(team_id="acme", user_id="bob")


def _store(settings) -> LanceStore:  # type: ignore[no-untyped-def]
    return LanceStore.from_settings(settings, TableSets(settings.lance_dir).current(), create=False)


def _count(settings, scope: Scope) -> int:  # type: ignore[no-untyped-def]
    try:
        return len(_rows(_store(settings), scope))
    except StoreError:  # the worker has not made its tables yet
        return -1


def _files_holding(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def _rows(store: LanceStore, scope: Scope) -> dict[str, dict]:  # type: ignore[type-arg]
    out = {}
    for name in SCOPED_TABLES:
        for row in store.table(name).search().where(subject_where(scope.team_id, scope.user_id)).limit(None).to_list():
            row.pop("_distance", None)
            row["vector"] = list(row["vector"]) if "vector" in row else None
            out[f"{name}/{row['pk']}"] = row
    return out


async def _until(check, what: str, timeout_s: float = 90.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.3)


async def _raw_records(settings, topics: Topics) -> list[bytes]:  # type: ignore[no-untyped-def]
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t in topics.kept_forever() for p in range(topics.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out = []
        for tp in tps:
            while await consumer.position(tp) < ends[tp]:
                for r in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, ()):
                    out.append(b"".join([r.key or b"", r.value or b"", *(v or b"" for _, v in r.headers or ())]))
        return out
    finally:
        await consumer.stop()


async def test_forget_converges_across_a_killed_worker_and_leaves_nothing(
    fresh_topics: Topics, settings_for, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(fresh_topics, embedder="local", embedding_dim=32, optimize_every_s=2.0, sealing=True)
    canary = f"zq{uuid.uuid4().hex[:10]}"
    events = []
    for scope in (ALICE, BOB):
        events += [MemoryAdded(scope=scope, memory_id=f"m{i}", content=f"{canary}{scope.user_id} fact {i}") for i in range(20)]
        events += [MessageObserved(scope=scope, message_id=f"t{i}", content=f"{canary}{scope.user_id} said {i}") for i in range(5)]
    async with MemstreamProducer(settings) as producer:
        await producer.send_many(events)
    raw = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)  # a producer that cannot seal
    await raw.start()
    try:
        rec = encode_event(MemoryAdded(scope=ALICE, memory_id="via-ingress", content=f"{canary}alice via kcat"))
        await raw.send_and_wait(fresh_topics.ingress, rec.value, key=rec.key, headers=rec.headers)
    finally:
        await raw.stop()

    worker = WorkerProcess(settings, tmp_path / "worker", agents=["projector", "sealer"])
    worker.start()
    try:
        await _until(lambda: _count(settings, ALICE) >= 21 + 5 and _count(settings, BOB) >= 25, "projection")
        bob_before = _rows(_store(settings), BOB)
        worker.kill()  # dead while the forget is written: it must converge on restart

        report = await forget(settings, "acme", "alice")
        assert [s.user_id for s in report.forgotten] == ["alice"]
        worker.start()
        await _until(lambda: _count(settings, ALICE) == 0, "alice's rows gone")
        assert _rows(_store(settings), BOB) == bob_before
        # out of the table files too, once the readers' grace (30 s) has passed
        await _until(lambda: not _files_holding(tmp_path / "lance", f"{canary}alice".encode()), "alice's bytes gone", 90)
        assert _files_holding(tmp_path / "lance", f"{canary}bob".encode())
    finally:
        worker.stop()

    records = await _raw_records(settings, fresh_topics)
    assert records and not [r for r in records if f"{canary}alice".encode() in r]
    assert [r for r in records if b"SubjectForgotten" in r]

    again = await forget(settings, "acme", "alice")
    assert not again.forgotten and "already forgotten" in again.summary()
    unknown = await forget(settings, "acme", "nobody")
    assert not unknown.forgotten and "no data subject" in unknown.summary()

    replayed = settings.model_copy(update={"lance_dir": tmp_path / "replayed"})
    result = await replay(replayed)
    assert result.unreadable == 26  # alice's 21 memories and 5 turns, skipped and counted
    assert not _rows(_store(replayed), ALICE)
    assert _rows(_store(replayed), BOB).keys() == bob_before.keys()
