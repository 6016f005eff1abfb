"""``memstream bench mixed``: search while the log is written.

An agent fleet searches its memories while it keeps writing them. This benchmark runs
that mix end to end on private topics: the real worker (projector, product defaults)
and the real HTTP API (``python -m memstream api``) as child processes, and in this
process an asyncio client over HTTP with API keys of several tenants (memory banks:
``team0/user0``, ``team0/user1``, ``team1/user0``: two users of one team and another
team, so both isolation boundaries are crossed).

1. seeding: per tenant ``seed`` turns in sessions of 20 (``MessageObserved``) and one
   memory drawn from each (``MemoryAdded`` with its session and source turn, embedded
   by the worker), produced straight to Kafka; then the worker's maintenance runs once
   (indexes current) and a few seconds of searches warm the API up;
2. rounds (``rounds``, default 6; ``--quick`` 5), each of two phases:
   a. "alone": ``searchers`` (default 12) closed-loop clients, each bound to one
      tenant, search (``GET /v1/search``, k = 10, 2-4 vocabulary words) for
      ``seconds`` (default 10; ``--quick`` 6);
   b. "mixed": the same searchers, plus writers at a steady ``rate`` (default 30
      writes/s, open loop: write ``i`` is due at ``i / rate``) for ``mixed_seconds``
      (default ``seconds``). A write is one HTTP request; they alternate a turn
      (``POST /v1/messages``, one turn in the writer's session) and a memory drawn
      from that turn (``POST /v1/memories`` with the session and the source turn), so
      30 writes/s are 15 turns and 15 memories a second. Every 5th memory is read
      back at once: a search for its own content with its position as
      ``min_position`` must return it (read-your-writes). Writes not begun when the
      phase ends are skipped (``writes_skipped``): a late write would run into the
      next phase; a second's gap follows;
   Why rounds: on a shared machine the same code's speed drifts by tens of percent
   within minutes, so the two sides of the ratio are measured seconds apart, many
   times (:mod:`memstream.bench.mixed_rounds` says how the figures come from them);
3. phase "writes alone": the writers alone for 10 s (at most the rounds' alone
   time; each writer numbers its turns and memories on from the mixed phases, so
   these are new rows too, not updates), for what a write costs each process
   (``cpu_ms_per_write``: API, worker, broker when it is the local one, client; the
   read-backs included);
4. drain: one read per tenant waits for the last write's positions, then every memory
   written is looked up in the store.

``cpu_cores_alone`` / ``cpu_cores_mixed``: each process's CPU over the phases of a kind, in cores
(``client`` is this process): on two shared cores, where the time of the mixed phase
goes.

Checked on every answer: ``errors_5xx`` (any 5xx), ``cross_tenant_results`` (a result
whose team or user is not the caller's, or whose id is not one of the tenant's
memories), ``ryw_failed``, ``missing_after_drain``. ``api_rss_mb`` / ``worker_rss_mb``
are the processes' resident memory at the end; the ``*_rss_slope_mb_per_min`` figures
are least-squares slopes over the last mixed phase's second half (sampled every
second: run ``--rounds 1 --mixed-seconds 600`` for the 10-minute memory check).
``api_search_cache``: what the API's search caches held at the end (rows of the row
cache, kept memories, and the kept indexes' MiB, from its ``/metrics``) and their
growth per minute over the same half: what the API's memory grows with while the
searched spaces grow, up to the caches' bounds.

``mixed_ratio`` (the median of the rounds' searches/s mixed / alone) and ``p99_ratio``
(p99 mixed / alone, each pooled over the rounds) are measured side by side in one run:
that is what the targets (>= 0.7, <= 2) judge on a machine shared with other work.
``rounds`` in the JSON holds each round's figures; ``ratio_method`` says how the
run's figures come from them.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from memstream.banks import create_key
from memstream.bench._common import free_port
from memstream.bench._events import (
    SPEAKERS,
    BenchWorkdir,
    WorkerProcess,
    bench_settings,
    create_topics,
    machine_info,
    make_corpus,
    print_table,
    status,
)
from memstream.bench.mixed_load import SESSION_TURNS, Load, Tally
from memstream.bench.mixed_rounds import PhaseLog, merged, pooled_figures
from memstream.bench.process_samples import CACHE_GAUGES, ProcessSampler
from memstream.bench.serving import ApiProcess, Tenant, banks_toml, broker_pid
from memstream.domain.content import content_hash
from memstream.domain.events import EventBase, MemoryAdded, MessageObserved
from memstream.projections.schema import MEMORIES, scoped_key
from memstream.projections.store import LanceStore, chunked, in_list
from memstream.settings import Settings
from memstream.streams.producers.producer import MemstreamProducer

__all__ = [
    "run", "DEFAULT_SECONDS", "QUICK_SECONDS", "DEFAULT_ROUNDS", "QUICK_ROUNDS", "DEFAULT_RATE",
    "TARGET_MIXED_RATIO", "TARGET_P99_RATIO",
]

DEFAULT_SECONDS = 10
QUICK_SECONDS = 6
"""Each phase of a round."""
DEFAULT_ROUNDS = 6
QUICK_ROUNDS = 5
DEFAULT_RATE = 30
TARGET_MIXED_RATIO = 0.7
TARGET_P99_RATIO = 2.0
_WARMUP_S = 5.0
_WRITES_ALONE_S = 10.0
_GAP_S = 1.0
"""After a mixed phase, before the next round: the last writes' acknowledgements and
read-backs are in, the worker's last batch mostly projected."""
_SETTLE_S = 12.0
"""Longer than the worker's maintenance period (10 s): the seed's indexes are current
when the measured phases start."""
_TENANTS: tuple[tuple[str, str], ...] = (("team0", "user0"), ("team0", "user1"), ("team1", "user0"))


