"""``memstream bench ingest``'s load shapes: the open loop writes every text once, in
order, without waiting for earlier writes; the closed loop never has more than
``concurrency`` writes in flight and loses none. (The benchmark itself starts the
worker and the API: a run, not a test; its figures live in docs/benchmarks.md.)"""

from __future__ import annotations

import asyncio

from memstream.bench.ingest import _drive
from memstream.domain.log import LogPosition


class Recorder:
    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0
        self.started: list[str] = []
        self.release = asyncio.Event()

    async def one(self, text: str) -> LogPosition:
        self.started.append(text)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await self.release.wait()
        self.in_flight -= 1
        return LogPosition(topic="t", partition=0, offset=int(text))


async def test_open_loop_starts_every_write_without_waiting_for_the_earlier_ones() -> None:
    rec = Recorder()
    texts = [str(i) for i in range(40)]
    task = asyncio.ensure_future(_drive(texts, 10_000.0, 1, rec.one))
    while len(rec.started) < len(texts):
        await asyncio.sleep(0.001)
    assert rec.most == len(texts), "open loop: all in flight at once while none is acknowledged"
    rec.release.set()
    written = await task
    assert [p.offset for p in written] == list(range(40)) and rec.started == texts


async def test_closed_loop_keeps_at_most_concurrency_writes_in_flight() -> None:
    rec = Recorder()
    texts = [str(i) for i in range(50)]
    task = asyncio.ensure_future(_drive(texts, None, 4, rec.one))
    while len(rec.started) < 4:
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.01)
    assert rec.in_flight == 4 and len(rec.started) == 4, "nothing starts beyond the lanes"
    rec.release.set()
    written = await task
    assert sorted(p.offset for p in written) == list(range(50)) and rec.most == 4
