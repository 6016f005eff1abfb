"""``memstream bench ingest``: what a memory costs beyond its embedding.

The one cost a memory cannot avoid is its embedding; everything else (HTTP, the gate,
sealing, signing, Kafka, decoding, LanceDB commits, index upkeep) is overhead. This
benchmark measures both in one run: the real worker (projector, product defaults,
the default neural embedder unless ``embedder`` says otherwise) and the real HTTP
API (``python -m memstream api``) as child processes, and in this process the load
generator, writing through each front door:

* ``http``: ``POST /v1/memories`` with a bank's key (httpx);
* ``sdk``: :class:`~memstream.streams.producers.producer.MemstreamProducer` straight to Kafka;
* ``mcp``: the ``add_memory`` tool over streamable HTTP at ``/mcp`` (the API's).

Each door writes ``n`` memories twice: ``steady`` (open loop at ``rate`` memories/s)
and ``max`` (closed loop, ``concurrency`` writes in flight). A phase ends when every
write is acknowledged *and* searchable (the worker's stored positions passed every
acknowledged offset, polled from this process). Per phase:

* ``memories_per_s``: ``n`` / (first write to last memory searchable);
* ``cpu_ms``: CPU ms per memory of each process (``/proc/<pid>/stat``, children
  included): ``api``, ``worker``, ``broker`` (the local broker, shared with anything
  else on the machine: its CPU rate over the second before the phase is subtracted)
  and ``client`` (this process, the load generator: not in the ratio);
* ``overhead_ratio``: (api + worker + broker) CPU per memory / ``embed_floor_ms``.

``embed_floor_ms``: the same embedder, built here from the same settings, embedding
the phase's own texts in one call (its best batching), CPU ms per text; measured
right after the phase, so the two sides of the ratio are seconds apart.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from memstream.banks import create_key
from memstream.bench._common import free_port
from memstream.bench._events import (
    BenchWorkdir,
    WorkerProcess,
    bench_settings,
    create_topics,
    machine_info,
    make_corpus,
    median,
    print_table,
    process_cpu_seconds,
    status,
)
from memstream.bench.serving import ApiProcess, Tenant, banks_toml, broker_pid
from memstream.domain.log import LogPosition
from memstream.projections.embedders import build_embedder
from memstream.projections.store import LanceStore
from memstream.settings import EmbeddingSettings, Settings
from memstream.streams.producers.producer import MemstreamProducer

__all__ = ["run", "DOORS", "DEFAULT_N", "QUICK_N", "DEFAULT_RATE", "TARGET_OVERHEAD_RATIO"]

DOORS = ("http", "sdk", "mcp")
DEFAULT_N = 600
QUICK_N = 150
DEFAULT_RATE = 30.0
DEFAULT_CONCURRENCY = 16
TARGET_OVERHEAD_RATIO = 3.0
_SEARCHABLE_TIMEOUT_S = 300.0
_BACKGROUND_S = 1.0
_SETTLE_S = 2.0


class Doors:
    """One writer per front door, all bound to one memory bank."""

    def __init__(self, settings: Settings, api_url: str, tenant: Tenant) -> None:
        self.settings, self.api_url, self.tenant = settings, api_url, tenant

    async def write(self, door: str, texts: list[str], rate: float | None, concurrency: int) -> list[LogPosition]:
        """Write every text through ``door``: open loop at ``rate`` a second, or as
        fast as ``concurrency`` writes in flight allow (``rate`` None)."""
        if door == "http":
            async with httpx.AsyncClient(base_url=self.api_url, headers=self.tenant.headers, timeout=60) as client:
                return await _drive(texts, rate, concurrency, lambda t: self._http(client, t))
        if door == "sdk":
            async with MemstreamProducer(self.settings.streams) as producer:
                scope = self.tenant.scope.model_dump()
                return await _drive(texts, rate, concurrency, lambda t: self._sdk(producer, scope, t))
        if door == "mcp":
            async with httpx2.AsyncClient(headers=self.tenant.headers, timeout=60) as http:
                async with Client(streamable_http_client(f"{self.api_url}/mcp", http_client=http)) as client:
                    return await _drive(texts, rate, concurrency, lambda t: self._mcp(client, t))
        raise ValueError(f"unknown front door {door!r}: one of {', '.join(DOORS)}")

    @staticmethod
    async def _http(client: httpx.AsyncClient, text: str) -> LogPosition:
        response = await client.post("/v1/memories", json={"content": text})
        response.raise_for_status()
        return LogPosition.parse(response.json()["position"])

    @staticmethod
    async def _sdk(producer: MemstreamProducer, scope: dict[str, Any], text: str) -> LogPosition:
        return (await producer.add_memory(scope, text)).position

    @staticmethod
    async def _mcp(client: Client, text: str) -> LogPosition:
        result = await client.call_tool("add_memory", {"content": text})
        if result.is_error or result.structured_content is None:
            raise RuntimeError(f"add_memory failed: {result.content}")
        return LogPosition.parse(result.structured_content["position"])


async def _drive(texts: list[str], rate: float | None, concurrency: int, one: Any) -> list[LogPosition]:
    """Open loop (write ``i`` due at ``i / rate``, each its own task) or closed loop
    (``concurrency`` tasks taking the next text)."""
    if rate is not None:
        started = time.perf_counter()
        tasks = []
        for i, text in enumerate(texts):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(text)))
        return list(await asyncio.gather(*tasks))
    todo = iter(enumerate(texts))
    out: list[LogPosition | None] = [None] * len(texts)

    async def lane() -> None:
        for i, text in todo:
            out[i] = await one(text)

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return [p for p in out if p is not None]


def _wait_searchable(store: LanceStore, written: list[LogPosition]) -> None:
    """Until the stored positions pass every acknowledged offset."""
    need: dict[tuple[str, int], int] = {}
    for p in written:
        need[(p.topic, p.partition)] = max(need.get((p.topic, p.partition), 0), p.offset + 1)
    deadline = time.monotonic() + _SEARCHABLE_TIMEOUT_S
    while True:
        have = store.positions()
        if all(have.get(k, 0) >= v for k, v in need.items()):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"memories not searchable after {_SEARCHABLE_TIMEOUT_S:.0f}s: {need} vs {have}")
        time.sleep(0.02)


class Cpu:
    """CPU seconds so far of the measured processes (``client``: this one)."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.pids = pids

    def now(self) -> dict[str, float]:
        out = {name: process_cpu_seconds(pid) for name, pid in self.pids.items()}
        return {**{k: v for k, v in out.items() if v is not None}, "client": time.process_time()}

    def broker_rate(self, seconds: float) -> float:
        """The broker's CPU a second when this run writes nothing (others' load)."""
        before = self.now().get("broker")
        time.sleep(seconds)
        after = self.now().get("broker")
        return 0.0 if before is None or after is None else max(0.0, (after - before) / seconds)


