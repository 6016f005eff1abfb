"""``memstream bench scale``: N workers in one consumer group on 2N partitions, one
shard per partition.

1. **Throughput.** The same log of memories (fresh topics and table set each time) is
   projected by 1 worker, then by N workers, each run timed from the first record
   produced to every shard caught up (workers started and settled before). Reported
   per worker: ``events_per_s_per_worker`` {"1": ..., "N": ...}. On one machine the N
   workers share its cores, so the N figure is a lower bound of what N machines do.
2. **Faults.** A steady produce into N workers; ``worker_kills`` times a random worker
   is SIGKILLed and restarted (two rebalances each). Records are also put on the
   partition kcat's default partitioner picks (crc32, ``misrouted``), and searches run
   throughout, each checked to return only its own space's rows. Then: nothing
   ``lost`` or ``duplicated`` (per shard, against the acknowledged writes), no
   ``misrouted_lost``, no ``cross_space_results``; the workers are stopped and a
   replay rebuilds the set: ``shards_equal_replay`` compares every shard's digest.

The last line is the JSON summary (see the issue's field list).
"""

from __future__ import annotations

import asyncio
import random
import time
import zlib
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from memstream.bench._common import WorkerProcess
from memstream.bench._events import (
    BenchWorkdir,
    bench_settings,
    corpus_events,
    create_topics,
    machine_info,
    make_corpus,
    print_table,
    produce_events,
    status,
)
from memstream.codec.wire import encode_event
from memstream.domain.events import MemoryAdded, Scope
from memstream.interfaces.service import MemoryService
from memstream.projections.embedders import LocalEmbedder
from memstream.projections.search import SearchFilters
from memstream.projections.store import ShardedStore, TableSets
from memstream.services.replay import replay
from memstream.services.shards import end_offsets, open_store, space_partition
from memstream.settings import Settings
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.topics import Topics

__all__ = ["run"]

SPACES = 24


def _settings(path: Path, partitions: int) -> Settings:
    return bench_settings(
        path,
        partitions=partitions,
        sharded=True,
        projector_batch_seconds=0.05,
        optimize_every_s=5.0,
        worker_session_timeout_s=6.0,
    )


def _workers(settings: Settings, root: Path, n: int) -> list[WorkerProcess]:
    out = []
    for i in range(n):
        s = settings.model_copy(update={"worker.instance": f"w{i}"})
        out.append(WorkerProcess(s, root / f"worker{i}", services=["projector"], loglevel="info"))
    return out


def _positions(settings: Settings) -> dict[tuple[str, int], int]:
    try:
        return open_store(settings, TableSets(settings.storage.root).current(), create=False).positions()
    except Exception:  # noqa: BLE001 - shards not created yet
        return {}


async def _caught_up(settings: Settings, ends: dict[tuple[str, int], int], timeout: float = 900.0) -> float:
    deadline = time.monotonic() + timeout
    while True:
        stored = _positions(settings)
        if all(stored.get(k, 0) >= v for k, v in ends.items() if v):
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"the workers did not catch up: {stored} vs {ends}")
        await asyncio.sleep(0.2)


def _settle(workers: list[WorkerProcess]) -> None:
    """Wait until every worker logged an assignment and the group is stable."""
    for w in workers:
        w.wait_log("projector owns shards", timeout=300.0)
    time.sleep(3.0)


def _rebalances(workers: list[WorkerProcess]) -> int:
    return sum(w.log_path.read_text(errors="replace").count("projector owns shards") for w in workers)


def _throughput(wd: BenchWorkdir, n_workers: int, partitions: int, events: int) -> float:
    """Events per second per worker for ``n_workers`` on a fresh log and set."""
    root = wd.path / f"throughput{n_workers}"
    settings = wd.track(_settings(root, partitions))
    asyncio.run(create_topics(settings))
    workers = _workers(settings, root, n_workers)
    try:
        for w in workers:
            w.start()
        _settle(workers)
        corpus = make_corpus(events, spaces=SPACES, dim=settings.embeddings.dim)
        model_id = LocalEmbedder(settings.embeddings.dim).model_id
        start = time.monotonic()
        produced = asyncio.run(produce_events(settings, corpus_events(corpus, model_id=model_id), events))
        done = asyncio.run(_caught_up(settings, produced.end_offsets))
        eps = events / (done - start)
        status(f"{n_workers} worker(s): {events:,} events in {done - start:.1f}s ({eps:,.0f}/s in all)")
        return eps / n_workers
    finally:
        for w in workers:
            w.stop()


