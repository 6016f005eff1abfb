"""``memstream bench freshness``: how long until a produced memory can be found.

The real worker (a subprocess, product defaults: batches of 2,000 or 0.2 s,
maintenance every 10 s) runs on a fresh topic prefix and LanceDB directory. Once it
has its partitions (and a few warm-up events are visible), the SDK producer
(:class:`MemstreamProducer`, durable ``acks=all``, default linger) sends
``MemoryAdded`` events at a steady ``rate`` (default 1,000/s) for 60 s (``--quick``:
15 s) over 16 memory spaces. By default the events carry no embedding, as an agent
calling ``add_memory`` sends them, so the worker embeds them with the configured
(local) embedder; ``embedded=True`` carries 384-d vectors instead.

Visibility: a reader thread in this process (its own LanceDB connection, which sees
every commit) checks the ``memories`` table's version every ``poll_s`` (20 ms); when
a new version appeared, it queries the keys of the events sent and not yet seen. An
event counts as visible at the *start* of the poll that returns it (the commit
happened before that moment), so the poll period adds about 10 ms on average: the
figures are slightly pessimistic. Checking the version first keeps the reader's own
CPU small: on two shared cores a reader that scans the table 20 times a second would
slow down the worker it measures.

``p99_visible_ms`` is the 99th percentile, over every event, of the visible time
minus the producer's acknowledgement time; the target is <= 1,000 ms. Afterwards a
sample of events is looked up through the product's hybrid ``search`` (their own
content as the query) to confirm that "visible" means "searchable".
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from datetime import timedelta
from typing import Any

import lancedb

from memstream.bench._events import (
    TEAM,
    BenchWorkdir,
    WorkerProcess,
    bench_settings,
    create_topics,
    machine_info,
    make_corpus,
    memory_event,
    percentile,
    print_table,
    progress_bar,
    status,
)
from memstream.codec.wire import EncodedRecord, encode_event
from memstream.domain.events import Scope
from memstream.projections.embedders import LocalEmbedder, build_embedder
from memstream.projections.schema import scoped_key
from memstream.projections.search import SearchCache, search
from memstream.projections.store import LanceStore, in_list
from memstream.settings import Settings
from memstream.streams.producers.producer import MemstreamProducer

__all__ = ["run", "TARGET_P99_MS", "DEFAULT_SECONDS", "QUICK_SECONDS", "VisibilityPoller"]

TARGET_P99_MS = 1_000.0
DEFAULT_SECONDS = 60
QUICK_SECONDS = 15
_WARMUP_EVENTS = 20
_SEARCH_SAMPLE = 20


class VisibilityPoller(threading.Thread):
    """Records, per memory key, the time it first became visible in ``memories``."""

    def __init__(self, settings: Settings, poll_s: float) -> None:
        super().__init__(name="memstream-bench-visibility", daemon=True)
        self.settings = settings
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self.seen: dict[str, float] = {}
        self.polls = 0
        self.poll_time_s = 0.0
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def watch(self, keys: list[str]) -> None:
        with self._lock:
            self._pending.update(keys)

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=30)

    def run(self) -> None:
        try:
            db = lancedb.connect(str(self.settings.storage.root), read_consistency_interval=timedelta(0))
            table = None
            seen_version = -1
            while not self._stop_event.is_set():
                if table is None:
                    try:
                        table = db.open_table("memories")
                    except Exception:  # noqa: BLE001 - not created yet by the worker
                        time.sleep(self.poll_s)
                        continue
                started = time.perf_counter()
                version = table.version  # cheap: only a new commit can show new rows
                if version == seen_version:
                    self._stop_event.wait(self.poll_s)
                    continue
                with self._lock:
                    wanted = list(self._pending)
                found: list[str] = []
                for i in range(0, len(wanted), 1_000):
                    chunk = wanted[i : i + 1_000]
                    rows = table.search().where(in_list("pk", chunk)).select(["pk"]).limit(len(chunk)).to_arrow()
                    found.extend(rows.column("pk").to_pylist())
                if wanted:
                    self.polls += 1
                    self.poll_time_s += time.perf_counter() - started
                    seen_version = version  # unwatched keys may come in a later commit
                with self._lock:
                    for key in found:
                        if key in self._pending:
                            self._pending.discard(key)
                            self.seen[key] = started
                self._stop_event.wait(self.poll_s)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            self.error = exc


def _key(user: str, memory_id: str) -> str:
    return scoped_key(TEAM, user, memory_id)


async def _produce_paced(
    settings: Settings,
    records: list[EncodedRecord],
    keys: list[str],
    rate: int,
    poller: VisibilityPoller,
) -> tuple[list[float], list[float], float]:
    """Send ``records`` at ``rate`` per second; returns (send times, ack times, seconds)."""
    topic = f"{settings.broker.topic_prefix}events"
    n = len(records)
    sent_at = [0.0] * n
    acked_at = [0.0] * n
    async with MemstreamProducer(settings.streams, client_id="memstream-bench-freshness") as producer:
        futures = []
        with progress_bar() as bar:
            task = bar.add_task(f"producing at {rate}/s", total=n)
            started = time.perf_counter()
            i = 0
            while i < n:
                due = min(n, int((time.perf_counter() - started) * rate) + 1)
                if due > i:
                    poller.watch(keys[i:due])
                while i < due:
                    sent_at[i] = time.perf_counter()
                    fut = await producer.send_encoded(topic, records[i])

                    def _ack(f: asyncio.Future[Any], j: int = i) -> None:
                        acked_at[j] = time.perf_counter()

                    fut.add_done_callback(_ack)
                    futures.append(fut)
                    i += 1
                bar.update(task, completed=i)
                await asyncio.sleep(0.002)
            await producer.flush()
            for f in futures:
                await f  # a failed send fails the benchmark
            seconds = time.perf_counter() - started
    return sent_at, acked_at, seconds


def _wait_visible(poller: VisibilityPoller, worker: WorkerProcess, timeout_s: float) -> None:
    deadline = time.perf_counter() + timeout_s
    while poller.pending() and time.perf_counter() < deadline:
        if poller.error is not None:
            raise RuntimeError(f"visibility poller failed: {poller.error}")
        worker.check_alive()
        time.sleep(0.05)


def _by_window(keys: list[str], acked_at: list[float], seen: dict[str, float], rate: int) -> list[float | None]:
    """p99 latency of the events sent in each 10-second window (events are sent at a
    steady ``rate``, so index / rate is the send time), in order: shows
    whether slow moments are periodic (the worker's maintenance runs every 10 s) or a
    trend (the table growing). ``None`` for a window with an event never seen."""
    size = 10 * rate
    out: list[float | None] = []
    for start in range(0, len(keys), size):
        window = range(start, min(len(keys), start + size))
        lat = [(seen[keys[i]] - acked_at[i]) * 1000.0 for i in window if keys[i] in seen]
        out.append(percentile(lat, 99) if len(lat) == len(window) else None)
    return out


def _search_check(settings: Settings, corpus: Any, indices: list[int]) -> int:
    """How many of the sampled events the product's search finds by their content."""
    store = LanceStore.from_settings(settings.storage, settings.embeddings.dim)
    embedder = build_embedder(settings.embeddings)
    found = 0
    cache = SearchCache()
    for i in indices:
        scope = Scope(team_id=TEAM, user_id=corpus.users[i])
        results = search(store, embedder, scope, corpus.contents[i], k=5, cache=cache)
        found += any(r.memory_id == corpus.memory_ids[i] for r in results)
    return found


def run(
    quick: bool = False,
    rate: int = 1000,
    *,
    seconds: float | None = None,
    spaces: int = 16,
    embedded: bool = False,
    poll_s: float = 0.02,
    keep: bool = False,
) -> dict[str, Any]:
    """Run the worker, produce at ``rate`` for ``seconds``, measure, print, return."""
    duration = float(seconds or (QUICK_SECONDS if quick else DEFAULT_SECONDS))
    if rate < 1 or duration <= 0:
        raise ValueError("rate and seconds must be positive")
    n = int(rate * duration)
    machine = machine_info()
    with BenchWorkdir("freshness", keep=keep) as wd:
        settings = wd.track(bench_settings(wd.path))
        model_id = LocalEmbedder(settings.embeddings.dim).model_id if embedded else None
        status(f"preparing {n + _WARMUP_EVENTS:,} events")
        corpus = make_corpus(n + _WARMUP_EVENTS, spaces=spaces, dim=settings.embeddings.dim, seed=23)
        records = [encode_event(memory_event(corpus, i, model_id=model_id)) for i in range(len(corpus))]
        keys = [_key(corpus.users[i], corpus.memory_ids[i]) for i in range(len(corpus))]
        asyncio.run(create_topics(settings))
        worker = WorkerProcess(settings, wd.path / "worker")
        poller = VisibilityPoller(settings, poll_s)
        worker.start()
        try:
            worker.wait_ready()
            poller.start()
            status("warming up")
            asyncio.run(_produce_paced(settings, records[:_WARMUP_EVENTS], keys[:_WARMUP_EVENTS], rate, poller))
            _wait_visible(poller, worker, 120.0)
            if poller.pending():
                raise RuntimeError(f"warm-up events not visible after 120 s:\n{worker.tail()}")
            cpu_before = worker.cpu_seconds()
            wall_before = time.perf_counter()
            sent_at, acked_at, produce_s = asyncio.run(
                _produce_paced(settings, records[_WARMUP_EVENTS:], keys[_WARMUP_EVENTS:], rate, poller)
            )
            status("waiting for the last events to become visible")
            _wait_visible(poller, worker, 60.0)
            cpu_after = worker.cpu_seconds()
            wall_after = time.perf_counter()
        finally:
            poller.stop()
            worker.stop()
        if poller.error is not None:
            raise RuntimeError(f"visibility poller failed: {poller.error}")
        measured = keys[_WARMUP_EVENTS:]
        latencies = [(poller.seen[k] - a) * 1000.0 for k, a in zip(measured, acked_at) if k in poller.seen]
        from_send = [(poller.seen[k] - s) * 1000.0 for k, s in zip(measured, sent_at) if k in poller.seen]
        ack_ms = [(a - s) * 1000.0 for a, s in zip(acked_at, sent_at)]
        missing = len(measured) - len(latencies)
        windows = _by_window(measured, acked_at, poller.seen, rate)
        sample = random.Random(5).sample(range(_WARMUP_EVENTS, len(corpus)), min(_SEARCH_SAMPLE, n))
        found = _search_check(settings, corpus, sample)
    p99 = percentile(latencies, 99) if not missing else float("inf")
    cpu = None
    if cpu_before is not None and cpu_after is not None:
        cpu = (cpu_after - cpu_before) / (wall_after - wall_before)
    result: dict[str, Any] = {
        "benchmark": "freshness",
        "quick": quick,
        "rate": rate,
        "seconds": duration,
        "events": n,
        "spaces": spaces,
        "embedded_in_event": embedded,
        "achieved_rate": n / produce_s,
        "p50_visible_ms": percentile(latencies, 50),
        "p95_visible_ms": percentile(latencies, 95),
        "p99_visible_ms": p99 if missing == 0 else None,
        "max_visible_ms": max(latencies) if latencies else None,
        "p99_visible_from_send_ms": percentile(from_send, 99),
        "p99_ack_ms": percentile(ack_ms, 99),
        "missing": missing,
        "target_p99_ms": TARGET_P99_MS,
        "meets_target": missing == 0 and p99 <= TARGET_P99_MS,
        "p99_visible_ms_per_10s": windows,
        "poll_s": poll_s,
        "poll_queries": poller.polls,
        "poll_query_avg_ms": poller.poll_time_s / max(poller.polls, 1) * 1000.0,
        "search_check": f"{found}/{len(sample)}",
        "worker_cpu_per_wall": cpu,
        "machine": {**machine, "load_1m_end": machine_info()["load_1m"]},
    }
    p99_text = f"{p99:,.0f}" if missing == 0 else f"n/a ({missing} never visible)"
    print_table(
        f"memstream bench freshness: {rate}/s for {duration:.0f} s, {spaces} spaces, "
        f"{'embedding in the event' if embedded else 'embedded by the worker'}",
        [
            ("p99_visible_ms", p99_text, f"ack -> visible to a reader; target <= {TARGET_P99_MS:,.0f}"
             f" ({'met' if result['meets_target'] else 'NOT met'})"),
            ("p50_visible_ms", f"{result['p50_visible_ms']:,.0f}", ""),
            ("p95_visible_ms", f"{result['p95_visible_ms']:,.0f}", ""),
            ("max_visible_ms", "-" if result["max_visible_ms"] is None else f"{result['max_visible_ms']:,.0f}", ""),
            (
                "p99 per 10 s",
                " ".join("-" if w is None else f"{w:,.0f}" for w in windows),
                "by send time: periodic spikes or a trend",
            ),
            ("p99_visible_from_send_ms", f"{result['p99_visible_from_send_ms']:,.0f}", "from the send call instead of the ack"),
            ("p99_ack_ms", f"{result['p99_ack_ms']:,.1f}", "send -> broker ack (acks=all)"),
            ("achieved_rate", f"{result['achieved_rate']:,.0f}", f"{n:,} events"),
            ("search_check", result["search_check"], "sampled events found by hybrid search"),
            ("poll_query_avg_ms", f"{result['poll_query_avg_ms']:.1f}", f"{poller.polls} queries, on new versions only"),
            ("worker_cpu_per_wall", "-" if cpu is None else f"{cpu:.2f}", "1.0 = one core busy"),
            ("load_1m", f"{machine['load_1m']} -> {result['machine']['load_1m_end']}", f"{machine['cores']} cores, shared"),
        ],
    )
    return result
