"""``memstream replay`` while the worker projects and readers search: a new set is
built, caught up, swapped in atomically; every search during it answers, whole; the
worker then writes into the new set. And a replay interrupted by Ctrl-C cleans up.

Real broker, the worker as its own process, the API's own read path
(:class:`~memstream.interfaces.service.MemoryService`) in this process."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.services.test_worker import WorkerProcess, end_offsets, read_positions

from memstream.domain.events import MemoryAdded, Scope
from memstream.interfaces.service import MemoryService
from memstream.services.replay.rebuild import replay
from memstream.projections.search.hybrid import SearchFilters
from memstream.projections.store.table_sets import TableSets
from memstream.settings.model import Settings, child_env
from memstream.streams.producers.producer import MemstreamProducer
from memstream.projections.store.dir_lock import LanceDirLock
from memstream.streams.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

STABLE = Scope(team_id="acme", user_id="stable")
BUSY = Scope(team_id="acme", user_id="busy")


async def produce(settings: Settings, scope: Scope, prefix: str, count: int) -> None:
    async with MemstreamProducer(settings.streams) as producer:
        await producer.send_many(
            [MemoryAdded(scope=scope, memory_id=f"{prefix}{i}", content=f"{prefix} fact number {i}") for i in range(count)]
        )


async def caught_up(worker: WorkerProcess, topics: Topics, root: Path) -> None:
    ends = await end_offsets(worker.settings, [topics.events, topics.messages])
    deadline = time.monotonic() + 120
    while True:
        worker.assert_alive()
        stored = read_positions(TableSets(root).current())
        if all(stored.get(k, 0) >= v for k, v in ends.items() if v):
            return
        assert time.monotonic() < deadline, worker.log_text()[-3000:]
        await asyncio.sleep(0.3)


async def test_replay_while_serving_swaps_atomically(fresh_topics: Topics, settings_for, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(fresh_topics, projector_batch_seconds=0.05, read_wait_max_s=60.0)
    sets = TableSets(settings.storage.root)
    await produce(settings, STABLE, "stable", 20)
    await produce(settings, BUSY, "bulk", 3000)
    worker = WorkerProcess(settings, tmp_path)
    worker.start()
    service = MemoryService(settings)
    try:
        await caught_up(worker, fresh_topics, settings.storage.root)
        await service.start()
        stop = asyncio.Event()
        searches: list[str | None] = []  # the set each search ran on
        failures: list[str] = []

        async def search_loop() -> None:
            wanted = {f"stable{i}" for i in range(20)}
            while not stop.is_set():
                try:
                    got = await service.search(STABLE, "stable fact", 50, SearchFilters(), interface="api")
                    missing = wanted - {r.memory_id for r in got}
                    if missing:
                        failures.append(f"partial: {sorted(missing)[:3]}")
                except Exception as exc:  # noqa: BLE001 - counted: a search must never fail
                    failures.append(f"{type(exc).__name__}: {exc}")
                searches.append(sets.current_name())
                await asyncio.sleep(0.01)

        async def write_loop() -> None:
            async with MemstreamProducer(settings.streams) as producer:
                i = 0
                while not stop.is_set():
                    await producer.add_memory(BUSY, f"live fact {i}")
                    i += 1
                    await asyncio.sleep(0.02)

        loops = [asyncio.ensure_future(search_loop()), asyncio.ensure_future(write_loop())]
        try:
            report = await replay(settings, batch_size=500)
        finally:
            await asyncio.sleep(0.5)  # a few searches on the new set
            stop.set()
            await asyncio.gather(*loops)
        assert report.swapped, report.summary()
        assert sets.current() == report.replay_dir
        assert failures == [], failures[:5]
        assert searches[0] is None and searches[-1] == sets.current_name()  # searched across the swap
        worker.assert_alive()
        assert "now projecting into the replayed set" in worker.log_text()

        # The worker writes into the new set: a write is readable through it.
        async with MemstreamProducer(settings.streams) as producer:
            sent = await producer.add_memory(STABLE, "written after the swap")
        await service.wait_for([sent.position])
        found = await service.search(STABLE, "written after the swap", 3, SearchFilters(), interface="api")
        assert found[0].content == "written after the swap"
        old = read_positions(report.live_dir)
        assert old.get((sent.position.topic, sent.position.partition), 0) <= sent.position.offset
    finally:
        await service.stop()
        assert worker.stop() == 0, worker.log_text()[-3000:]


def test_ctrl_c_during_a_replay_cleans_up(fresh_topics: Topics, settings_for, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(fresh_topics)
    asyncio.run(produce(settings, BUSY, "bulk", 4000))
    root = Path(settings.storage.root)
    proc = subprocess.Popen(
        [sys.executable, "-m", "memstream", "replay", "--batch-size", "20", "--no-progress"],
        cwd=tmp_path, env=child_env(settings), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not any((root / "sets").glob("*/positions.lance")):  # the build has started
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and b"interrupted" in out, (out, err)
    assert b"Traceback" not in err, err.decode()
    assert list((root / "sets").iterdir()) == [], err.decode()[-2000:]
    assert TableSets(root).current_name() is None and TableSets(root).swap_request() is None
    for lock in (LanceDirLock(root), LanceDirLock(root / "replay")):
        lock.acquire("check")  # both free again
        lock.release()
