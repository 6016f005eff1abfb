"""The inflation bound: a compressed batch that would inflate past
``MAX_INFLATED_BATCH_BYTES`` is dead-lettered without being inflated whole,
and the records after it are read as before.

* the parsing step alone (batches built with aiokafka's own builder);
* the hook into aiokafka's fetcher is where this module expects it (fails loudly when an
  aiokafka upgrade moves it);
* on the real broker: a gzip bomb read by an ``EventConsumer``; and a worker process
  whose peak RSS, measured from ``/proc``, grows by less than the bound plus a margin
  while it dead-letters a 200 MiB bomb and goes on projecting.
"""

from __future__ import annotations

import asyncio
import gzip
import inspect
import signal
import time
import zlib
from pathlib import Path

import aiokafka.consumer.fetcher as fetcher
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords

from memstream.domain.events import MemoryAdded, Scope
from memstream.projections.store.lance_store import LanceStore
from memstream.settings.model import Settings
from memstream.streams.consumer import EventConsumer
from memstream.streams.records import inflation_bound
from memstream.streams.records.inflation_bound import BoundedMemoryRecords, Refused, bound_inflation, inflate_batch, refusal
from memstream.codec.wire import encode_event
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.sealing.sealer import IngressSealer
from memstream.streams.topics import Topics
from tests.services.test_worker import PROJECTOR, WorkerProcess, read_dead_letters, send_raw, wait_caught_up

MiB = 1024 * 1024
ALICE = Scope(team_id="acme", user_id="alice")


def batch(values: list[bytes], *, codec: int, base: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=0, producer_id=-1, producer_epoch=-1,
        base_sequence=-1, batch_size=1 << 30,
    )
    for i, value in enumerate(values):
        builder.append(base + i, timestamp=None, key=b"k", value=value, headers=[("h", b"x")])
    return bytes(builder.build())


def records(buffer: bytes, limit: int) -> list[tuple[int, bytes | None, list]]:
    """What the fetcher would see: (offset, value, headers) of every record."""
    BoundedMemoryRecords.limit = limit
    parsed = BoundedMemoryRecords(buffer)
    out = []
    while parsed.has_next():
        got = parsed.next_batch()
        assert got.validate_crc()
        out.extend((r.offset, r.value, list(r.headers)) for r in got)
    return out


# --- the parsing step -----------------------------------------------------------------


def test_a_gzip_batch_within_the_bound_reads_as_aiokafka_reads_it() -> None:
    values = [f"record {i} ".encode() * 50 for i in range(20)]
    buffer = batch(values, codec=1)
    theirs = MemoryRecords(buffer).next_batch()
    assert records(buffer, 1 * MiB) == [(r.offset, r.value, list(r.headers)) for r in theirs]


def test_a_gzip_batch_past_the_bound_becomes_one_marker_at_its_last_offset() -> None:
    buffer = batch([b"\0" * (3 * MiB), b"x"], codec=1, base=0) + batch([b"after"], codec=1, base=2)
    got = records(buffer, 2 * MiB)
    assert [(offset, value) for offset, value, _ in got] == [(1, None), (2, b"after")]
    reason = refusal(None, got[0][2])
    assert reason is not None and "offsets 0-1" in reason and "gzip" in reason and str(2 * MiB) in reason
    assert refusal(b"a value", got[0][2]) is None and refusal(None, [("other", b"x")]) is None


def test_one_fetch_inflates_its_share_and_leaves_the_rest_to_the_next() -> None:
    parts = [batch([bytes([65 + i]) * (3 * MiB)], codec=1, base=i) for i in range(3)]
    first = records(b"".join(parts), 8 * MiB)
    assert [offset for offset, _, _ in first] == [0, 1]  # 6 MiB; a third would pass 8
    assert all(value is not None and len(value) == 3 * MiB for _, value, _ in first)
    assert [offset for offset, _, _ in records(parts[2], 8 * MiB)] == [2]  # the next fetch