def _seed_events(tenants: list[Tenant], per_tenant: int) -> list[EventBase]:
    """Per tenant: ``per_tenant`` turns in sessions of :data:`SESSION_TURNS` and one
    memory drawn from each turn (no vector: the worker embeds it, as for an agent's
    write). Contents are the benchmarks' Zipf-weighted sentences, a quarter naming
    an entity."""
    corpus = make_corpus(per_tenant * len(tenants), spaces=1, entity_rate=0.25, seed=23)
    now = datetime.now(timezone.utc)
    events: list[EventBase] = []
    for j, tenant in enumerate(tenants):
        scope = tenant.scope
        for i in range(per_tenant):
            text = corpus.contents[j * per_tenant + i]
            when = now - timedelta(minutes=per_tenant - i)
            session = f"seed-s{i // SESSION_TURNS:04d}"
            turn_id = f"{tenant.name}-seed-t{i:05d}"
            memory_id = f"{tenant.name}-seed-m{i:05d}"
            events.append(
                MessageObserved(
                    scope=scope, message_id=turn_id, role="user" if i % 2 == 0 else "assistant",
                    speaker=SPEAKERS[i % 2], content=text, session_id=session, occurred_at=when,
                    producer="memstream-bench",
                )
            )
            events.append(
                MemoryAdded(
                    scope=scope, memory_id=memory_id, content=text, content_hash=content_hash(text),
                    session_id=session, source_message_ids=(turn_id,), timestamp=when, occurred_at=when,
                    producer="memstream-bench",
                )
            )
            tenant.memory_ids.add(memory_id)
    return events


async def _produce(settings: Settings, events: list[EventBase]) -> None:
    async with MemstreamProducer(settings.streams, client_id="memstream-bench-mixed") as producer:
        for start in range(0, len(events), 500):
            await producer.send_many(events[start : start + 500])


def _wait_projected(settings: Settings, keys: list[str], worker: WorkerProcess, timeout_s: float = 300.0) -> None:
    store = LanceStore.from_settings(settings.storage, settings.embeddings.dim, read_consistency_interval=timedelta(0), create=False)
    deadline = time.monotonic() + timeout_s
    while True:
        worker.check_alive()
        found = sum(store.count(MEMORIES, in_list("pk", chunk)) for chunk in chunked(keys))
        if found >= len(keys):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {found} of {len(keys)} seeded memories projected:\n{worker.tail()}")
        time.sleep(0.5)