def _phase(doors: Doors, store: LanceStore, cpu: Cpu, door: str, mode: str, texts: list[str],
           rate: float, concurrency: int, embedder: Any) -> dict[str, Any]:
    background = cpu.broker_rate(_BACKGROUND_S)
    before, started = cpu.now(), time.perf_counter()
    written = asyncio.run(doors.write(door, texts, rate if mode == "steady" else None, concurrency))
    acked = time.perf_counter()
    _wait_searchable(store, written)
    ended = time.perf_counter()
    after = cpu.now()
    wall = ended - started
    spent = {k: after[k] - before[k] for k in after if k in before}
    if "broker" in spent:  # others' load on a shared broker: its rate before the phase
        spent["broker_raw"] = spent["broker"]
        spent["broker"] = max(0.0, spent["broker"] - background * wall)
    floor_started = time.process_time()
    embedder.embed(texts)
    floor_ms = (time.process_time() - floor_started) * 1e3 / len(texts)
    per = {k: v * 1e3 / len(texts) for k, v in spent.items()}
    served = sum(per.get(k, 0.0) for k in ("api", "worker", "broker"))
    return {
        "door": door, "mode": mode, "memories": len(written),
        "memories_per_s": len(written) / wall, "acked_per_s": len(written) / (acked - started),
        "cpu_ms": per, "embed_floor_ms": floor_ms, "broker_background_cores": background,
        "overhead_ratio": served / floor_ms if floor_ms > 0 else None,
    }


def _texts(n: int, door: str, mode: str, seed: int) -> list[str]:
    corpus = make_corpus(n, spaces=1, seed=seed)
    return [f"{text} ({door} {mode} {i})" for i, text in enumerate(corpus.contents)]


