"""``memstream bench chaos``: fault injection on a real broker, to prove nothing is lost.

Why: memstream's promise is that the Kafka log is the source of truth and every view
is a faithful, exactly-once projection of it, whatever crashes on the way. This
benchmark breaks things on purpose while traffic flows and then checks the promise
record by record:

* a private Kafka broker (its own ports and data directory, never the shared one) is
  stopped and restarted ``broker_restarts`` times with its data kept, while a real
  worker process (projector + extractor) is SIGKILLed ``worker_kills`` times and
  restarted;
* ``events`` valid events (memories and conversation turns of ``tenants`` memory
  spaces) are produced through the idempotent SDK producer, paced over the fault
  window; a send that fails is sent again (the same event, the same ``event_id``);
* ``bad_inputs`` malformed records (random bytes, truncated JSON, wrong types, a
  missing scope, oversized content, unknown event types, injected control
  characters) are mixed into the same topics with a plain Kafka producer;
* the extractor's LLM is a scripted OpenAI-compatible server whose calls fail
  ``llm_failure_rate`` of the time (timeouts, HTTP 500s, garbage bodies, dropped
  connections).

Then, with the worker drained and stopped:

* every event acknowledged to the producer is in the log exactly once (``lost``,
  ``duplicated``, from a full read of the topics);
* every bad record is on the dead-letter topic with a reason (``dead_lettered``, by
  source position), and no valid one is;
* the live projection equals a replay of the log into fresh tables (``memstream
  replay --dry-run``: same rows, same content hashes), and every acknowledged memory
  is in the live view;
* every qualifying turn was extracted (a memory cites it) or is still pending (at or
  after the extractor's committed offset): ``turns_lost`` counts the others;
* ``searches`` random searches over the tenants never return a memory of another
  space (``cross_tenant_results``); each tenant's traffic comes from ``agents`` agents
  of its one user, and the half of the searches pinned to one agent (as an
  agent-pinned key's are) never return another agent's memory
  (``cross_agent_results``).

The last line (the CLI prints it) is the JSON summary with ``acked``, ``in_log``,
``lost``, ``duplicated``, ``bad_inputs``, ``dead_lettered``, ``worker_kills``,
``broker_restarts``, ``llm_failures``, ``turns_lost``, ``cross_tenant_results``,
``cross_agent_results``.
"""

from __future__ import annotations

import asyncio
import asyncio as _asyncio
import logging
import random
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

from aiokafka import AIOKafkaConsumer, TopicPartition

from memstream.bench._common import (
    WorkerProcess,
    console,
    err_console,
    free_port,
    group_offsets,
    percentile,
    progress_bar,
    table,
    wait_caught_up,
)
from memstream.bench.chaos_send import Faults, Ledger, forge_keys, inject_faults, produce_traffic
from memstream.bench.chaos_traffic import (
    _VOCAB,
    BAD_KINDS,
    ChaosPlan,
    FlakyLLM,
    make_bad_records,
    make_valid_events,
    tenant_scope,
)
from memstream.bench.disk_use import disk_ratios, drop_replaced_versions, set_bytes
from memstream.bench.openai_fake import OpenAICompatServer
from memstream.domain.access import ReadScope
from memstream.domain.events import EventBase, MemoryAdded, MessageObserved
from memstream.domain.log import LogPosition
from memstream.domain.gate import gate
from memstream.projections.embedders import build_embedder
from memstream.projections.schema import MEMORIES
from memstream.projections.search import SearchCache, search
from memstream.projections.store import TableSets
from memstream.sealing import TamperedRecord
from memstream.services.extraction import consumer_group
from memstream.services.replay import PHASE_VERIFY, replay
from memstream.services.shards import open_store, store_for
from memstream.settings import Settings
from memstream.streams.admin import ensure_topics
from memstream.streams.broker import local
from memstream.streams.dead_letters.publisher import DeadLetter, NotADeadLetter, parse_dead_letter
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.records.codec import decode_or_dead_letter, screen
from memstream.streams.sealing.sealed_records import RecordOpener
from memstream.streams.topics import Topics

