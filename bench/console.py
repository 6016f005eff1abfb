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

The space also holds ``memories // 20`` settled decisions with their lessons (ledger
and reflections rows, over 50 subjects), and ``memories // 500`` pending decisions
with one outcome each written to the log (the pending fragment reads them there).
The spaces page is asked by a team-wide key (its read grows with the team); the
operations pages and the status fragment by the operator.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

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
from memstream.domain.events import MemoryReflected, build_event
from memstream.interfaces.console.session import CSRF_COOKIE, ensure_operator_token
from memstream.projections.reads import Cursor
from memstream.projections.embedders import build_embedder
from memstream.projections.projector import decision_update, reflection_row
from memstream.projections.schema import DECISIONS, ENTITIES, MEMORIES, MESSAGES, REFLECTIONS, schema_for
from memstream.projections.store import LanceStore
from memstream.streams.producers.producer import MemstreamProducer

__all__ = ["run", "TARGET_P95_MS"]

TARGET_P95_MS = 300.0
_CHUNK = 50_000
_WARMUP = 3


_SUBJECTS = 50


def _ledger_rows(settings: Any, user: str, n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``n`` settled decisions of the space and their lessons, as the projector stores
    them (``reflection_row``, ``decision_update``)."""
    scope = {"team_id": TEAM, "user_id": user, "agent_id": "default"}
    t0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
    lessons, decisions = [], []
    dschema = schema_for(DECISIONS, settings.embeddings.dim)
    for i in range(n):
        at = t0 + timedelta(minutes=i)
        e = build_event(MemoryReflected, scope=scope, reflection_id=f"r{i}", decision_id=f"d{i}", outcome_id=f"o{i}",
                        subject=f"S{i % _SUBJECTS}", rating="buy", decision_text=f"buy S{i % _SUBJECTS}, reason {i}",
                        raw_return=0.01, alpha=0.005, correct=True, content=f"lesson {i}: the call on S{i % _SUBJECTS} held",
                        occurred_at=at)
        pos = ("bench.events", 0, i)
        lessons.append(reflection_row(e, pos))
        row = decision_update(e, pos, status="reflected", rating="buy", decision_text=e.decision_text, horizon_days=5,
                              deadline=at + timedelta(days=14), decided_at=at - timedelta(days=7), outcome_id=e.outcome_id,
                              reflection_id=e.reflection_id, settled_at=at)
        decisions.append({f.name: row.get(f.name) for f in dschema})
    return lessons, decisions


async def _pending(settings: Any, user: str, n: int) -> None:
    """``n`` pending decisions of the space in the log, each with an outcome too short
    to settle it."""
    scope = {"team_id": TEAM, "user_id": user, "agent_id": "default"}
    async with MemstreamProducer(settings.streams, client_id="bench-console") as p:
        for i in range(n):
            await p.record_decision(scope, f"p{i}", f"P{i % _SUBJECTS}", "sell", f"sell P{i % _SUBJECTS}, reason {i}",
                                    datetime.now(timezone.utc) + timedelta(days=30), horizon_days=10)
            await p.observe_outcome(scope, f"po{i}", f"P{i % _SUBJECTS}", -0.01, 3, decision_id=f"p{i}")
        await p.flush()


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
    user = str(corpus.users[0])
    lessons, decisions = _ledger_rows(settings, user, size // 20)
    store.table(REFLECTIONS).add(lessons)
    store.table(DECISIONS).add(decisions)
    asyncio.run(_pending(settings, user, size // 500))
    status("optimising and building indexes as the worker's maintenance does")
    store.optimize()
    store.ensure_indexes()
    return user, random.Random(3).sample(list(corpus.memory_ids), min(200, size))


def _deep_cursor(settings: Any, size: int) -> str:
    """A timeline cursor deep in the space: at the time of a memory halfway down the
    table (on average half the space is newer)."""
    row = LanceStore.from_settings(settings.storage, settings.embeddings.dim).table(MEMORIES).search().select(["created_at"]).limit(1).offset(size // 2)
    return str(Cursor(row.to_arrow().column("created_at")[0].as_py(), "memory", ""))


Page = Callable[[int], str]


def _pages(user: str, ids: list[str], requests: int, deep: str) -> dict[str, dict[str, Page]]:
    """Per credential ("user": the space's key, "team": a team-wide key, "operator"),
    each page's path for the i-th request."""
    rng = random.Random(5)
    queries = make_queries(requests + _WARMUP)
    return {
        "user": {
            "search": lambda i: f"/console/search?user_id={user}&q={queries[i]}",
            "memory": lambda i: f"/console/memories/{rng.choice(ids)}?user_id={user}",
            "ledger": lambda i: f"/console/ledger?user_id={user}",
            "ledger, lessons on one subject": lambda i: f"/console/ledger?user_id={user}&subject=S{i % _SUBJECTS}",
            "ledger, page 40": lambda i: f"/console/ledger?user_id={user}&dpage=40&lpage=40",
            "pending (fragment)": lambda i: f"/console/ledger/pending?user_id={user}",
            "timeline": lambda i: f"/console/timeline?user_id={user}&start=2000-01-01T00:00:00&end=2090-01-01T00:00:00",
            "timeline, deep page": lambda i: f"/console/timeline?user_id={user}&start=2000-01-01T00:00:00&end=2090-01-01T00:00:00&after={quote(deep)}",
            "spaces": lambda i: "/console/spaces",
        },
        "team": {"spaces, team-wide key": lambda i: "/console/spaces"},
        "operator": {
            "operations": lambda i: "/console/ops",
            "operations status (fragment)": lambda i: "/console/ops/status",
            "dead letters": lambda i: "/console/ops/dead-letters",
        },
    }


async def _measure(settings: Any, credentials: dict[str, str], pages: dict[str, dict[str, Page]],
                   requests: int) -> dict[str, list[float]]:
    app = create_api(settings)
    out: dict[str, list[float]] = {}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        for who, credential in credentials.items():
            async with httpx.AsyncClient(transport=transport, base_url="http://console.bench") as c:
                await c.get("/console/login")
                login = await c.post("/console/login", data={"credential": credential, "csrf": c.cookies.get(CSRF_COOKIE)})
                assert login.status_code == 303, login.text
                for name, path in pages[who].items():
                    out[name] = []
                    for i in range(requests + _WARMUP):
                        t0 = time.perf_counter()
                        resp = await c.get(path(i), headers={"X-Console-Fragment": "1"})
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
        banks.write_text(f'[banks.bench]\nteam_id = "{TEAM}"\nuser_id = "{user}"\ndescription = "The benchmark space."\n'
                         f'[banks.team]\nteam_id = "{TEAM}"\ndescription = "The benchmark team."\n', encoding="utf-8")
        credentials = {"user": create_key(settings, "bench")[0], "team": create_key(settings, "team")[0],
                       "operator": ensure_operator_token(settings).read_text(encoding="utf-8").strip()}
        status(f"{requests} requests per page (after {_WARMUP} warm-up)")
        pages = _pages(user, ids, requests, _deep_cursor(settings, size))
        times = asyncio.run(_measure(settings, credentials, pages, requests))
    figures = {name: {"p50_ms": percentile(t, 50), "p95_ms": percentile(t, 95), "max_ms": max(t)} for name, t in times.items()}
    worst = max(f["p95_ms"] for f in figures.values())
    print_table(f"console page server time, {size:,} memories in one space", [
        (name, f"{f['p95_ms']:.1f} ms p95", f"p50 {f['p50_ms']:.1f} ms, max {f['max_ms']:.1f} ms") for name, f in figures.items()
    ])
    return {"memories": size, "requests_per_page": requests, "pages": figures, "worst_p95_ms": worst,
            "target_p95_ms": TARGET_P95_MS, "meets_target": worst <= TARGET_P95_MS, "machine": machine_info()}