def run(
    quick: bool = False,
    n: int | None = None,
    *,
    rate: float = DEFAULT_RATE,
    concurrency: int = DEFAULT_CONCURRENCY,
    doors: str = ",".join(DOORS),
    embedder: str | None = None,
    keep: bool = False,
) -> dict[str, Any]:
    """Start the worker and the API; write ``n`` memories through each door, steady
    then at the maximum rate; print and return the figures."""
    count = int(n or (QUICK_N if quick else DEFAULT_N))
    chosen = [d.strip() for d in doors.split(",") if d.strip()]
    if count < 1 or rate <= 0 or concurrency < 1 or not chosen or set(chosen) - set(DOORS):
        raise ValueError(f"n, rate, concurrency must be positive and doors among {', '.join(DOORS)}")
    machine = machine_info()
    tenant = Tenant("ingest", "team0", "user0")
    with BenchWorkdir("ingest", keep=keep) as wd:
        (wd.path / "banks.toml").write_text(banks_toml([tenant]), encoding="utf-8")
        overrides: dict[str, Any] = {"embedder": embedder or EmbeddingSettings.model_fields["provider"].default}
        settings = wd.track(bench_settings(
            wd.path, banks_file=wd.path / "banks.toml", keys_file=wd.path / "keys.toml",
            api_host="127.0.0.1", api_port=free_port(), api_rate_per_s=0, **overrides,
        ))
        tenant.key = create_key(settings, tenant.name)[0]
        asyncio.run(create_topics(settings))
        LanceStore.from_settings(settings.storage, settings.embeddings.dim)  # the tables exist before two processes open them
        worker, api = WorkerProcess(settings, wd.path / "worker"), ApiProcess(settings, wd.path)
        worker.start()
        try:
            worker.wait_ready()
            api.start()
            store = LanceStore.from_settings(settings.storage, settings.embeddings.dim, read_consistency_interval=timedelta(0), create=False)
            cpu = Cpu({"api": api.pid, "worker": worker.pid, "broker": broker_pid(settings)})
            model = build_embedder(settings.embeddings)
            model.embed(["warm up the model"])
            front = Doors(settings, api.url, tenant)
            status("warming up: 20 memories through each door")
            for door in chosen:
                _phase(front, store, cpu, door, "max", _texts(20, door, "warm", 1), rate, concurrency, model)
            phases = []
            for seed, mode in enumerate(("steady", "max"), start=2):
                for door in chosen:
                    status(f"{door} {mode}: {count} memories" + (f" at {rate:g}/s" if mode == "steady" else f", {concurrency} in flight"))
                    phases.append(_phase(front, store, cpu, door, mode, _texts(count, door, mode, seed), rate, concurrency, model))
                    time.sleep(_SETTLE_S)
            worker.check_alive()
        finally:
            api.stop()
            worker.stop()
    result = {
        "benchmark": "ingest", "quick": quick, "memories_per_phase": count, "rate": rate,
        "concurrency": concurrency, "embedder": settings.embeddings.provider, "phases": phases,
        "embed_floor_ms": median(p["embed_floor_ms"] for p in phases),
        "target_overhead_ratio": TARGET_OVERHEAD_RATIO,
        "machine": {**machine, "load_1m_end": machine_info()["load_1m"]},
    }
    _print(result)
    return result


def _print(r: dict[str, Any]) -> None:
    rows = []
    for p in r["phases"]:
        cpu = p["cpu_ms"]
        rows.append((
            f"{p['door']} {p['mode']}",
            f"{p['memories_per_s']:,.1f}/s",
            f"api {cpu.get('api', 0):.1f} + worker {cpu.get('worker', 0):.1f} + broker {cpu.get('broker', 0):.1f} ms "
            f"(client {cpu.get('client', 0):.1f}; broker before subtracting others' "
            f"{p['broker_background_cores']:.2f} cores: {cpu.get('broker_raw', 0):.1f}); embed floor {p['embed_floor_ms']:.2f} ms; "
            f"overhead_ratio {p['overhead_ratio']:.1f}",
        ))
    rows.append(("load_1m", f"{r['machine']['load_1m']} -> {r['machine']['load_1m_end']}", f"{r['machine']['cores']} cores, shared"))
    print_table(
        f"memstream bench ingest: {r['memories_per_phase']} memories a phase, {r['embedder']} embedder, "
        f"steady {r['rate']:g}/s and max ({r['concurrency']} in flight); target overhead_ratio <= {r['target_overhead_ratio']:g}",
        rows,
    )
