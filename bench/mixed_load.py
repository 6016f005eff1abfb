"""The mixed benchmark's load: writes at a steady rate through the HTTP API while searches
run as fast as they are answered, read-your-writes checked every few writes, and the
tally of what each phase did."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from memstream.bench._events import (
    SPEAKERS,
    make_corpus,
    make_queries,
    process_cpu_seconds,
)
from memstream.bench.mixed_rounds import PhaseLog
from memstream.bench.serving import Tenant

SESSION_TURNS = 20
"""Turns per conversation session, in the seed and in the load."""
_RYW_EVERY = 5
"""Every fifth write is read back (read-your-writes), the rest only acknowledged."""


@dataclass
class Tally:
    """What every answer is checked for, over the whole run."""

    status_counts: dict[int, int] = field(default_factory=dict)
    errors_5xx: int = 0
    other_errors: int = 0
    cross_tenant: int = 0
    results_checked: int = 0
    writes: int = 0
    memories_written: int = 0
    ryw_checks: int = 0
    ryw_failed: int = 0
    timeouts: int = 0
    """Requests the server did not answer within the client's 60 s."""
    writes_skipped: int = 0
    """Writes due in a phase that no writer had begun when it ended."""
    last_positions: dict[str, dict[tuple[str, int], int]] = field(default_factory=dict)

    def answer(self, response: httpx.Response) -> bool:
        code = response.status_code
        self.status_counts[code] = self.status_counts.get(code, 0) + 1
        if code >= 500:
            self.errors_5xx += 1
        elif code >= 400:
            self.other_errors += 1
        return code < 400

    def position(self, tenant: Tenant, text: str) -> None:
        topic, partition, offset = text.rsplit(":", 2)
        known = self.last_positions.setdefault(tenant.name, {})
        key = (topic, int(partition))
        known[key] = max(known.get(key, -1), int(offset))