def test_plain_batches_pass_untouched() -> None:
    buffer = batch([b"\0" * (3 * MiB)], codec=0)
    assert records(buffer, 1 * MiB) == [(0, b"\0" * (3 * MiB), [("h", b"x")])]


def test_a_corrupt_gzip_batch_is_refused_with_the_reason() -> None:
    good = bytearray(batch([b"hello " * 100], codec=1))
    good[-12:-4] = b"\xff" * 8  # inside the deflate stream
    got = inflate_batch(bytes(good), 1 * MiB)
    assert isinstance(got, Refused) and "gzip" in got.reason and not got.over_bound


def test_codecs_that_cannot_be_bounded_are_refused_when_they_could_pass_it() -> None:
    header = bytearray(batch([b"x"], codec=0))
    header[22] |= 4  # claims zstd
    got = inflate_batch(bytes(header) + b"\0" * 4096, 1 * MiB)
    assert isinstance(got, Refused) and "zstd" in got.reason


def test_the_bound_holds_while_inflating() -> None:
    # Never more than the bound plus one chunk is held, whatever the batch would become.
    bomb = gzip.compress(b"\0" * (64 * MiB))
    header = bytearray(batch([b"x"], codec=1))[:61]
    got = inflate_batch(bytes(header) + bomb, 4 * MiB)
    assert isinstance(got, Refused) and got.over_bound
    assert len(zlib.decompress(bomb, 31)) == 64 * MiB  # the bomb is one


# --- the hook into aiokafka -------------------------------------------------------------


def test_aiokafka_s_fetcher_still_parses_where_the_bound_hooks_in() -> None:
    """Fails when an aiokafka upgrade changes what ``bound_inflation`` relies on: the
    fetcher parses each response through its module's ``MemoryRecords`` and walks the
    batches with ``has_next``/``next_batch``, checking CRCs and offsets on the batch."""
    bound_inflation(64 * MiB)
    assert fetcher.MemoryRecords is BoundedMemoryRecords
    assert "MemoryRecords(part_data[-1])" in inspect.getsource(fetcher.Fetcher._proc_fetch_request)
    unpack = inspect.getsource(fetcher.PartitionRecords._unpack_records)
    for used in ("records.has_next()", "records.next_batch()", "validate_crc()", "next_batch.next_offset", "for record in next_batch"):
        assert used in unpack, used


# --- the real broker ----------------------------------------------------------------------


async def send_bomb(settings: Settings, topic: str, size: int) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.broker.bootstrap_servers, compression_type="gzip", max_request_size=size + MiB
    )
    await producer.start()
    try:
        await producer.send_and_wait(topic, value=b"\0" * size, key=b"acme/alice")
    finally:
        await producer.stop()


