"""Forgetting end to end on the real broker and LanceDB: a worker (projector and
sealer) killed around a forget converges after restart, no byte of the forgotten user
is left in the kept-forever topics or the table files, a replay brings nothing back,
and the other user's rows are untouched."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from tests.support import read_to_end, record_bytes

from memstream.bench._common import WorkerProcess
from memstream.domain.events import MemoryAdded, MessageObserved, Scope
from memstream.projections.projector.forget import SCOPED_TABLES, subject_where
from memstream.services.reflection.agent import state_topics
from memstream.services.replay.rebuild import replay
from memstream.projections.store.lance_store import LanceStore, StoreError
from memstream.projections.store.table_sets import TableSets
from memstream.streams.sealing.forget import forget
from memstream.streams.producers.producer import MemstreamProducer
from memstream.codec.wire import encode_event
from memstream.streams.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ALICE = Scope(team_id="acme", user_id="alice")
BOB = Scope(team_id="acme", user_id="bob")


def _store(settings) -> LanceStore:  # type: ignore[no-untyped-def]
    return LanceStore.from_settings(settings.storage, settings.embeddings.dim, TableSets(settings.storage.root).current(), create=False)


def _count(settings, scope: Scope) -> int:  # type: ignore[no-untyped-def]
    try:
        return len(_rows(_store(settings), scope))
    except StoreError:  # the worker has not made its tables yet
        return -1


def _files_holding(root: Path, needle: bytes) -> list[Path]:
    """The files under ``root`` holding ``needle``; the worker's maintenance may remove
    files and directories while they are walked (those hold nothing any more)."""
    found = []
    for folder, _, names in os.walk(root):  # os.walk skips a directory that vanished
        for name in names:
            path = Path(folder) / name
            try:
                if needle in path.read_bytes():
                    found.append(path)
            except FileNotFoundError:
                continue
    return found


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


async def _raw_records(settings, topics: Topics, extra: list[str] = ()) -> list[bytes]:  # type: ignore[no-untyped-def,assignment]
    records = await read_to_end(settings.broker.bootstrap_servers, [*topics.kept_forever(), *extra], topics.partitions)
    return [record_bytes(r) for r in records]


async def test_forget_converges_across_a_killed_worker_and_leaves_nothing(
    fresh_topics: Topics, settings_for, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(fresh_topics, embedder="local", embedding_dim=32, optimize_every_s=2.0, sealing=True, reader_grace_s=5.0)
    canary = f"zq{uuid.uuid4().hex[:10]}"
    events = []
    for scope in (ALICE, BOB):
        events += [MemoryAdded(scope=scope, memory_id=f"m{i}", content=f"{canary}{scope.user_id} fact {i}") for i in range(20)]
        events += [MessageObserved(scope=scope, message_id=f"t{i}", content=f"{canary}{scope.user_id} said {i}") for i in range(5)]
    async with MemstreamProducer(settings.streams) as producer:
        await producer.send_many(events)
    raw = AIOKafkaProducer(bootstrap_servers=settings.broker.bootstrap_servers)  # a producer that cannot seal
    await raw.start()
    try:
        rec = encode_event(MemoryAdded(scope=ALICE, memory_id="via-ingress", content=f"{canary}alice via kcat"))
        await raw.send_and_wait(fresh_topics.ingress, rec.value, key=rec.key, headers=rec.headers)
    finally:
        await raw.stop()

    worker = WorkerProcess(settings, tmp_path / "worker", services=["projector", "sealer"])
    worker.start()
    try:
        await _until(lambda: _count(settings, ALICE) >= 21 + 5 and _count(settings, BOB) >= 25, "projection")
        bob_before = _rows(_store(settings), BOB)
        worker.kill()  # dead while the forget is written: it must converge on restart

        report = await forget(settings.streams, "acme", "alice")
        assert [s.user_id for s in report.forgotten] == ["alice"]
        # the sealer had sealed and deleted the kcat record: no plaintext waits in the ingress
        assert report.ingress_lag_s is None and "ingress holds no plaintext" in report.summary()
        worker.start()
        await _until(lambda: _count(settings, ALICE) == 0, "alice's rows gone")
        assert _rows(_store(settings), BOB) == bob_before
        # out of the table files too, once the readers' grace (5 s here) has passed
        await _until(lambda: not _files_holding(tmp_path / "lance", f"{canary}alice".encode()), "alice's bytes gone", 90)
        assert _files_holding(tmp_path / "lance", f"{canary}bob".encode())
    finally:
        worker.stop()

    records = await _raw_records(settings, fresh_topics)
    assert records and not [r for r in records if f"{canary}alice".encode() in r]
    assert [r for r in records if b"SubjectForgotten" in r]

    again = await forget(settings.streams, "acme", "alice")
    assert not again.forgotten and "already forgotten" in again.summary()
    unknown = await forget(settings.streams, "acme", "nobody")
    assert not unknown.forgotten and "no data subject" in unknown.summary()

    replayed = settings.model_copy(update={"lance_dir": tmp_path / "replayed"})
    result = await replay(replayed)
    assert result.unreadable == 26  # alice's 21 memories and 5 turns, skipped and counted
    assert not _rows(_store(replayed), ALICE)
    assert _rows(_store(replayed), BOB).keys() == bob_before.keys()


class _Writer:
    """One subject writing memories, turns and a decision in rounds until stopped; keeps
    the ids the broker acknowledged."""

    def __init__(self, settings, scope: Scope, canary: str) -> None:  # type: ignore[no-untyped-def]
        self.settings, self.scope, self.word = settings, scope, f"{canary}{scope.user_id}"
        self.stop = asyncio.Event()
        self.memory_ids: list[str] = []
        self.rounds = 0

    async def run(self) -> None:
        async with MemstreamProducer(self.settings.streams, client_id=f"writer-{self.scope.user_id}") as producer:
            await producer.record_decision(
                self.scope, "d0", f"{self.word}-subject", "buy", f"{self.word} decided", datetime.now(timezone.utc) + timedelta(days=30)
            )
            while not self.stop.is_set():
                r = self.rounds
                ids = [f"m{r}-{i}" for i in range(5)]
                await producer.send_many(
                    [MemoryAdded(scope=self.scope, memory_id=m, content=f"{self.word} fact {m}") for m in ids]
                    + [MessageObserved(scope=self.scope, message_id=f"t{r}", content=f"{self.word} said {r}")]
                )
                self.memory_ids += ids
                self.rounds += 1
                await asyncio.sleep(0.1)


async def test_forget_under_concurrent_writers_leaves_nothing_and_loses_no_other_write(
    fresh_topics: Topics, settings_for, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(
        fresh_topics, embedder="local", embedding_dim=32, optimize_every_s=2.0, sealing=True, reflection_poll_seconds=0.5
    )
    canary = f"zq{uuid.uuid4().hex[:10]}"
    carol = Scope(team_id="acme", user_id="carol")
    writers = {s.user_id: _Writer(settings, s, canary) for s in (ALICE, BOB, carol)}
    worker = WorkerProcess(settings, tmp_path / "worker", services=["projector", "sealer", "reflector"])
    worker.start()
    tasks = {name: asyncio.create_task(w.run()) for name, w in writers.items()}
    try:
        await _until(lambda: all(_count(settings, w.scope) >= 20 for w in writers.values()), "everyone projected")
        writers["alice"].stop.set()
        await tasks["alice"]  # alice writes until the forget
        before = {name: _rows(_store(settings), writers[name].scope) for name in ("bob", "carol")}
        rounds_at_forget = {name: writers[name].rounds for name in before}
        report = await forget(settings.streams, "acme", "alice")  # while bob and carol write on
        assert [s.user_id for s in report.forgotten] == ["alice"]
        await _until(lambda: all(writers[n].rounds >= rounds_at_forget[n] + 5 for n in before), "writes after the forget")
        for name in before:
            writers[name].stop.set()
            await tasks[name]

        def memories(scope: Scope) -> set[str]:
            rows = _store(settings).table("memories").search().where(subject_where(scope.team_id, scope.user_id))
            return {r["memory_id"] for r in rows.limit(None).to_list()}

        await _until(lambda: _count(settings, ALICE) == 0, "alice's rows gone")
        await _until(lambda: all(memories(writers[n].scope) == set(writers[n].memory_ids) for n in before), "every other write")
        after = {name: _rows(_store(settings), writers[name].scope) for name in before}
        for name, rows in before.items():
            assert {k: v for k, v in after[name].items() if k in rows} == rows  # untouched by the forget
        await _until(lambda: not _files_holding(tmp_path / "lance", f"{canary}alice".encode()), "alice's bytes gone", 90)
    finally:
        for task in tasks.values():
            task.cancel()
        worker.stop()

    state = state_topics(settings)
    records = await _raw_records(settings, fresh_topics, extra=state)
    assert len([r for r in records if b"d0" in r or b"#" in r]) >= 3  # the reflector's state is scanned too
    assert not [r for r in records if f"{canary}alice".encode() in r]


def _reached(settings, positions) -> bool:  # type: ignore[no-untyped-def]
    try:
        stored = _store(settings).positions()
    except StoreError:
        return False
    return all(stored.get((p.topic, p.partition), 0) > p.offset for p in positions)


async def test_a_write_after_a_forget_survives_a_worker_started_after_both(
    fresh_topics: Topics, settings_for, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Worker stopped; forget; a new memory and turn of the same subject; worker started:
    the forget deletes what came before it and nothing after it, in either topic."""
    settings = settings_for(fresh_topics, embedder="local", embedding_dim=32, sealing=True, reader_grace_s=1.0)
    canary = f"zq{uuid.uuid4().hex[:10]}"
    old = [MemoryAdded(scope=ALICE, memory_id="m-old", content=f"{canary} old fact"),
           MessageObserved(scope=ALICE, message_id="t-old", content=f"{canary} old turn")]
    worker = WorkerProcess(settings, tmp_path / "worker", services=["projector", "sealer"])
    async with MemstreamProducer(settings.streams) as producer:
        await producer.send_many(old)
    worker.start()
    try:
        await _until(lambda: _count(settings, ALICE) >= 2, "the old life projected")
        worker.kill()
        report = await forget(settings.streams, "acme", "alice")
        assert {p.topic for p in report.positions} == {fresh_topics.events, fresh_topics.messages}
        new = [MemoryAdded(scope=ALICE, memory_id="m-new", content="a new life", source_message_ids=("t-new",)),
               MessageObserved(scope=ALICE, message_id="t-new", content="hello again")]
        async with MemstreamProducer(settings.streams) as producer:
            written = await producer.send_many(new)
        worker.start()
        await _until(lambda: _reached(settings, written), "the projector past the new writes")
        rows = _rows(_store(settings), ALICE)
        assert {r.get("memory_id") or r.get("message_id") for k, r in rows.items() if k.split("/")[0] in ("memories", "messages")} == {"m-new", "t-new"}
    finally:
        worker.stop()