# ------------------------------------------------------------------------------ load
class Load:
    """The searchers and writers, on one event loop in this process."""

    def __init__(
        self, url: str, tenants: list[Tenant], searchers: int, rate: float, writers: int, pids: dict[str, int | None]
    ) -> None:
        self.url = url
        self.pids = pids
        """The processes whose CPU each phase records (``api`` first)."""
        self.tenants = tenants
        self.searchers = searchers
        self.rate = rate
        self.writers = writers
        self.queries = make_queries(400, seed=29)
        self.tally = Tally()
        self.phase: PhaseLog | None = None
        self._stop = asyncio.Event()
        self._reads: list[asyncio.Future[None]] = []
        self._words = make_corpus(4_000, spaces=1, entity_rate=0.25, seed=31).contents
        self._written = [0] * writers  # per writer, across phases: every write is a new id

    def _client(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=self.searchers + self.writers + 4, max_keepalive_connections=64)
        return httpx.AsyncClient(base_url=self.url, limits=limits, timeout=httpx.Timeout(60.0))

    def _check_results(self, tenant: Tenant, body: dict[str, Any]) -> list[str]:
        ids = []
        for hit in body.get("results", ()):
            self.tally.results_checked += 1
            mid = str(hit.get("memory_id"))
            if hit.get("team_id") != tenant.team or hit.get("user_id") != tenant.user or not mid.startswith(f"{tenant.name}-"):
                self.tally.cross_tenant += 1
            ids.append(mid)
        return ids

    async def _searcher(self, client: httpx.AsyncClient, index: int) -> None:
        tenant = self.tenants[index % len(self.tenants)]
        i = index * 37
        while not self._stop.is_set():
            query = self.queries[i % len(self.queries)]
            i += 1
            started = time.perf_counter()
            response = await self._call(client.get("/v1/search", params={"q": query, "k": 10}, headers=tenant.headers))
            elapsed_ms = (time.perf_counter() - started) * 1000.0
            if response is not None and self.tally.answer(response):
                self._check_results(tenant, response.json())
                if self.phase is not None:
                    self.phase.samples_ms.append(elapsed_ms)

    async def _call(self, request: Any) -> httpx.Response | None:
        """An answer, or ``None`` (counted) when the server did not answer in time."""
        try:
            response: httpx.Response = await request
        except httpx.TimeoutException:
            self.tally.timeouts += 1
            return None
        return response

    async def search_for(self, seconds: float, log: PhaseLog | None, *, write: bool = False, search: bool = True) -> None:
        """Run the searchers (unless not ``search``) and, with ``write``, the writers
        for ``seconds``; writes not begun by then are skipped (counted)."""
        self._stop.clear()
        async with self._client() as client:
            tasks = [asyncio.ensure_future(self._searcher(client, i)) for i in range(self.searchers if search else 0)]
            if write:
                tasks.append(asyncio.ensure_future(self._write(client, seconds)))
            started = time.perf_counter()
            cpu = self._cpu()
            writes = self.tally.writes
            self.phase = log
            await asyncio.sleep(seconds)
            self.phase = None
            if log is not None:
                log.seconds = time.perf_counter() - started
                log.writes = self.tally.writes - writes
                after = self._cpu()
                log.cpu_s = {name: after[name] - cpu[name] for name in after.keys() & cpu.keys()}
                log.api_cpu_s = log.cpu_s.get("api")
            self._stop.set()
            await asyncio.gather(*tasks)

    def _cpu(self) -> dict[str, float]:
        """CPU seconds so far of each process (this one's own, without its children)."""
        out = {"client": time.process_time()}
        for name, pid in self.pids.items():
            used = process_cpu_seconds(pid)
            if used is not None:
                out[name] = used
        return out

    async def _write(self, client: httpx.AsyncClient, seconds: float) -> None:
        """Writes at ``rate`` for ``seconds`` by ``writers`` tasks: write ``i`` is due
        at ``i / rate`` (a writer still busy leaves it to the next free one)."""
        queue: asyncio.Queue[int | None] = asyncio.Queue()
        workers = [asyncio.ensure_future(self._writer(client, w, queue)) for w in range(self.writers)]
        started = time.perf_counter()
        n = int(seconds * self.rate / 2)  # pairs: a turn, then a memory drawn from it
        for i in range(n):
            if self._stop.is_set():
                self.tally.writes_skipped += 2 * (n - i)
                break
            due = started + 2 * i / self.rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            queue.put_nowait(i)
        for _ in workers:
            queue.put_nowait(None)
        await asyncio.gather(*workers)
        reads, self._reads = self._reads, []
        await asyncio.gather(*reads)

    async def _writer(self, client: httpx.AsyncClient, w: int, queue: asyncio.Queue[int | None]) -> None:
        tenant = self.tenants[w % len(self.tenants)]
        while True:
            i = await queue.get()
            if i is None:
                return
            if self._stop.is_set():  # the phase is over: a late write would run into the next
                self.tally.writes_skipped += 2
                continue
            n = self._written[w]
            text = f"{self._words[i % len(self._words)]} code{w}x{n}q"
            session = f"w{w:02d}-s{n // SESSION_TURNS:04d}"
            turn_id = f"{tenant.name}-w{w:02d}-t{n:06d}"
            memory_id = f"{tenant.name}-w{w:02d}-m{n:06d}"
            n = self._written[w] = n + 1
            body = {"session_id": session, "messages": [{"content": text, "message_id": turn_id, "speaker": SPEAKERS[n % 2]}]}
            response = await self._call(client.post("/v1/messages", json=body, headers=tenant.headers))
            self.tally.writes += 1
            if response is not None and self.tally.answer(response):
                self.tally.position(tenant, response.json()["position"])
            memory = {"content": text, "memory_id": memory_id, "session_id": session, "source_message_ids": [turn_id]}
            response = await self._call(client.post("/v1/memories", json=memory, headers=tenant.headers))
            self.tally.writes += 1
            if response is None or not self.tally.answer(response):
                continue
            self.tally.memories_written += 1
            tenant.memory_ids.add(memory_id)
            position = response.json()["position"]
            self.tally.position(tenant, position)
            if n % _RYW_EVERY == 0:  # beside the writes: a slow read must not slow the rate
                self._reads.append(asyncio.ensure_future(self._read_back(client, tenant, text, memory_id, position)))

    async def _read_back(self, client: httpx.AsyncClient, tenant: Tenant, text: str, memory_id: str, position: str) -> None:
        self.tally.ryw_checks += 1
        response = await self._call(client.get(
            "/v1/search", params={"q": text, "k": 10, "min_position": position}, headers=tenant.headers
        ))
        ok = response is not None and self.tally.answer(response)
        if not ok or memory_id not in self._check_results(tenant, response.json()):  # type: ignore[union-attr]
            self.tally.ryw_failed += 1

    async def drain(self) -> None:
        """One read per tenant that waits for the tenant's last writes."""
        async with self._client() as client:
            for tenant in self.tenants:
                positions = [f"{t}:{p}:{o}" for (t, p), o in self.tally.last_positions.get(tenant.name, {}).items()]
                if positions:
                    response = await client.get(
                        "/v1/search", params={"q": "drain", "k": 1, "min_position": positions}, headers=tenant.headers
                    )
                    self.tally.answer(response)