__all__ = [
    "ChaosPlan",
    "BAD_KINDS",
    "tenant_scope",
    "make_valid_events",
    "make_bad_records",
    "FlakyLLM",
    "run_plan",
    "run",
]

# ------------------------------------------------------------------------------ running
async def _read_topics(bootstrap: str, names: Sequence[str]) -> list[Any]:
    """Every record of ``names`` up to their current end."""
    consumer = AIOKafkaConsumer(  # raw on purpose: given only an address (the bench broker, plaintext)
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024,
    )
    await consumer.start()
    try:
        tps = []
        for name in names:
            parts = consumer.partitions_for_topic(name)
            if parts is None:
                await consumer._client.force_metadata_update()  # noqa: SLF001
                parts = consumer.partitions_for_topic(name) or set()
            tps += [TopicPartition(name, p) for p in sorted(parts)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.seek_to_beginning(*tps)
        out: list[Any] = []
        remaining = {tp for tp in tps if ends[tp] > 0}
        while remaining:
            polled = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            for tp, recs in polled.items():
                out.extend(r for r in recs if r.offset < ends[tp])
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        return out
    finally:
        await consumer.stop()


class _Opened(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Any
    refused: bool = False


async def _opened(settings: Settings, topics: Topics, records: list[Any]) -> list[Any]:
    """``records`` with sealed values opened under the log's keys (the keys topic), as
    every reader of the log opens them; a record that does not open keeps its bytes
    (it is then counted as not decoded)."""
    async with SubjectKeys(settings.streams, topics, client_id="memstream-bench-chaos-keys") as keys:
        await keys.prepare((r.value, r.headers) for r in records)
        opener = RecordOpener(keys.keyring)
        out: list[Any] = []
        for r in records:
            refused = screen(r.key, r.headers) is not None  # the route check, before opening
            try:
                opened = None if refused else opener.open(r.value, r.headers)
            except TamperedRecord:
                opened = None
            value, headers = opened if opened is not None else (r.value, r.headers)
            out.append(_Opened(r.topic, r.partition, r.offset, r.key, value, headers, refused))
        return out


@dataclass
class Verdict:
    figures: dict[str, Any]
    problems: list[str]


def _verify_log(records: list[Any], topics: Topics, ledger: Ledger, valid: list[EventBase]) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    valid_positions: set[tuple[str, int, int]] = set()
    dead: dict[tuple[str, int, int], str] = {}
    bad = set(ledger.bad)
    for r in records:
        if r.topic == topics.dead_letter:
            try:
                dl = parse_dead_letter(r.key, r.value, r.headers)
            except NotADeadLetter:
                continue
            dead[(dl.source_topic, dl.source_partition, dl.source_offset)] = dl.reason
            continue
        if getattr(r, "refused", False) or (not isinstance(r, _Opened) and screen(r.key, r.headers) is not None):
            continue
        item = decode_or_dead_letter(r.topic, r.partition, r.offset, r.key, r.value, r.headers)
        if isinstance(item, DeadLetter) or (r.topic, r.partition, r.offset) in bad:
            continue  # a forgery decodes without the worker's key, yet it is one of the bad inputs
        counts[str(item.event.event_id)] += 1
        valid_positions.add((r.topic, r.partition, r.offset))
    acked = set(ledger.acked)
    ours = {str(e.event_id) for e in valid}
    bad_found = [pos for pos in ledger.bad if pos in dead and dead[pos].strip()]
    return {
        "acked": len(acked),
        "in_log": sum(1 for e in acked if counts[e] >= 1),
        "lost": sum(1 for e in acked if counts[e] == 0),
        "duplicated": sum(1 for e in ours if counts[e] > 1),
        "unacked_in_log": sum(1 for e in ours - acked if counts[e] >= 1),
        "bad_inputs": len(ledger.bad),
        "dead_lettered": len(bad_found),
        "valid_dead_lettered": len(valid_positions & set(dead)),
        "valid_dead_letter_reasons": sorted({dead[p] for p in valid_positions & set(dead)})[:5],
        "dead_letter_records": sum(1 for r in records if r.topic == topics.dead_letter),
    }


def memory_rows(store: Any, columns: list[str]) -> list[dict[str, Any]]:
    """The memories table's ``columns``, over every shard of a sharded store."""
    rows = store.table_source(MEMORIES) if hasattr(store, "shards") else store.table(MEMORIES).to_arrow()
    return rows.select(columns).to_pylist()


def _verify_turns(
    settings: Settings, store: Any, valid: list[EventBase], positions: dict[str, LogPosition]
) -> dict[str, int]:
    """Every qualifying turn: extracted (a memory cites it) or still pending."""
    committed = _asyncio.run(group_offsets(settings.broker.bootstrap_servers, consumer_group(settings)))
    cited: set[tuple[str, str]] = set()
    table_ = memory_rows(store, ["team_id", "user_id", "source_message_ids"])
    for row in table_:
        for sid in row["source_message_ids"] or ():
            cited.add((f"{row['team_id']}/{row['user_id']}", sid))
    turns = [e for e in valid if isinstance(e, MessageObserved) and gate(e.content).passed]
    extracted = pending = lost = 0
    for turn in turns:
        if (turn.scope.space, turn.message_id) in cited:
            extracted += 1
            continue
        pos = positions.get(str(turn.event_id))
        if pos is not None and pos.offset >= committed.get((pos.topic, pos.partition), 0):
            pending += 1
        else:
            lost += 1
    return {"turns": len(turns), "turns_extracted": extracted, "turns_pending": pending, "turns_lost": lost}


def _searches(
    store: Any, embedder: Any, plan: ChaosPlan, rng: random.Random
) -> tuple[int, int, int, list[float]]:
    """Random searches: half over a tenant's whole space (a result of another space is
    a cross-tenant result), half pinned to one of its agents (a result of another
    agent is a cross-agent result). Returns (cross-tenant, cross-agent, results,
    latencies)."""
    cache = SearchCache()
    jobs = []
    for _ in range(plan.searches):
        tenant = rng.randrange(plan.tenants)
        words = rng.randint(1, 4)
        query = " ".join(rng.choice(_VOCAB) for _ in range(words))
        if rng.random() < 0.2:
            query = f"Tenant {rng.randrange(plan.tenants):02d} {query}"  # names another tenant
        if rng.random() < 0.2:
            query = f"agent a{rng.randrange(plan.agents)} {query}"  # names an agent
        scope = tenant_scope(tenant)
        reader = ReadScope(scope.team_id, scope.user_id, f"a{rng.randrange(plan.agents)}" if rng.random() < 0.5 else None)
        jobs.append((reader, query, rng.choice((1, 5, 10, 20))))

    def one(job: tuple[ReadScope, str, int]) -> tuple[int, int, int, float]:
        reader, query, k = job
        t0 = time.perf_counter()
        results = search(store_for(store, reader), embedder, reader, query, k, cache=cache)
        ms = (time.perf_counter() - t0) * 1000
        tenant_leaks = sum(1 for r in results if (r.team_id, r.user_id) != (reader.team_id, reader.user_id))
        agent_leaks = sum(1 for r in results if reader.agent_id is not None and r.agent_id != reader.agent_id)
        return tenant_leaks, agent_leaks, len(results), ms

    leaks = agent_leaks = returned = 0
    latencies: list[float] = []
    with progress_bar() as bar, ThreadPoolExecutor(max_workers=4) as pool:
        task = bar.add_task("searches", total=len(jobs))
        for leak, agent_leak, n, ms in pool.map(one, jobs):
            leaks += leak
            agent_leaks += agent_leak
            returned += n
            latencies.append(ms)
            bar.advance(task)
    return leaks, agent_leaks, returned, latencies


def chaos_settings(workdir: Path, llm_base_url: str, *, timeout_s: float, sharded: bool = False) -> Settings:
    """A private world: broker ports, topics, app id, directories, the flaky LLM."""
    port, controller = free_port(), free_port()
    while controller == port:
        controller = free_port()
    suffix = uuid.uuid4().hex[:8]
    # keywords beat the environment, so an operator's MEMSTREAM_* cannot leak into the private world
    return Settings(
        home=workdir / "home",
        broker={
            "bootstrap_servers": f"127.0.0.1:{port}",
            "port": port,
            "controller_port": controller,
            "dir": None,
            "heap": "512m",
            "topic_prefix": f"chaos-{suffix}.",
            "partitions": 3,
        },
        storage={"root": workdir / "lance", "optimize_every_s": 5.0, "sharded": sharded},
        worker={"app_id": f"chaos-{suffix}"},
        embeddings={"provider": "local"},
        extraction={
            "llm_base_url": llm_base_url,
            "llm_api_key": "unused",
            "llm_model": "chaos-scripted",
            "llm_timeout_s": timeout_s,
            "llm_max_retries": 1,
            "idle_seconds": 1.0,
        },
    )


def run_plan(
    plan: ChaosPlan, *, workdir: Path | None = None, keep: bool = False, sharded: bool = False
) -> dict[str, Any]:
    """Run ``plan`` (see the module docstring) and return the summary; ``sharded``: the
    worker writes one shard per partition (its group projector), and the summary gives
    each shard's disk use against a replayed set's."""
    # aiokafka reports every failed connection while the broker is down on purpose
    for name in ("aiokafka", "kafka"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    rng = random.Random(plan.seed)
    own_dir = workdir is None
    root = Path(tempfile.mkdtemp(prefix="memstream-bench-chaos-")) if workdir is None else Path(workdir)
    timeout_s = 2.0
    llm = FlakyLLM(plan.llm_failure_rate, plan.seed, timeout_s)
    server = OpenAICompatServer(chat=llm, timeout_hint_s=timeout_s).start()
    settings = chaos_settings(root, server.base_url, timeout_s=timeout_s, sharded=sharded)
    topics = Topics.from_settings(settings.broker)
    run_id = uuid.uuid4().hex[:6]
    valid = make_valid_events(plan, rng, run_id)
    bad = make_bad_records(plan.bad_inputs, rng, topics, plan.tenants)
    rng.shuffle(bad)
    console.print(
        f"chaos: {len(valid)} events ({sum(isinstance(e, MessageObserved) for e in valid)} turns), "
        f"{len(bad)} bad inputs, {plan.tenants} tenants; {plan.worker_kills} worker kills, "
        f"{plan.broker_restarts} broker restarts, LLM failing {plan.llm_failure_rate:.0%}; "
        f"private broker 127.0.0.1:{settings.broker.port}, topics {settings.broker.topic_prefix}*"
    )
    ledger = Ledger()
    faults = Faults()
    worker = WorkerProcess(settings, root / "worker", services=["projector", "extractor"], loglevel="info")
    started = time.monotonic()
    figures: dict[str, Any] = {}
    try:
        local.start(settings.local_broker)
        asyncio.run(ensure_topics(settings.broker.bootstrap_servers, topics))
        worker.start()
        worker.wait_log("extractor assigned", timeout=180.0)

        async def traffic() -> float:
            done = asyncio.Event()
            with progress_bar() as bar:
                task = bar.add_task("produce under faults", total=len(valid))
                injector = asyncio.create_task(inject_faults(worker, settings.local_broker, plan, rng, faults, done))
                try:
                    seconds = await produce_traffic(
                        settings, valid, bad, plan, ledger, lambda n: bar.update(task, completed=n)
                    )
                    while not injector.done() and faults.worker_kills + faults.broker_restarts < (
                        plan.worker_kills + plan.broker_restarts
                    ):
                        await asyncio.sleep(0.5)
                finally:
                    done.set()
                    await injector
            return seconds

        produce_s = asyncio.run(traffic())
        if settings.security.sealing:
            figures.update(asyncio.run(forge_keys(settings, topics, ledger)))
        console.print(
            f"produced in {produce_s:.0f} s: {len(ledger.acked)} events and {len(ledger.bad)} bad inputs "
            f"acknowledged; {faults.worker_kills} kills, {faults.broker_restarts} broker restarts"
        )
        if not worker.alive():
            worker.start()
        store_box: list[Any] = []

        def positions() -> dict[tuple[str, int], int]:
            if not store_box:
                try:
                    live_set = TableSets(settings.storage.root).current()
                    store_box.append(open_store(settings, live_set, create=False, read_consistency_interval=timedelta(0)))
                except Exception:  # noqa: BLE001 - the worker has not created the tables yet
                    return {}
            return dict(store_box[0].positions())

        settle_start = time.monotonic()
        caught_up = True
        try:
            with progress_bar() as bar:
                task = bar.add_task("drain (extract + project)", total=None)
                asyncio.run(
                    wait_caught_up(
                        settings,
                        positions,
                        timeout=plan.settle_timeout_s,
                        alive=worker.alive,
                        on_poll=lambda s: bar.update(task, description=f"drain: {s.behind(extraction=True)} behind"),
                    )
                )
        except TimeoutError as exc:
            caught_up = False
            err_console.print(f"[yellow]{exc}; turns not extracted count as pending[/yellow]")
        settle_s = time.monotonic() - settle_start
        exit_code = worker.stop()
        console.print(f"drained in {settle_s:.0f} s (caught up: {caught_up}); worker stopped with exit code {exit_code}")

        records = asyncio.run(_read_topics(settings.broker.bootstrap_servers, [topics.messages, topics.events, topics.dead_letter]))
        if settings.security.sealing:
            records = asyncio.run(_opened(settings, topics, records))
        figures.update(_verify_log(records, topics, ledger, valid))
        live_dir = TableSets(settings.storage.root).current()
        store = open_store(settings, live_dir, create=False)
        live_bytes = set_bytes(live_dir)  # as the worker's maintenance left it
        figures.update(_verify_turns(settings, store, valid, ledger.acked))

        acked_memories = [e for e in valid if isinstance(e, MemoryAdded) and str(e.event_id) in ledger.acked]

        live_ids = {
            (r["team_id"], r["memory_id"])
            for r in memory_rows(store, ["team_id", "memory_id"])
        }
        figures["valid_not_projected"] = sum(1 for e in acked_memories if (e.scope.team_id, e.memory_id) not in live_ids)

        console.print(
            f"log: {figures['in_log']}/{figures['acked']} acknowledged events in the log, {figures['lost']} lost, "
            f"{figures['duplicated']} duplicated; {figures['dead_lettered']}/{figures['bad_inputs']} bad inputs "
            f"dead-lettered; turns lost {figures['turns_lost']}; memories not projected {figures['valid_not_projected']}"
        )
        replay_start = time.monotonic()
        replayed_bytes: dict[str, int] = {}
        replayed_newest_bytes: dict[str, int] = {}

        sets_dir = TableSets(settings.storage.root).path_of("built").parent

        def measure(phase: str) -> None:  # the built set, compacted, before it is removed
            if phase == PHASE_VERIFY:
                built = max((d for d in sets_dir.iterdir() if d.is_dir() and d != live_dir), key=lambda d: d.stat().st_mtime)
                replayed_bytes.update(set_bytes(built))
                drop_replaced_versions(built)  # the build's own history: gone a grace after its swap
                replayed_newest_bytes.update(set_bytes(built))

        report = asyncio.run(replay(settings, dry_run=True, on_phase=measure))
        figures["projection_matches_replay"] = not report.differences and bool(report.live_matches)
        figures["replay_differences"] = [f"{d.table}: {d}" for d in report.differences]
        figures["replay_s"] = round(time.monotonic() - replay_start, 1)
        figures["disk_bytes_live"], figures["disk_bytes_replayed"] = live_bytes, replayed_bytes
        figures["disk_live_over_replayed"] = disk_ratios(live_bytes, replayed_bytes)
        figures["disk_bytes_replayed_newest"] = replayed_newest_bytes
        figures["disk_live_over_replayed_newest"] = disk_ratios(live_bytes, replayed_newest_bytes)
        console.print(f"replay of the log: matches the live projection: {figures['projection_matches_replay']}")

        # the worker compacts on a timer while it runs; it was just stopped, so do its
        # last maintenance before reading (searches on thousands of small fragments
        # measure the fragments, not the search)
        store.optimize()
        embedder = build_embedder(settings.embeddings)
        leaks, agent_leaks, returned, latencies = _searches(store, embedder, plan, rng)

        figures.update(
            worker_kills=faults.worker_kills,
            worker_crashes=faults.worker_crashes,
            worker_exit_code=exit_code,
            broker_restarts=faults.broker_restarts,
            llm_calls=llm.calls,
            llm_failures=llm.failures.total(),
            llm_failure_kinds=dict(llm.failures),
            searches=plan.searches,
            search_results=returned,
            cross_tenant_results=leaks,
            cross_agent_results=agent_leaks,
            agents_per_tenant=plan.agents,
            search_p50_ms=round(percentile(latencies, 50), 2),
            tenants=plan.tenants,
            events=len(valid),
            resends=ledger.resends,
            send_errors=dict(ledger.send_errors),
            caught_up=caught_up,
            produce_s=round(produce_s, 1),
            settle_s=round(settle_s, 1),
            total_s=round(time.monotonic() - started, 1),
        )
    except BaseException:
        err_console.print(f"[red]worker log tail:[/red]\n{worker.tail(40)}")
        raise
    finally:
        worker.stop()
        server.stop()
        try:
            local.stop(settings.local_broker)
        except Exception as exc:  # noqa: BLE001 - report, keep the original error
            err_console.print(f"[yellow]could not stop the private broker: {exc}[/yellow]")
        if own_dir and not keep:
            shutil.rmtree(root, ignore_errors=True)
        elif keep:
            err_console.print(f"kept {root}")
    _print(figures, faults)
    return figures


def _print(figures: dict[str, Any], faults: Faults) -> None:
    rows = [
        ["events acknowledged", figures.get("acked")],
        ["  in the log", figures.get("in_log")],
        ["  lost", figures.get("lost")],
        ["  duplicated in the log", figures.get("duplicated")],
        ["  resent after a failed send", figures.get("resends")],
        ["bad inputs", figures.get("bad_inputs")],
        ["  dead-lettered with a reason", figures.get("dead_lettered")],
        ["forged key records and tombstones", figures.get("forged_key_records")],
        ["  subjects keyed before / after", f"{figures.get('subjects_keyed')} / {figures.get('subjects_keyed_after_forgery')}"],
        ["  valid records dead-lettered", figures.get("valid_dead_lettered")],
        ["memories acknowledged but not projected", figures.get("valid_not_projected")],
        ["projection equals a replay of the log", figures.get("projection_matches_replay")],
        ["worker SIGKILLs / own crashes", f"{figures.get('worker_kills')} / {figures.get('worker_crashes')}"],
        ["broker restarts", figures.get("broker_restarts")],
        ["LLM calls / failed", f"{figures.get('llm_calls')} / {figures.get('llm_failures')}"],
        ["qualifying turns", figures.get("turns")],
        ["  extracted / pending / lost", f"{figures.get('turns_extracted')} / {figures.get('turns_pending')} / {figures.get('turns_lost')}"],
        ["searches / cross-tenant results", f"{figures.get('searches')} / {figures.get('cross_tenant_results')}"],
        ["  cross-agent results (searches pinned to an agent)", figures.get("cross_agent_results")],
        ["time: produce / drain / total (s)", f"{figures.get('produce_s')} / {figures.get('settle_s')} / {figures.get('total_s')}"],
    ]
    console.print(table("fault injection", ["check", "value"], rows))
    for line in faults.log:
        err_console.print(line)


def run(quick: bool = False, sharded: bool = False) -> dict[str, Any]:
    """``memstream bench chaos [--quick] [--sharded]``."""
    return run_plan(ChaosPlan.quick() if quick else ChaosPlan.full(), sharded=sharded)
