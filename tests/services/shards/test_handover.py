"""Hand-overs of shards between the workers of one group, under load from the SDK
producer:

- a rolling restart (each of three workers in turn: SIGTERM, then started again)
  loses nothing: every acknowledged memory is in exactly one shard, its space's, and
  every shard equals a replay;
- searches during the hand-overs never fail nor return another space's rows, and an
  MCP ``query_memory`` whose own write sits on a shard being handed over says it lags
  (``up_to_date: false`` with a note), then reads its write once a worker took over.

The lag is made observable without timing luck: after a SIGKILL the dead member's
shards have no writer until the group's session timeout ends, longer than the read
wait, so a write to one of them cannot be projected within the wait. (A SIGTERMed
member leaves the group at once and its shards move within about a second, which a
read may or may not overlap; those reads are checked for failures and crossings.)

Real broker, real LanceDB under ``tmp_path``, the workers as their own processes."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from tests.services.shards.test_group import (
    GroupWorker,
    Traffic,
    assert_replay_equals_live,
    assert_shards_exact,
    group_settings,
    wait_caught_up,
    wait_until_progress,
)

from memstream.banks import Bank
from memstream.interfaces.mcp_server import build_mcp_server
from memstream.interfaces.service import MemoryService
from memstream.sdk import Scope
from memstream.services.shards.routing import space_partition
from memstream.services.shards.status import shard_statuses
from memstream.settings.model import Settings

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 6
READ_WAIT_S = 1.5
SESSION_S = 8.0


def probe_banks() -> dict[int, Bank]:
    """One MCP bank (memory space) per partition."""
    banks: dict[int, Bank] = {}
    n = 0
    while len(banks) < PARTITIONS:
        scope = Scope(team_id="probe", user_id=f"p{n}")
        p = space_partition(scope, PARTITIONS)
        if p not in banks:
            banks[p] = Bank(name=f"p{n}", team_id="probe", user_id=f"p{n}", description=f"probe bank on partition {p}")
        n += 1
    return banks


def owned_by(settings: Settings, worker: GroupWorker) -> list[int]:
    """The shards whose lease the worker's process holds."""
    assert worker.proc is not None
    pid = worker.proc.pid
    return [s.partition for s in shard_statuses(settings, None) if s.owner and re.search(rf"\(pid {pid}\)", s.owner)]


async def wait_owning(settings: Settings, worker: GroupWorker, others: list[GroupWorker]) -> None:
    """Until the (re)started worker holds a lease again and every shard has an owner."""
    deadline = time.monotonic() + 180
    while not (owned_by(settings, worker) and all(s.owner for s in shard_statuses(settings, None))):
        for w in [worker, *others]:
            w.assert_alive()
        assert time.monotonic() < deadline, worker.log_text()[-3000:]
        await asyncio.sleep(0.5)


class Probe:
    """MCP sessions, one per probe bank, each writing and then reading its own space."""

    def __init__(self, service: MemoryService, settings: Settings) -> None:
        self.banks = probe_banks()
        self.service = service
        self.settings = settings
        self.acked: dict[Scope, set[str]] = {b.scope: set() for b in self.banks.values()}
        self.answers: list[tuple[int, bool]] = []
        self.failures: list[str] = []
        self.crossed: list[str] = []

    async def ask(self, client: Client, partition: int, n: int) -> dict[str, Any]:
        bank = self.banks[partition]
        added = await client.call_tool("add_memory", {"content": f"{bank.user_id} probe fact {n}"})
        if added.is_error or added.structured_content is None:
            self.failures.append(f"add_memory: {added.content}")
            return {}
        self.acked[bank.scope].add(added.structured_content["memory_id"])
        found = await client.call_tool("query_memory", {"query": f"{bank.user_id} probe fact {n}", "k": 10})
        if found.is_error or found.structured_content is None:
            self.failures.append(f"query_memory: {found.content}")
            return {}
        out = found.structured_content
        self.crossed += [m["content"] for m in out["memories"] if not m["content"].startswith(f"{bank.user_id} ")]
        self.answers.append((partition, bool(out["up_to_date"])))
        return out


async def test_rolling_restart_and_hand_overs_lose_nothing_and_reads_say_they_lag(
    kafka_bootstrap: str, topic_prefix: str, settings_for, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    topics, settings = await group_settings(
        settings_for, kafka_bootstrap, topic_prefix, PARTITIONS,
        worker_session_timeout_s=SESSION_S, read_wait_max_s=READ_WAIT_S,
    )
    workers = [GroupWorker(settings, tmp_path, f"w{i}") for i in range(3)]
    for w in workers:
        w.workdir = tmp_path / w.instance
        w.workdir.mkdir()
        w.start()
    traffic = Traffic()

    service = MemoryService(settings)
    probe = Probe(service, settings)
    loops: list[asyncio.Future[None]] = []
    try:
        loops.append(asyncio.ensure_future(traffic.load(settings, 17)))
        await wait_until_progress(settings, 300, workers)
        await service.start()
        loops.append(asyncio.ensure_future(traffic.search(service, 5)))

        # Rolling restart: each worker in turn leaves (SIGTERM, exit 0) and comes back.
        for k, w in enumerate(workers):
            others = [o for o in workers if o is not w]
            assert w.stop() == 0, w.log_text()[-3000:]
            w.start()
            await wait_owning(settings, w, others)
            assert "projector owns shards [" in w.log_text(), f"restart {k}: {w.log_text()[-2000:]}"

        # A hand-over after a SIGKILL: the victim's shards have no writer for the session.
        victim = workers[1]
        moved = owned_by(settings, victim)
        assert moved, "the victim owns no shard"
        sessions = {p: Client(build_mcp_server(b, settings, service=service)) for p, b in probe.banks.items()}
        async with sessions[moved[0]] as lagging, sessions[next(p for p in probe.banks if p not in moved)] as steady:
            victim.kill()
            during = await probe.ask(lagging, moved[0], 0)
            assert during.get("up_to_date") is False, during
            assert "recent writes may be missing" in during["note"]
            await probe.ask(steady, next(p for p in probe.banks if p not in moved), 0)
            deadline = time.monotonic() + 120
            n = 1
            while True:  # the session ends, another worker takes the shard and catches up
                after = await probe.ask(lagging, moved[0], n)
                if after.get("up_to_date"):
                    break
                assert time.monotonic() < deadline, [w.log_text()[-1500:] for w in workers if w is not victim]
                n += 1
            mine = {m["memory_id"] for m in after["memories"]}
            assert mine & probe.acked[probe.banks[moved[0]].scope], after
        victim.start()
        await wait_owning(settings, victim, [workers[0], workers[2]])
        traffic.stop.set()
        await asyncio.gather(*loops)
        await wait_caught_up(settings, topics, workers)
    finally:
        traffic.stop.set()
        await asyncio.gather(*loops, return_exceptions=True)
        await service.stop()

    assert traffic.failures == [] and probe.failures == [], (traffic.failures[:5], probe.failures[:5])
    assert traffic.crossed == [] and probe.crossed == [], (traffic.crossed[:5], probe.crossed[:5])
    assert traffic.searches > 0
    assert (moved[0], False) in probe.answers and (moved[0], True) in probe.answers, probe.answers
    for w in workers:
        assert w.log_text().count("projector owns shards") >= 1

    extra = {m: scope for scope, ids in probe.acked.items() for m in ids}
    live = assert_shards_exact(settings, traffic.acked, extra)
    await assert_replay_equals_live(settings, live, workers)
