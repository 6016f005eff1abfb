"""The one backend the HTTP API and the MCP server share.

Why a layer of its own: both interfaces must behave the same way — a write returns
only once Kafka acknowledged it (durable), a read may wait for a log position
(read-your-writes), searches are timed, every event accepted is counted — and the API
server hosts MCP sessions too, so one producer and one read-only store serve both.

Reads go to LanceDB through the projection's own functions; every blocking LanceDB
call runs in a worker thread so the event loop (and the Kafka producer on it) never
stalls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime, timedelta
from enum import Enum
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from pydantic import BaseModel, ConfigDict, ValidationError

from memstream import metrics
from memstream.domain.access import ReadScope
from memstream.domain.events import EventBase, Identifier, MemoryType, Name, Scope, describe_validation_error
from memstream.domain.extraction import content_memory_id
from memstream.domain.log import LogPosition
from memstream.domain.reflection import ReflectionContext
from memstream.projections.embedders import Embedder, build_embedder
from memstream.projections.reads import context_for
from memstream.projections.schema import POSITIONS
from memstream.projections.search import (
    READ_NOT_BEFORE,
    HttpReranker,
    MemoryOwners,
    SearchCache,
    SearchFilters,
    SearchResult,
    build_reranker,
    search,
)
from memstream.projections.store import CurrentStore, LanceStore, ShardedStore
from memstream.services.shards import open_store, store_for
from memstream.settings import Settings
from memstream.streams.clients import KafkaConsumer, create_consumer
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.topics import Topics
from memstream.streams.trust.worker_identity import memory_ids_key
from memstream.streams.lifecycle import StartStop

__all__ = [
    "MemoryService",
    "PositionNotReached",
    "PositionBeyondLog",
    "UnknownTopicError",
    "to_jsonable",
    "default_deadline",
    "search_filters",
    "check_request_values",
    "search_hit_payload",
    "memory_payload",
    "lessons_payload",
]

log = logging.getLogger("memstream.service")

_POLL_S = 0.05


class PositionNotReached(TimeoutError):
    """The projection did not reach a log position within the wait bound."""

    def __init__(self, requested: LogPosition, reached: int | None, waited_s: float) -> None:
        super().__init__(
            f"the projection has not reached {requested} yet "
            f"(at offset {reached if reached is not None else 'none'} after {waited_s:.1f}s)"
        )
        self.requested = requested
        self.reached = reached
        self.waited_s = waited_s


class PositionBeyondLog(PositionNotReached):
    """A position at or past the end of its partition: no write has it yet, so waiting
    cannot help (answered at once instead of polling for the whole wait)."""

    def __init__(self, requested: LogPosition, end_offset: int) -> None:
        TimeoutError.__init__(
            self, f"{requested} is past the end of its partition (next offset {end_offset}); no write has it"
        )
        self.requested = requested
        self.reached = None
        self.waited_s = 0.0
        self.end_offset = end_offset


class UnknownTopicError(ValueError):
    """A position names a topic outside this deployment's topic catalogue."""


class RerankUnavailable(ValueError):
    """A search asked for reranking and no reranker is configured."""