@pytest.mark.kafka
async def test_an_event_consumer_dead_letters_a_bomb_and_reads_on(fresh_topics: Topics, settings_for, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(inflation_bound, "MAX_INFLATED_BATCH_BYTES", 4 * MiB)
    settings = settings_for(fresh_topics)
    async with MemstreamProducer(settings.streams) as producer:
        await producer.send(MemoryAdded(scope=ALICE, memory_id="before", content="Alice likes tea"))
    await send_bomb(settings, fresh_topics.events, 32 * MiB)
    async with MemstreamProducer(settings.streams) as producer:
        await producer.send(MemoryAdded(scope=ALICE, memory_id="after", content="Alice likes jazz"))

    seen: list[str] = []
    dead = []
    async with EventConsumer(fresh_topics.events, group_id=None, streams=settings.streams) as consumer:
        deadline = time.monotonic() + 30
        async for got in consumer.batches(timeout_ms=300):
            seen += [e.event.memory_id for e in got.events]  # type: ignore[attr-defined]
            dead += got.dead
            if "after" in seen or time.monotonic() > deadline:
                break
    assert seen == ["before", "after"]
    assert len(dead) == 1 and dead[0].original_value is None
    assert "gzip batch inflating past the bound" in dead[0].reason and dead[0].source_offset == 1
    published = await read_dead_letters(settings, fresh_topics.dead_letter)
    assert [d.reason for d in published] == [dead[0].reason]


@pytest.mark.kafka
async def test_the_sealer_dead_letters_a_bomb_on_the_ingress_and_seals_on(fresh_topics: Topics, settings_for, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(inflation_bound, "MAX_INFLATED_BATCH_BYTES", 4 * MiB)
    settings = settings_for(fresh_topics)
    await send_bomb(settings, fresh_topics.ingress, 32 * MiB)
    after = encode_event(MemoryAdded(scope=ALICE, memory_id="after", content="Alice likes jazz"))
    await send_raw(settings, fresh_topics.ingress, [(after.key, after.value)])
    async with SubjectKeys(settings.streams) as keys:
        sealer = IngressSealer(settings.streams, settings.worker.app_id, keys, fresh_topics)
        await sealer.run(until_idle=True)
    assert (sealer.sealed, sealer.dead_lettered) == (1, 1)
    dead = await read_dead_letters(settings, fresh_topics.dead_letter)
    assert len(dead) == 1 and dead[0].stage == "seal" and dead[0].source_topic == fresh_topics.ingress
    assert "gzip batch inflating past the bound of 4194304 bytes" in dead[0].reason


def peak_rss(pid: int) -> int:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmHWM"].split()[0]) * 1024


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)


@pytest.mark.kafka
@pytest.mark.slow
async def test_a_worker_dead_letters_a_200_mib_bomb_within_its_bound(
    fresh_topics: Topics, settings_for, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    # The margin is the worker's own work on one batch (positions written, a dead letter
    # sent). Unbounded, this bomb grew the worker by over 400 MiB.
    bound, margin = 16 * MiB, 48 * MiB
    settings = settings_for(fresh_topics, projector_batch_seconds=0.1)
    bounded = {f"{inflation_bound.__name__}:MAX_INFLATED_BATCH_BYTES": bound, f"{PROJECTOR}:BATCH_SIZE": 100}
    worker = WorkerProcess(settings, tmp_path, bounded)
    worker.start()
    try:
        async with MemstreamProducer(settings.streams) as producer:
            await producer.send(MemoryAdded(scope=ALICE, memory_id="before", content="Alice likes tea"))
        await send_raw(settings, fresh_topics.events, [(b"acme/alice", b"not json")])  # the dead-letter path warm
        await wait_caught_up(worker, fresh_topics)
        await asyncio.sleep(2)  # settle: the first batch's allocations are done
        assert worker.proc is not None
        pid = worker.proc.pid
        reset_peak(pid)
        baseline = peak_rss(pid)

        await send_bomb(settings, fresh_topics.events, 200 * MiB)
        await wait_caught_up(worker, fresh_topics)  # past the bomb: dead-lettered
        growth = peak_rss(pid) - baseline
        async with MemstreamProducer(settings.streams) as producer:
            await producer.send(MemoryAdded(scope=ALICE, memory_id="after", content="Alice likes jazz"))
        await wait_caught_up(worker, fresh_topics)
        assert worker.stop(signal.SIGINT) == 0, worker.log_text()[-3000:]
    finally:
        worker.ensure_dead()

    assert growth < bound + margin, f"peak RSS grew by {growth / MiB:.0f} MiB"
    dead = await read_dead_letters(settings, fresh_topics.dead_letter)
    assert [d.original_value for d in dead] == [b"not json", None]
    assert dead[1].source_topic == fresh_topics.events
    assert "gzip batch inflating past the bound of 16777216 bytes" in dead[1].reason
    store = LanceStore.from_settings(settings.storage, settings.embeddings.dim)
    assert {m["memory_id"] for m in store.get_memories(ALICE, ["before", "after"])} == {"before", "after"}
