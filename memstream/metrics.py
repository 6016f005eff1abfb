"""Prometheus metrics: what came in, how far the projection got, what failed.

Two kinds of numbers, on purpose:

* **Process counters** (``prometheus_client`` objects on the default registry): events
  accepted through this process, LLM calls and failures, search latency. Every
  memstream process that does such work counts it itself. Under ``memstream up`` the
  processes share prometheus_client's multiprocess directory, so the API server's
  ``GET /metrics`` sums them all (the worker's LLM calls included); a process run on
  its own exports only its own counters.
* **Log state**, read from durable state at scrape time: the log end offset of every
  partition (Kafka), the stored position of the projection (LanceDB), their
  difference (consumer lag per partition) and the number of dead letters. These come
  from the source of truth, not from counters in another process, so the API server
  reports the worker's progress correctly even across restarts of either.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "EVENTS_IN",
    "SEARCH_SECONDS",
    "LLM_CALLS",
    "LLM_FAILURES",
    "EXTRACTION_REPAIRS",
    "EXTRACTION_FALLBACKS",
    "FORGED_RECORDS",
    "record_forged",
    "CONTENT_TYPE",
    "LogSnapshot",
    "LogStateCollector",
    "SearchCacheCollector",
    "record_event_in",
    "record_llm_call",
    "record_extraction_repairs",
    "record_extraction_fallback",
    "time_search",
    "multiprocess_mode",
    "render",
]

CONTENT_TYPE = CONTENT_TYPE_LATEST

EVENTS_IN = Counter(
    "memstream_events_in",
    "Events accepted by this process and acknowledged by Kafka.",
    ["type", "interface"],
)
SEARCH_SECONDS = Histogram(
    "memstream_search_seconds",
    "Latency of hybrid searches served by this process.",
    ["interface"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
LLM_CALLS = Counter(
    "memstream_llm_calls",
    "LLM calls made by this process (extraction, judgment, reflection).",
    ["purpose"],
)
LLM_FAILURES = Counter(
    "memstream_llm_failures",
    "LLM calls that failed (transport error, timeout, unusable output).",
    ["purpose", "reason"],
)
EXTRACTION_FALLBACKS = Counter(
    "memstream_extraction_fallbacks",
    "Extraction windows stored by the heuristic after the model failed them, per reason.",
    ["reason"],
)

FORGED_RECORDS = Counter(
    "memstream_forged_records",
    "Records refused because only the worker (or the operator's forget) may write them and "
    "they do not carry its signature: key records and tombstones on the key topic, "
    "SubjectForgotten and other system events. None of them had any effect.",
    ["log", "kind"],
)


def record_forged(log: str, kind: str) -> None:
    """Count one refused forged record (``log``: keys or events; ``kind``: key,
    tombstone, forget, system)."""
    FORGED_RECORDS.labels(log=log, kind=kind).inc()


EXTRACTION_REPAIRS = Counter(
    "memstream_extraction_repairs",
    "What extraction fixed or dropped in a model's memories: type_repair (a type not one "
    "of the seven), invented_id_dropped (a cited id not in the window), "
    "hallucination_suspect (a memory dropped for sharing no word with its sources).",
    ["kind"],
)


def record_extraction_repairs(*, type_repairs: int, invented_ids_dropped: int, hallucination_suspects: int) -> None:
    """Count one answer's weak-output repairs (see :mod:`memstream.domain.weak_output`)."""
    for kind, n in (
        ("type_repair", type_repairs),
        ("invented_id_dropped", invented_ids_dropped),
        ("hallucination_suspect", hallucination_suspects),
    ):
        if n:
            EXTRACTION_REPAIRS.labels(kind=kind).inc(n)


def record_event_in(event_type: str, interface: str) -> None:
    """Count one event acknowledged by Kafka (after the ack, never before)."""
    EVENTS_IN.labels(type=event_type, interface=interface).inc()


def record_llm_call(purpose: str, ok: bool, reason: str = "error") -> None:
    """Count one LLM call; a failure is counted as a call too."""
    LLM_CALLS.labels(purpose=purpose).inc()
    if not ok:
        LLM_FAILURES.labels(purpose=purpose, reason=reason).inc()


def record_extraction_fallback(reason: str) -> None:
    """Count one window stored by the heuristic fallback (``FallbackReason`` value)."""
    EXTRACTION_FALLBACKS.labels(reason=reason).inc()



@contextmanager
def time_search(interface: str) -> Iterator[None]:
    """Observe the block's duration in the search latency histogram."""
    start = time.perf_counter()
    try:
        yield
    finally:
        SEARCH_SECONDS.labels(interface=interface).observe(time.perf_counter() - start)


TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class LogSnapshot:
    """End offsets from Kafka and stored positions from the projection, read together."""

    end_offsets: Mapping[TopicPartition, int] = field(default_factory=dict)
    positions: Mapping[TopicPartition, int] = field(default_factory=dict)
    projected_topics: frozenset[str] = frozenset()
    dead_letter_topic: str | None = None
    error: str | None = None

    def lag(self) -> dict[TopicPartition, int]:
        """Records not yet projected, per partition of every projected topic."""
        out: dict[TopicPartition, int] = {}
        for (topic, partition), end in self.end_offsets.items():
            if topic in self.projected_topics:
                out[(topic, partition)] = max(0, end - self.positions.get((topic, partition), 0))
        return out

    def dead_letters(self) -> int | None:
        if self.dead_letter_topic is None:
            return None
        ends = [v for (t, _), v in self.end_offsets.items() if t == self.dead_letter_topic]
        return sum(ends) if ends else None


class LogStateCollector(Collector):
    """Exposes the latest :class:`LogSnapshot` as gauges. The snapshot is refreshed by
    the ``/metrics`` handler (asynchronously, before rendering), because collectors are
    called synchronously and must not do network I/O."""

    def __init__(self) -> None:
        self.snapshot = LogSnapshot()

    def update(self, snapshot: LogSnapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        end = GaugeMetricFamily(
            "memstream_log_end_offset", "Log end offset per partition (Kafka).", labels=["topic", "partition"]
        )
        for (topic, partition), value in sorted(s.end_offsets.items()):
            end.add_metric([topic, str(partition)], value)
        yield end
        projected = GaugeMetricFamily(
            "memstream_events_projected",
            "Records the projection has applied per partition (its stored next offset).",
            labels=["topic", "partition"],
        )
        for (topic, partition), value in sorted(s.positions.items()):
            projected.add_metric([topic, str(partition)], value)
        yield projected
        lag = GaugeMetricFamily(
            "memstream_consumer_lag",
            "Records not yet projected per partition (end offset minus stored position).",
            labels=["topic", "partition"],
        )
        for (topic, partition), value in sorted(s.lag().items()):
            lag.add_metric([topic, str(partition)], value)
        yield lag
        dead = s.dead_letters()
        if dead is not None:
            yield GaugeMetricFamily(
                "memstream_dead_letters", "Records in the dead-letter topic.", value=dead
            )
        yield GaugeMetricFamily(
            "memstream_log_state_up",
            "1 when the last read of end offsets and positions succeeded.",
            value=0 if s.error else 1,
        )


_SEARCH_CACHE_GAUGES = (
    ("spaces", "memstream_search_cache_spaces", "Memory spaces with rows kept for conversation-aware ranking."),
    ("rows", "memstream_search_cache_rows", "Memory rows and turns kept for conversation-aware ranking."),
    ("rows_max", "memstream_search_cache_rows_max", "Their bound."),
    ("change_steps", "memstream_search_change_steps", "Table commits whose changes are kept to carry the caches."),
    ("kept_spaces", "memstream_search_kept_spaces", "Memory spaces whose vectors and BM25 index are kept."),
    ("kept_memories", "memstream_search_kept_memories", "Memories whose vector and BM25 postings are kept."),
    ("kept_memories_max", "memstream_search_kept_memories_max", "Their bound."),
    ("kept_bytes", "memstream_search_kept_bytes", "Bytes of the kept vectors, postings and ids."),
)


class SearchCacheCollector(Collector):
    """What a serving process's search cache holds, read at scrape time from
    ``read`` (``SearchCache.stats``; ``None`` while the process starts or stops): what
    its memory grows with as the searched spaces grow, up to the bounds."""

    def __init__(self, read: Callable[[], Mapping[str, int] | None]) -> None:
        self.read = read

    def describe(self) -> Iterator[Metric]:
        """The gauges' names, without reading (what registering asks for)."""
        for _, name, doc in _SEARCH_CACHE_GAUGES:
            yield GaugeMetricFamily(name, doc)

    def collect(self) -> Iterator[Metric]:
        stats = self.read()
        if stats is None:
            return
        for key, name, doc in _SEARCH_CACHE_GAUGES:
            yield GaugeMetricFamily(name, doc, value=stats[key])


def multiprocess_mode() -> bool:
    """True when prometheus_client keeps values in shared files (its
    ``PROMETHEUS_MULTIPROC_DIR`` was set before it was imported, as ``memstream up``
    does for the worker and the API), so one process can export every process's
    counters: the API's ``/metrics`` then includes the worker's LLM calls."""
    return values.ValueClass is not values.MutexValue


def render(*registries: CollectorRegistry) -> bytes:
    """The text exposition of this process's counters (or, in multiprocess mode, of
    every process sharing the directory) plus any extra registries."""
    if multiprocess_mode():
        base = CollectorRegistry()
        multiprocess.MultiProcessCollector(base)
    else:
        base = REGISTRY
    return b"".join(generate_latest(r) for r in (base, *registries))