class MemoryService(StartStop):
    """Producer + read-only store + embedder, started and stopped together.

    Each call names its ``interface`` ("api", "mcp"), the label of the metrics it
    records.
    """

    def __init__(self, settings: Settings, *, client_id: str = "memstream-api") -> None:
        self.settings = settings
        self.topics = Topics.from_settings(settings.broker)
        self.client_id = client_id
        self.producer: MemstreamProducer | None = None
        self._store: CurrentStore[LanceStore] | None = None  # follows a replay's swap
        self.embedder: Embedder | None = None
        # what searches read, kept between them
        self.search_cache = SearchCache()
        self.owners = MemoryOwners(self.search_cache)  # the owner check's id -> agent, per space
        self.reranker: HttpReranker | None = build_reranker(settings.embeddings)
        self._offsets: KafkaConsumer | None = None
        self._offsets_lock = asyncio.Lock()
        self._partitions: dict[str, tuple[int, ...]] = {}  # per topic, from the last metadata read
        self._positions: tuple[LanceStore, int, dict[tuple[str, int], int]] | None = None
        self._positions_read: asyncio.Future[dict[tuple[str, int], int]] | None = None
        self._positions_reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstream-positions")
        self.id_key = memory_ids_key(settings.resolved_worker_key_file) or b""
        """Keys the ids of client memories written without one (:meth:`content_memory_id`)."""

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Connect the producer and open the store for reading (the worker is its only
        writer). ``read_consistency_interval=0``: every read checks for the worker's
        latest commit, so a position the projection stored is visible at once."""
        producer = MemstreamProducer(self.settings.streams, client_id=self.client_id)
        await producer.start()
        try:
            following = CurrentStore(
                self.settings.storage.root,
                lambda root: open_store(self.settings, root, read_consistency_interval=timedelta(0)),
            )
            await asyncio.to_thread(following.get)
            self._store = following
            self.embedder = await asyncio.to_thread(build_embedder, self.settings.embeddings)
        except BaseException:
            await producer.stop()
            raise
        self.producer = producer

    async def stop(self) -> None:
        producer, self.producer = self.producer, None
        offsets, self._offsets = self._offsets, None
        try:
            if producer is not None:
                await producer.stop()
        finally:
            if offsets is not None:
                await offsets.stop()
            self._positions_reader.shutdown(wait=False)
            if self.reranker is not None:
                self.reranker.close()
            close = getattr(self._store.opened if self._store is not None else None, "close", None)
            if callable(close):
                await asyncio.to_thread(close)


    @property
    def store(self) -> LanceStore | ShardedStore:
        """The current table set's store: after a replay's swap, the new set; each read
        takes it once and runs on that set whole."""
        if self._store is None:
            raise RuntimeError("the memory service is not started")
        return self._store.get()

    @property
    def has_store(self) -> bool:
        """Whether the service is started and its current table set opens."""
        return self._store is not None and self._store.get() is not None

    def _embedder(self) -> Embedder:
        if self.embedder is None:
            raise RuntimeError("the memory service is not started")
        return self.embedder

    def store_for(self, scope: Scope | ReadScope) -> Any:
        """The store holding ``scope``'s space: its shard in a sharded set (the space's
        murmur2 partition, as the producer picks it), else the set's store."""
        return store_for(self.store, scope)

    def _producer(self) -> MemstreamProducer:
        if self.producer is None:
            raise RuntimeError("the memory service is not started")
        return self.producer

    # --- writes ----------------------------------------------------------------------

    async def append(self, event: EventBase, *, interface: str) -> LogPosition:
        """Write one event; returns once Kafka acknowledged it."""
        position = await self._producer().send(event)
        metrics.record_event_in(event.type, interface)
        return position

    async def append_many(self, events: Sequence[EventBase], *, interface: str) -> list[LogPosition]:
        """Write events in order of the list; returns once all are acknowledged."""
        positions = await self._producer().send_many(events)
        for event in events:
            metrics.record_event_in(event.type, interface)
        return positions

    # --- read-your-writes --------------------------------------------------------------

    @property
    def applied_topics(self) -> frozenset[str]:
        """The topics the projector applies to the store (so a read can wait for them)."""
        return frozenset({self.topics.events, self.topics.messages})

    def check_topic(self, position: LogPosition) -> None:
        """Reject a position the store can never reach: another deployment's topic, or
        one the projector does not apply (a decision's position on the reflector's
        topic becomes readable as a lesson, with a new position of its own)."""
        if position.topic not in self.applied_topics:
            raise UnknownTopicError(
                f"positions on {position.topic!r} are not projected; wait for positions on "
                f"{' or '.join(sorted(self.applied_topics))}"
            )

    async def stored_positions(self) -> dict[tuple[str, int], int]:
        """The projection's stored positions. Every read waiting for a position polls,
        and under a stream of writes many wait at once: callers that arrive while a
        read is under way share it, the table is read again only when it has a new
        version, and on a thread of its own (not queued behind searches)."""
        read = self._positions_read
        if read is None or read.done():
            loop = asyncio.get_running_loop()
            read = self._positions_read = loop.run_in_executor(self._positions_reader, self._read_positions)
        return await asyncio.shield(read)

    def _read_positions(self) -> dict[tuple[str, int], int]:
        store = self.store  # one table set for the whole read (a replay may swap it)
        version = store.positions_version() if isinstance(store, ShardedStore) else int(store.table(POSITIONS).version)
        held = self._positions
        if held is None or held[0] is not store or held[1] != version:
            # read after the version: a commit in between is only read again later
            held = self._positions = (store, version, store.positions())
        return held[2]

    async def wait_for(self, positions: Iterable[LogPosition], timeout_s: float | None = None) -> None:
        """Return once the projection has applied every given position (its stored next
        offset is past each), or raise :class:`PositionNotReached` after ``timeout_s``
        (default ``read_wait_max_s``)."""
        wanted = list(positions)
        for p in wanted:
            self.check_topic(p)
        if not wanted:
            return
        bound = self.settings.api.read_wait_max_s if timeout_s is None else min(timeout_s, self.settings.api.read_wait_max_s)
        start = time.monotonic()
        checked_ends = False
        while True:
            stored = await self.stored_positions()
            missing = [p for p in wanted if stored.get((p.topic, p.partition), 0) <= p.offset]
            if not missing:
                # what this read answers from must have been read after this moment
                READ_NOT_BEFORE.set(time.monotonic())
                return
            if not checked_ends:  # once per read, only when it would have to wait
                checked_ends = True
                await self._check_written(missing)
            waited = time.monotonic() - start
            if waited >= bound:
                first = missing[0]
                raise PositionNotReached(first, stored.get((first.topic, first.partition)), waited)
            await asyncio.sleep(min(_POLL_S, max(0.0, bound - waited)))

    async def _check_written(self, positions: Sequence[LogPosition]) -> None:
        """Raise :class:`PositionBeyondLog` for a position no write has reached (its
        partition's end offset is not past it). Kafka unreachable: no answer, the
        bounded wait decides."""
        try:
            ends = await self.end_offsets({p.topic for p in positions})
            if any((p.topic, p.partition) not in ends for p in positions):  # a partition added since?
                ends = await self.end_offsets({p.topic for p in positions}, refresh=True)
        except (KafkaError, OSError) as exc:
            log.warning("cannot read end offsets to check min_position: %s", exc)
            return
        for p in positions:
            end = ends.get((p.topic, p.partition))
            if end is None or p.offset >= end:
                raise PositionBeyondLog(p, end or 0)

    # --- reads -------------------------------------------------------------------------

    async def search(
        self,
        scope: Scope | ReadScope,
        query: str,
        k: int,
        filters: SearchFilters | None,
        *,
        interface: str,
        rerank: bool = False,
    ) -> list[SearchResult]:
        """memstream's hybrid search; ``rerank``: the configured reranker orders the top
        results (:class:`RerankUnavailable` when none is configured)."""
        reranker = None
        if rerank:
            if self.reranker is None:
                raise RerankUnavailable("rerank=true needs a reranker: set MEMSTREAM_EMBEDDINGS_RERANK_URL to a /rerank endpoint")
            reranker = self.reranker

        def run() -> list[SearchResult]:
            with metrics.time_search(interface):
                return search(
                    self.store_for(scope), self._embedder(), scope, query, k, filters,
                    cache=self.search_cache, reranker=reranker,
                )

        return await asyncio.to_thread(run)

    async def get_memory(self, scope: Scope | ReadScope, memory_id: str) -> dict[str, Any] | None:
        """One memory the read scope sees, with its history, links and provenance;
        ``None`` when there is none (a scope pinned to an agent sees that agent's only)."""
        result: dict[str, Any] | None = await asyncio.to_thread(self.store_for(scope).get_memory, scope, memory_id)
        return result

    def content_memory_id(self, scope: Scope, content: str) -> str:
        """The id of a client memory written without one: the same content in the same
        scope (team, user and agent) is always the same id, the extractor's id for it
        (keyed, so no client can compute another agent's ids)."""
        return content_memory_id(scope, content, self.id_key)

    async def stored_memory(self, scope: Scope, memory_id: str) -> tuple[str, LogPosition] | None:
        """``(event_id, position)`` of the memory ``memory_id`` of exactly ``scope``'s
        agent when the view holds it (a duplicate write answers with them); None for
        any other agent's row, so the answer tells nothing about other agents."""
        rows = await asyncio.to_thread(self.store_for(scope).get_memories, scope, [memory_id])
        row = rows[0] if rows else None
        if row is None or row.get("agent_id") != scope.agent_id or row.get("log_topic") is None:
            return None
        return str(row["event_id"]), LogPosition(topic=row["log_topic"], partition=int(row["log_partition"]), offset=int(row["log_offset"]))

    async def memory_owner(self, scope: Scope, memory_id: str) -> str | None:
        """The agent that owns ``memory_id`` in the scope's space, if it is stored (as
        the table's latest version has it: the space's ids are kept and carried)."""
        return await asyncio.to_thread(self.owners.owner, self.store_for(scope), scope, memory_id)

    async def lessons(self, scope: Scope | ReadScope, subject: str, budget_tokens: int) -> ReflectionContext:
        """Past lessons on ``subject`` the read scope sees (a pinned scope: its agent's)."""
        return await asyncio.to_thread(
            functools.partial(context_for, self.store_for(scope), scope, subject, budget_tokens)
        )

    # --- health and metrics ----------------------------------------------------------------

    async def _offsets_client(self) -> KafkaConsumer:
        async with self._offsets_lock:
            if self._offsets is None:
                consumer = create_consumer(
                    self.settings.broker,
                    client_id=f"{self.client_id}-offsets",
                    enable_auto_commit=False,
                    group_id=None,
                )
                await consumer.start()
                self._offsets = consumer
            return self._offsets

    async def end_offsets(self, topics: Iterable[str], *, refresh: bool = False) -> dict[tuple[str, int], int]:
        """Kafka's log end offset of every partition of ``topics`` (unknown topics
        skipped). Partition lists are kept from the last metadata read: a full
        cluster's metadata is a large answer to decode on every waiting read."""
        consumer = await self._offsets_client()
        names = set(topics)
        if refresh or not names <= self._partitions.keys():
            # consumer.partitions_for_topic() only knows topics the consumer tracks,
            # and this one subscribes to nothing: ask for the cluster's metadata.
            cluster = await consumer._client.fetch_all_metadata()
            self._partitions = {t: tuple(sorted(cluster.partitions_for_topic(t) or ())) for t in cluster.topics()}
        parts = [TopicPartition(t, p) for t in sorted(names) for p in self._partitions.get(t, ())]
        if not parts:
            return {}
        ends = await consumer.end_offsets(parts)
        return {(tp.topic, tp.partition): int(off) for tp, off in ends.items()}

    def projected_topics(self, positions: dict[tuple[str, int], int]) -> frozenset[str]:
        """Topics the projection consumes: the memory log, and whatever it stores positions for."""
        return frozenset({self.topics.events} | {t for t, _ in positions})

    async def log_snapshot(self, timeout_s: float = 5.0) -> metrics.LogSnapshot:
        """End offsets and stored positions for the metrics page; never raises."""
        try:
            positions = await asyncio.wait_for(asyncio.to_thread(self.store.positions), timeout_s)
            projected = self.projected_topics(positions)
            ends = await asyncio.wait_for(
                self.end_offsets(projected | {self.topics.dead_letter}), timeout_s
            )
            return metrics.LogSnapshot(
                end_offsets=ends,
                positions=positions,
                projected_topics=projected,
                dead_letter_topic=self.topics.dead_letter,
            )
        except (KafkaError, OSError, asyncio.TimeoutError, RuntimeError) as exc:
            log.warning("cannot read log state for metrics: %s", exc)
            return metrics.LogSnapshot(error=f"{type(exc).__name__}: {exc}")

    async def kafka_reachable(self, timeout_s: float = 3.0) -> bool:
        try:
            consumer = await asyncio.wait_for(self._offsets_client(), timeout_s)
            await asyncio.wait_for(consumer.topics(), timeout_s)
            return True
        except (KafkaError, OSError, asyncio.TimeoutError):
            return False


