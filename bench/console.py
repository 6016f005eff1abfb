"""``memstream bench console``: the web console's page server time with many
memories in one space (the issue's target: p95 <= 300 ms at 100,000 memories).

1. one memory space of ``memories`` rows (``--quick``: 20,000), built by bulk ``add``
   of the rows the projector writes (as ``bench search`` builds them: memories, their
   L0 turns in sessions of 50, entities), optimised and indexed as the worker's
   maintenance does; vectors are random unit vectors tagged with the configured
   embedder's model (page time does not depend on what they point at);
2. the real API application (``create_api``: console mounted, the service started on
   the configured broker) is served in-process through httpx's ASGI transport, so the
   time is the server's: authentication, scope, reads, rendering, no network;
3. a console session logs in with a key of the space's bank, then each page is asked
   ``requests`` times (after a warm-up): search (the queries of ``bench search``), a
   memory's story (random memories), decisions and lessons, the timeline over the
   whole corpus, and the spaces page.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import httpx

from memstream.banks import create_key
from memstream.bench._events import (
    TEAM,
    BenchWorkdir,
    bench_settings,
    create_topics,
    entity_rows,
    machine_info,
    make_corpus,
    make_queries,
    memory_rows,
    message_rows,
    percentile,
    print_table,
    status,
)
from memstream.interfaces.api import create_api
from memstream.interfaces.console.session import CSRF_COOKIE
from memstream.projections.embedder import build_embedder
from memstream.projections.schema import ENTITIES, MEMORIES, MESSAGES
from memstream.projections.store import LanceStore

__all__ = ["run", "TARGET_P95_MS"]

TARGET_P95_MS = 300.0
_CHUNK = 50_000
_WARMUP = 3


def _build(settings: Any, size: int) -> tuple[str, list[str]]:
    """The space's tables; returns its user id and 200 of its memory ids."""
    corpus = make_corpus(size, spaces=1, dim=settings.embeddings.dim, entity_rate=0.2)
    model = build_embedder(settings.embeddings).model_id
    store = LanceStore.from_settings(settings.storage, settings.embeddings.dim)
    for start in range(0, size, _CHUNK):
        stop = min(size, start + _CHUNK)
        store.table(MEMORIES).add(memory_rows(corpus, model_id=model, start=start, stop=stop, superseded_every=50))
        store.table(MESSAGES).add(message_rows(corpus, start=start, stop=stop))
        ents = entity_rows(corpus, start=start, stop=stop)
        if ents.num_rows:
            store.table(ENTITIES).add(ents)
    status("optimising and building indexes as the worker's maintenance does")
    store.optimize()
    store.ensure_indexes()
    return str(corpus.users[0]), random.Random(3).sample(list(corpus.memory_ids), min(200, size))


async def _measure(settings: Any, key: str, user: str, ids: list[str], requests: int) -> dict[str, list[float]]:
    app = create_api(settings)
    rng = random.Random(5)
    queries = make_queries(requests + _WARMUP)
    pages = {
        "search": lambda i: f"/console/search?user_id={user}&q={queries[i]}",
        "memory": lambda i: f"/console/memories/{rng.choice(ids)}?user_id={user}",
        "ledger": lambda i: f"/console/ledger?user_id={user}",
        "timeline": lambda i: f"/console/timeline?user_id={user}&start=2000-01-01T00:00:00&end=2090-01-01T00:00:00",
        "spaces": lambda i: "/console/spaces",
    }
    out: dict[str, list[float]] = {name: [] for name in pages}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://console.bench") as c:
            await c.get("/console/login")
            login = await c.post("/console/login", data={"credential": key, "csrf": c.cookies.get(CSRF_COOKIE)})
            assert login.status_code == 303, login.text
            for name, path in pages.items():
                for i in range(requests + _WARMUP):
                    t0 = time.perf_counter()
                    resp = await c.get(path(i))
                    elapsed = (time.perf_counter() - t0) * 1000
                    if resp.status_code != 200:
                        raise RuntimeError(f"{name}: {resp.status_code} {resp.text[:300]}")
                    if i >= _WARMUP:
                        out[name].append(elapsed)
    return out


def run(quick: bool = False, memories: int | None = None, requests: int = 40) -> dict[str, Any]:
    size = memories or (20_000 if quick else 100_000)
    with BenchWorkdir(f"console-{size}") as wd:
        banks = wd.path / "banks.toml"
        settings = wd.track(bench_settings(wd.path, banks_file=banks, keys_file=wd.path / "keys.toml",
                                           api_rate_per_s=0, api_rate_burst=0))
        asyncio.run(create_topics(settings))
        status(f"building one space of {size:,} memories")
        user, ids = _build(settings, size)
        banks.write_text(f'[banks.bench]\nteam_id = "{TEAM}"\nuser_id = "{user}"\ndescription = "The benchmark space."\n', encoding="utf-8")
        key = create_key(settings, "bench")[0]
        status(f"{requests} requests per page (after {_WARMUP} warm-up)")
        times = asyncio.run(_measure(settings, key, user, ids, requests))
    figures = {name: {"p50_ms": percentile(t, 50), "p95_ms": percentile(t, 95), "max_ms": max(t)} for name, t in times.items()}
    worst = max(f["p95_ms"] for f in figures.values())
    print_table(f"console page server time, {size:,} memories in one space", [
        (name, f"{f['p95_ms']:.1f} ms p95", f"p50 {f['p50_ms']:.1f} ms, max {f['max_ms']:.1f} ms") for name, f in figures.items()
    ])
    return {"memories": size, "requests_per_page": requests, "pages": figures, "worst_p95_ms": worst,
            "target_p95_ms": TARGET_P95_MS, "meets_target": worst <= TARGET_P95_MS, "machine": machine_info()}