def _missing(settings: Settings, tenants: list[Tenant]) -> int:
    """Memories written (acknowledged) that the store does not hold."""
    store = LanceStore.from_settings(settings.storage, settings.embeddings.dim, read_consistency_interval=timedelta(0), create=False)
    missing = 0
    for tenant in tenants:
        keys = [scoped_key(tenant.team, tenant.user, m) for m in sorted(tenant.memory_ids)]
        found = 0
        for chunk in chunked(keys):
            found += store.count(MEMORIES, in_list("pk", chunk))
        missing += len(keys) - found
    return missing


# ------------------------------------------------------------------------------ run
def run(
    quick: bool = False,
    rate: float = DEFAULT_RATE,
    *,
    seconds: float | None = None,
    mixed_seconds: float | None = None,
    rounds: int | None = None,
    searchers: int = 12,
    writers: int = 12,
    seed: int = 600,
    keep: bool = False,
) -> dict[str, Any]:
    """Seed; ``rounds`` times search alone then beside writes; writes alone; drain;
    print and return the figures."""
    alone_s = float(seconds or (QUICK_SECONDS if quick else DEFAULT_SECONDS))
    mixed_s = float(mixed_seconds or alone_s)
    rounds_n = int(rounds or (QUICK_ROUNDS if quick else DEFAULT_ROUNDS))
    if rate <= 0 or alone_s <= 0 or mixed_s <= 0 or searchers < 1 or writers < 1 or seed < SESSION_TURNS or rounds_n < 1:
        raise ValueError("rate, seconds, rounds, searchers, writers must be positive and seed at least one session")
    machine = machine_info()
    tenants = [Tenant(f"tenant{j}", team, user) for j, (team, user) in enumerate(_TENANTS)]
    with BenchWorkdir("mixed", keep=keep) as wd:
        (wd.path / "banks.toml").write_text(banks_toml(tenants), encoding="utf-8")
        settings = wd.track(
            bench_settings(
                wd.path, banks_file=wd.path / "banks.toml", keys_file=wd.path / "keys.toml",
                api_host="127.0.0.1", api_port=free_port(),
                # the server's capacity, not the per-key policy: 12 searchers on 3 keys
                # pass the default 50 requests/s a key, and the 429s capped the phases
                api_rate_per_s=0,
            )
        )
        for t in tenants:
            t.key = create_key(settings, t.name)[0]
        asyncio.run(create_topics(settings))
        LanceStore.from_settings(settings.storage, settings.embeddings.dim)  # the tables exist before two processes open them
        worker = WorkerProcess(settings, wd.path / "worker")
        api = ApiProcess(settings, wd.path)
        sampler: ProcessSampler | None = None
        worker.start()
        try:
            worker.wait_ready()
            status(f"seeding {seed * len(tenants):,} turns and memories over {len(tenants)} tenants")
            asyncio.run(_produce(settings, _seed_events(tenants, seed)))
            keys = [scoped_key(t.team, t.user, m) for t in tenants for m in t.memory_ids]
            _wait_projected(settings, keys, worker)
            api.start()
            assert api.pid is not None and worker.pid is not None
            sampler = ProcessSampler({"api": api.pid, "worker": worker.pid}, f"{api.url}/metrics")
            sampler.start()
            load = Load(api.url, tenants, searchers, rate, writers, {"api": api.pid, "worker": worker.pid, "broker": broker_pid(settings)})
            status(f"settling ({_SETTLE_S:.0f} s: the worker's maintenance makes the indexes current)")
            time.sleep(_SETTLE_S)
            asyncio.run(load.search_for(_WARMUP_S, None))
            phases: list[tuple[PhaseLog, PhaseLog]] = []
            for r in range(rounds_n):
                alone, mixed = PhaseLog(), PhaseLog()
                status(
                    f"round {r + 1}/{rounds_n}: {searchers} searchers alone {alone_s:.0f} s, "
                    f"then with {rate:g} writes/s {mixed_s:.0f} s"
                )
                asyncio.run(load.search_for(alone_s, alone))
                mixed_started = time.perf_counter()
                asyncio.run(load.search_for(mixed_s, mixed, write=True))
                mixed_ended = time.perf_counter()
                phases.append((alone, mixed))
                time.sleep(_GAP_S)
            writes_alone = PhaseLog()
            writes_s = min(_WRITES_ALONE_S, alone_s * rounds_n)
            status(f"writes alone: {rate:g} writes/s for {writes_s:.0f} s (their CPU cost)")
            asyncio.run(load.search_for(writes_s, writes_alone, write=True, search=False))
            status("draining: waiting for the last writes to be projected")
            asyncio.run(load.drain())
            missing = _missing(settings, tenants)
            worker.check_alive()
        finally:
            if sampler is not None:
                sampler.stop()
            api.stop()
            worker.stop()
    assert sampler is not None
    tally = load.tally
    half = mixed_started + (mixed_ended - mixed_started) / 2
    figures = _figures(phases, writes_alone, tally, sampler, half, mixed_ended, missing)
    result: dict[str, Any] = {
        "benchmark": "mixed",
        "quick": quick,
        "rate": rate,
        "rounds_n": rounds_n,
        "seconds_alone": alone_s,
        "seconds_mixed": mixed_s,
        "tenants": len(tenants),
        "searchers": searchers,
        "writers": writers,
        "seeded_memories": seed * len(tenants),
        **figures,
        "status_counts": {str(k): v for k, v in sorted(tally.status_counts.items())},
        "machine": {**machine, "load_1m_end": machine_info()["load_1m"]},
    }
    _print(result)
    return result