# --- shared request/answer shaping (HTTP and MCP answer alike) -------------------------

_DROP_KEYS = frozenset({"vector", "embedding", "_distance", "_relevance_score", "_score"})


def to_jsonable(obj: Any) -> Any:
    """Plain JSON data from models, dataclasses, enums, datetimes, numpy values and
    Arrow scalars; vectors are dropped (large, and useless to a reader of the answer)."""
    if obj is None or isinstance(obj, (str, bool, int, float)):
        return obj
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, (datetime, date)):
        return obj.isoformat()
    if isinstance(obj, uuid.UUID):
        return str(obj)
    if isinstance(obj, BaseModel):
        return to_jsonable(obj.model_dump(mode="json"))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items() if str(k) not in _DROP_KEYS}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in obj]
    item = getattr(obj, "item", None)  # numpy scalars
    if callable(item):
        try:
            return to_jsonable(item())
        except (TypeError, ValueError):
            pass
    tolist = getattr(obj, "tolist", None)  # numpy arrays
    if callable(tolist):
        return to_jsonable(tolist())
    as_py = getattr(obj, "as_py", None)  # pyarrow scalars
    if callable(as_py):
        return to_jsonable(as_py())
    return str(obj)


def default_deadline(now: datetime, horizon_days: int) -> datetime:
    """When a decision with no explicit deadline expires. Horizons count trading days,
    which span about 7/5 as many calendar days; one more week lets a late outcome arrive
    before the decision is declared expired."""
    return now + timedelta(days=math.ceil(horizon_days * 7 / 5) + 7)