def _misrouted(i: int, partitions: int) -> MemoryAdded:
    n = i
    while True:
        scope = Scope(team_id="kcat", user_id=f"k{n}")
        if zlib.crc32(scope.space.encode()) % partitions != space_partition(scope, partitions):
            return MemoryAdded(scope=scope, memory_id=f"kc{i}", content=f"k{n} prefers tea")
        n += 1000


async def _send_crc32(settings: Settings, topics: Topics, events: list[MemoryAdded]) -> None:
    """What kcat without ``-X topic.partitioner=murmur2_random`` does: crc32 of the key."""
    # raw on purpose: kcat's crc32 placement, not memstream's producer and partitioner
    raw = AIOKafkaProducer(bootstrap_servers=settings.broker.bootstrap_servers, acks="all")
    await raw.start()
    try:
        for e in events:
            rec = encode_event(e)
            await raw.send_and_wait(
                topics.events, value=rec.value, key=rec.key, headers=list(rec.headers),
                partition=zlib.crc32(rec.key) % topics.partitions,
            )
    finally:
        await raw.stop()


async def _faults(settings: Settings, topics: Topics, workers: list[WorkerProcess], *, seconds: float, kills: int) -> dict[str, Any]:
    spaces = [Scope(team_id="fleet", user_id=f"agent{i}") for i in range(SPACES)]
    acked: dict[Scope, set[str]] = {s: set() for s in spaces}
    stop = asyncio.Event()
    out: dict[str, Any] = {"search_failures": 0, "cross_space_results": 0, "searches": 0, "misrouted": 0}
    misrouted: list[MemoryAdded] = []

    async def load() -> None:
        rng = random.Random(5)
        async with MemstreamProducer(settings.streams) as producer:
            i = 0
            while not stop.is_set():
                burst = []
                for _ in range(25):
                    scope = rng.choice(spaces)
                    burst.append(MemoryAdded(scope=scope, memory_id=f"m{i}", content=f"{scope.user_id} noted fact {i}"))
                    i += 1
                await producer.send_many(burst)
                for e in burst:
                    acked[e.scope].add(e.memory_id)
                if i % 500 == 0:
                    batch = [_misrouted(len(misrouted) + j, topics.partitions) for j in range(2)]
                    await _send_crc32(settings, topics, batch)
                    misrouted.extend(batch)
                await asyncio.sleep(0.05)

    async def searches(service: MemoryService) -> None:
        rng = random.Random(3)
        while not stop.is_set():
            scope = rng.choice(spaces)
            try:
                hits = await service.search(scope, f"{scope.user_id} noted fact", 10, SearchFilters(), interface="api")
            except Exception:  # noqa: BLE001 - counted: a search must never fail
                out["search_failures"] += 1
            else:
                out["cross_space_results"] += sum(1 for h in hits if not h.content.startswith(f"{scope.user_id} "))
                out["searches"] += 1
            await asyncio.sleep(0.05)

    service = MemoryService(settings)
    await service.start()
    tasks = [asyncio.ensure_future(load()), asyncio.ensure_future(searches(service))]
    rng = random.Random(11)
    try:
        for k in range(kills):
            await asyncio.sleep(seconds / (kills + 1))
            victim = rng.choice(workers)
            status(f"kill {k + 1}/{kills}: SIGKILL {victim.workdir.name}")
            victim.kill()
            await asyncio.sleep(settings.worker.session_timeout_s + 4)
            victim.start()
        await asyncio.sleep(seconds / (kills + 1))
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await service.stop()
    out["misrouted"] = len(misrouted)
    out["acked"] = acked
    out["misrouted_events"] = misrouted
    return out