async def test_a_forget_after_a_replay_leaves_no_copy_in_the_replaced_set(
    fresh_topics: Topics, settings_for, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(
        fresh_topics, embedder="local", embedding_dim=32, optimize_every_s=1.0, sealing=True, reader_grace_s=2.0,
        lance_dir=tmp_path / "lance",
    )
    canary = f"zq{uuid.uuid4().hex[:10]}"
    async with MemstreamProducer(settings.streams) as producer:
        await producer.send_many([MemoryAdded(scope=s, memory_id=f"m{i}", content=f"{canary}{s.user_id} fact {i}")
                                  for s in (ALICE, BOB) for i in range(5)])
    worker = WorkerProcess(settings, tmp_path / "worker", services=["projector", "sealer"])
    worker.start()
    try:
        await _until(lambda: _count(settings, ALICE) >= 5 and _count(settings, BOB) >= 5, "projection")
        replaced = TableSets(settings.storage.root).current()
        result = await replay(settings)  # beside the running worker: the old set is kept for its readers
        assert result.swapped and replaced != TableSets(settings.storage.root).current()
        await forget(settings.streams, "acme", "alice")
        await _until(lambda: _count(settings, ALICE) == 0, "alice's rows gone")
        await _until(lambda: not _files_holding(tmp_path / "lance", f"{canary}alice".encode()), "alice's bytes gone everywhere", 60)
        assert not Path(replaced).exists() or not any(Path(replaced).glob("*.lance"))
        assert _files_holding(tmp_path / "lance", f"{canary}bob".encode())
    finally:
        worker.stop()