def memory_payload(found: Mapping[str, Any]) -> dict[str, Any]:
    """One memory as answered by ``GET /v1/memories/{id}`` and MCP ``get_memory``."""
    out = to_jsonable(found)
    assert isinstance(out, dict)
    return out


def lessons_payload(context: ReflectionContext) -> dict[str, Any]:
    """A reflection context (text plus the lessons it holds) as JSON."""
    to_dict = getattr(context, "to_dict", None)
    out = to_jsonable(to_dict() if callable(to_dict) else context)
    assert isinstance(out, dict)
    return out


def search_filters(
    *,
    memory_types: Sequence[str] = (),
    session_id: str | None = None,
    agent_id: str | None = None,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
    include_superseded: bool = True,
    entity: str | None = None,
) -> SearchFilters:
    """The projection's :class:`SearchFilters` from request parameters. Raises
    ``ValueError`` (one line) for a bad value: an unknown memory type, a session or
    agent that is not an id, an entity name no event could carry, a time without a UTC
    offset, a range that ends before it starts."""
    for name, value in (("time_from", time_from), ("time_to", time_to)):
        if value is not None and value.tzinfo is None:
            raise ValueError(f"{name} needs a UTC offset, e.g. 2025-01-31T09:30:00Z")
    ids = check_request_values(session_id=session_id, agent_id=agent_id, entity=entity or None)
    return SearchFilters(
        memory_types=tuple(MemoryType.parse(t) for t in memory_types),
        time_from=time_from,
        time_to=time_to,
        session_id=ids.session_id,
        agent_id=ids.agent_id,
        include_superseded=include_superseded,
        entity=ids.entity,
    )


class _RequestValues(BaseModel):
    """Request values checked with the event model's own types: a value no event can
    carry is refused at the boundary (it could never match, and some could not even be
    written into a LanceDB filter)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_id: Identifier | None = None
    agent_id: Identifier | None = None
    memory_id: Identifier | None = None
    subject: Identifier | None = None
    entity: Name | None = None


def check_request_values(**values: str | None) -> _RequestValues:
    """The ids and names a read request names (``session_id``, ``agent_id``,
    ``memory_id``, ``subject``, ``entity``), checked as events check them; raises
    ``ValueError`` with one line naming the field."""
    try:
        return _RequestValues.model_validate(values)
    except ValidationError as exc:
        raise ValueError(describe_validation_error(exc)) from None


def search_hit_payload(hit: SearchResult, *, explain: bool) -> dict[str, Any]:
    """One search result as JSON: the memory's fields and its score; the score parts
    only when ``explain`` is asked for."""
    out = to_jsonable(hit)
    assert isinstance(out, dict)
    if not explain:
        out.pop("parts", None)
    return out