def _figures(
    rounds: list[tuple[PhaseLog, PhaseLog]], writes_alone: PhaseLog, tally: Tally, sampler: ProcessSampler, half: float,
    end: float, missing: int,
) -> dict[str, Any]:
    alone, mixed = merged([a for a, _ in rounds]), merged([m for _, m in rounds])
    pooled = pooled_figures(rounds)
    per_round = pooled.pop("rounds")
    out = {
        **pooled,
        "cpu_cores_alone": alone.cores(),
        "cpu_cores_mixed": mixed.cores(),
        "cpu_ms_per_write": _per_write(writes_alone),
        "api_cpu_ms_per_search_mixed_net": _net_search_ms(mixed, writes_alone),
        "writes_per_s_alone": writes_alone.writes / writes_alone.seconds if writes_alone.seconds else 0.0,
        "writes_skipped": tally.writes_skipped,
        "memories_written": tally.memories_written,
        "errors_5xx": tally.errors_5xx,
        "errors_4xx": tally.other_errors,
        "client_timeouts": tally.timeouts,
        "ryw_checks": tally.ryw_checks,
        "ryw_failed": tally.ryw_failed,
        "missing_after_drain": missing,
        "results_checked": tally.results_checked,
        "cross_tenant_results": tally.cross_tenant,
        "api_rss_mb": sampler.last("api"),
        "worker_rss_mb": sampler.last("worker"),
        "api_rss_slope_mb_per_min": sampler.slope_per_min("api", half, end),
        "worker_rss_slope_mb_per_min": sampler.slope_per_min("worker", half, end),
        "api_search_cache": _cache_figures(sampler, half, end),
        "rounds": per_round,
    }
    out["meets_targets"] = bool(
        out["mixed_ratio"] is not None and out["mixed_ratio"] >= TARGET_MIXED_RATIO
        and out["p99_ratio"] is not None and out["p99_ratio"] <= TARGET_P99_RATIO
        and not (tally.errors_5xx or tally.timeouts or tally.ryw_failed or missing or tally.cross_tenant)
    )
    return out


def _cache_text(cache: dict[str, float | None]) -> str:
    def one(name: str, unit: str) -> str:
        return f"{num(cache[name])}{unit} ({num(cache[f'{name}_per_min'], 2)}/min)"
    return f"rows {one('cache_rows', '')}, kept {one('kept_memories', '')} in {one('kept_mb', ' MiB')}"


def _cache_figures(sampler: ProcessSampler, half: float, end: float) -> dict[str, float | None]:
    """What the API's search caches held at the end, and their growth per minute over
    the same half as the memory slopes: what the API's memory grows with."""
    out: dict[str, float | None] = {}
    for name in CACHE_GAUGES.values():
        out[name] = sampler.last(f"api_{name}")
        out[f"{name}_per_min"] = sampler.slope_per_min(f"api_{name}", half, end)
    return out