def _verify(settings: Settings, acked: dict[Scope, set[str]], misrouted: list[MemoryAdded]) -> dict[str, int]:
    live = open_store(settings, TableSets(settings.storage.root).current(), create=False)
    assert isinstance(live, ShardedStore)
    lost = duplicated = misrouted_lost = 0
    wanted_kcat = {e.memory_id: space_partition(e.scope, live.partitions) for e in misrouted}
    for p, shard in live.shards.items():
        rows = shard.rows("memories", None, ["pk", "team_id", "user_id", "memory_id"]).to_pylist()
        duplicated += len(rows) - len({r["pk"] for r in rows})
        have: dict[tuple[str, str], set[str]] = {}
        for r in rows:
            have.setdefault((r["team_id"], r["user_id"]), set()).add(r["memory_id"])
        for scope, ids in acked.items():
            if space_partition(scope, live.partitions) == p:
                lost += len(ids - have.get((scope.team_id, scope.user_id), set()))
        kc = {m for (team, _), ids in have.items() if team == "kcat" for m in ids}
        misrouted_lost += sum(1 for m, home in wanted_kcat.items() if home == p and m not in kc)
    return {"lost": lost, "duplicated": duplicated, "misrouted_lost": misrouted_lost}


def run(quick: bool = False, workers: int = 3, events: int | None = None, kills: int | None = None) -> dict[str, Any]:
    """Throughput of 1 and N workers, then the fault run (see the module docstring)."""
    partitions = 2 * workers
    n_events = int(events or (6_000 if quick else 60_000))
    n_kills = int(kills if kills is not None else (1 if quick else 3))
    seconds = 30.0 if quick else 120.0
    machine = machine_info()
    with BenchWorkdir("scale") as wd:
        status(f"throughput: 1 worker, then {workers}, {n_events:,} events on {partitions} partitions")
        per_worker = {"1": _throughput(wd, 1, partitions, n_events)}
        per_worker[str(workers)] = _throughput(wd, workers, partitions, n_events)

        root = wd.path / "faults"
        settings = wd.track(_settings(root, partitions))
        topics = asyncio.run(create_topics(settings))
        group = _workers(settings, root, workers)
        for w in group:
            w.start()
        _settle(group)
        status(f"faults: {seconds:.0f}s of steady writes and searches, {n_kills} SIGKILL(s)")
        faults = asyncio.run(_faults(settings, topics, group, seconds=seconds, kills=n_kills))
        ends_probe = asyncio.run(_end_offsets(settings, topics))
        asyncio.run(_caught_up(settings, ends_probe))
        rebalances = _rebalances(group)
        checks = _verify(settings, faults["acked"], faults["misrouted_events"])
        for w in group:
            w.stop()
        live = open_store(settings, TableSets(settings.storage.root).current(), create=False)
        live_digests = {p: s.table_digest() for p, s in live.shards.items()}
        report = asyncio.run(replay(settings))
        rebuilt = open_store(settings, report.replay_dir, create=False)
        equal = report.swapped and {p: s.table_digest() for p, s in rebuilt.shards.items()} == live_digests
    acked = sum(len(v) for v in faults["acked"].values())
    result: dict[str, Any] = {
        "benchmark": "scale",
        "quick": quick,
        "workers": workers,
        "partitions": partitions,
        "acked": acked,
        **checks,
        "worker_kills": n_kills,
        "rebalances": rebalances,
        "misrouted": faults["misrouted"],
        "shards_equal_replay": bool(equal),
        "cross_space_results": faults["cross_space_results"],
        "search_failures": faults["search_failures"],
        "searches": faults["searches"],
        "events_per_s_per_worker": per_worker,
        "throughput_events": n_events,
        "machine": {**machine, "load_1m_end": machine_info()["load_1m"]},
    }
    print_table(
        f"memstream bench scale: {workers} workers on {partitions} partitions",
        [
            ("events_per_s_per_worker", str({k: round(v) for k, v in per_worker.items()}), "1 worker alone; N sharing this machine"),
            ("acked / lost / duplicated", f"{acked} / {checks['lost']} / {checks['duplicated']}", "per shard, against acks"),
            ("kills / rebalances", f"{n_kills} / {rebalances}", "assignments logged by the workers"),
            ("misrouted / lost", f"{faults['misrouted']} / {checks['misrouted_lost']}", "crc32-partitioned records"),
            ("shards_equal_replay", str(bool(equal)), "every shard's digest against a replay"),
            ("cross_space / failed searches", f"{faults['cross_space_results']} / {faults['search_failures']}", f"of {faults['searches']} searches"),
        ],
    )
    return result


async def _end_offsets(settings: Settings, topics: Topics) -> dict[tuple[str, int], int]:
    return await end_offsets(settings, [topics.events, topics.messages], topics.partitions)