def _per_write(phase: PhaseLog) -> dict[str, float]:
    """Each process's CPU per write in a phase of writes alone (its read-backs
    included): what the write path costs the machine."""
    if not phase.writes:
        return {}
    return {name: round(s * 1000.0 / phase.writes, 2) for name, s in phase.cpu_s.items()}


def _net_search_ms(mixed: PhaseLog, writes_alone: PhaseLog) -> float | None:
    """The API's CPU per search in the mixed phase without its writes' handling (their
    cost per write taken from the writes-alone phase): the search's own cost under
    writes, to compare with the alone phase's."""
    per_write = _per_write(writes_alone).get("api")
    if per_write is None or mixed.api_cpu_s is None or not mixed.samples_ms:
        return None
    return (mixed.api_cpu_s * 1000.0 - per_write * mixed.writes) / len(mixed.samples_ms)


def _rounds_text(rounds: list[dict[str, Any]], key: str) -> str:
    return " ".join("-" if r[key] is None else f"{r[key]:.2f}" for r in rounds)


def _cores_text(cores: dict[str, float]) -> str:
    return " ".join(f"{name} {value:.2f}" for name, value in sorted(cores.items()))


def num(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _print(r: dict[str, Any]) -> None:
    print_table(
        f"memstream bench mixed: {r['searchers']} searchers, {r['rate']:g} writes/s, {r['tenants']} tenants, "
        f"{r['rounds_n']} rounds of {r['seconds_alone']:.0f} s alone then {r['seconds_mixed']:.0f} s mixed",
        [
            ("searches/s", f"{num(r['searches_per_s_alone'])} -> {num(r['searches_per_s_mixed'])}", "alone -> mixed, medians of the rounds"),
            ("mixed_ratio", num(r["mixed_ratio"], 2), f"target >= {TARGET_MIXED_RATIO}; rounds: " + _rounds_text(r["rounds"], "mixed_ratio")),
            ("search p50 ms", f"{num(r['search_p50_ms_alone'])} -> {num(r['search_p50_ms_mixed'])}", "alone -> mixed"),
            ("search p99 ms", f"{num(r['search_p99_ms_alone'])} -> {num(r['search_p99_ms_mixed'])}", "alone -> mixed"),
            ("p99_ratio", num(r["p99_ratio"], 2), f"target <= {TARGET_P99_RATIO}; rounds: " + _rounds_text(r["rounds"], "p99_ratio")),
            (
                "API CPU ms/search",
                f"{num(r['api_cpu_ms_per_search_alone'])} -> {num(r['api_cpu_ms_per_search_mixed'])}",
                f"alone -> mixed (mixed includes the writes' handling; without: {num(r['api_cpu_ms_per_search_mixed_net'])})",
            ),
            ("CPU cores mixed", _cores_text(r["cpu_cores_mixed"]), "alone: " + _cores_text(r["cpu_cores_alone"])),
            ("CPU ms per write", _cores_text(r["cpu_ms_per_write"]), f"{num(r['writes_per_s_alone'])} writes/s alone, read-backs included"),
            ("writes/s", num(r["writes_per_s"]), f"{r['memories_written']:,} memories (each with its turn)"),
            ("errors_5xx", str(r["errors_5xx"]), f"4xx: {r['errors_4xx']}, client timeouts (60 s): {r['client_timeouts']}"),
            ("ryw_failed", str(r["ryw_failed"]), f"of {r['ryw_checks']} read-backs with min_position"),
            ("missing_after_drain", str(r["missing_after_drain"]), "acknowledged memories not in the store"),
            ("cross_tenant_results", str(r["cross_tenant_results"]), f"of {r['results_checked']:,} results"),
            ("api_rss_mb", num(r["api_rss_mb"]), f"slope {num(r['api_rss_slope_mb_per_min'], 2)} MB/min (mixed, 2nd half)"),
            ("worker_rss_mb", num(r["worker_rss_mb"]), f"slope {num(r['worker_rss_slope_mb_per_min'], 2)} MB/min"),
            ("API search cache", _cache_text(r["api_search_cache"]), "at the end (growth per minute, 2nd half)"),
            ("meets_targets", str(r["meets_targets"]), ""),
            ("load_1m", f"{r['machine']['load_1m']} -> {r['machine']['load_1m_end']}", f"{r['machine']['cores']} cores, shared"),
        ],
    )
