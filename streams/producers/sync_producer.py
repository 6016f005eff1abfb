"""The blocking front door of the producer SDK: :class:`MemstreamProducer` on an event
loop in a background thread, for code without asyncio."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

from memstream.domain.events import DecisionRecorded, EventBase, MemoryAdded, MessageObserved, OutcomeObserved, Scope
from memstream.domain.log import LogPosition
from memstream.settings import StreamsConfig
from memstream.streams.producers.producer import MemstreamProducer, ProducerClosedError, Sent
from memstream.streams.topics import Topics

__all__ = ["SyncProducer"]

T = TypeVar("T")


class SyncProducer:
    """The same API as :class:`MemstreamProducer`, blocking, for code without asyncio.

    An event loop runs in one background (daemon) thread and owns the aiokafka client;
    every call is handed to it and the caller waits for the result. Thread-safe: many
    threads may share one ``SyncProducer``. Use as a context manager or call
    :meth:`close` (which flushes).
    """

    def __init__(
        self,
        streams: StreamsConfig | None = None,
        *,
        bootstrap_servers: str | None = None,
        topics: Topics | None = None,
        client_id: str = "memstream-sdk",
        compression_type: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self._make: Callable[[], MemstreamProducer] = functools.partial(
            MemstreamProducer,
            streams,
            bootstrap_servers=bootstrap_servers,
            topics=topics,
            client_id=client_id,
            compression_type=compression_type,
        )
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._producer: MemstreamProducer | None = None
        self._closed = False

    def start(self) -> None:
        """Start the loop thread and connect (called by the first use if not before)."""
        with self._lock:
            if self._producer is not None:
                return
            if self._closed:
                raise ProducerClosedError("this producer was closed; create a new one")
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="memstream-sync-producer", daemon=True
            )
            thread.start()

            async def _create() -> MemstreamProducer:
                producer = self._make()
                await producer.start()
                return producer

            try:
                self._producer = asyncio.run_coroutine_threadsafe(_create(), loop).result()
            except BaseException:
                loop.call_soon_threadsafe(loop.stop)
                thread.join()
                loop.close()
                raise
            self._loop, self._thread = loop, thread

    def _call(self, make: Callable[[MemstreamProducer], Coroutine[Any, Any, T]]) -> T:
        if self._producer is None:
            self.start()
        assert self._producer is not None and self._loop is not None
        if threading.current_thread() is self._thread:
            raise RuntimeError("SyncProducer cannot be called from its own loop thread")
        future = asyncio.run_coroutine_threadsafe(make(self._producer), self._loop)
        return future.result(self._timeout_s)

    @property
    def producer(self) -> MemstreamProducer:
        """The underlying async producer (lives on the background loop)."""
        if self._producer is None:
            self.start()
        assert self._producer is not None
        return self._producer

    def send(self, event: EventBase, *, topic: str | None = None) -> LogPosition:
        return self._call(lambda p: p.send(event, topic=topic))

    def send_many(self, events: Iterable[EventBase], *, topic: str | None = None) -> list[LogPosition]:
        items = list(events)
        return self._call(lambda p: p.send_many(items, topic=topic))

    def send_nowait(
        self, event: EventBase, *, topic: str | None = None
    ) -> concurrent.futures.Future[LogPosition]:
        """Enqueue ``event``; blocks only while too many sends are in flight."""
        result: concurrent.futures.Future[LogPosition] = concurrent.futures.Future()

        async def _enqueue(p: MemstreamProducer) -> None:
            inner = await p.send_nowait(event, topic=topic)

            def _relay(fut: asyncio.Future[LogPosition]) -> None:
                if fut.cancelled():
                    result.cancel()
                elif (exc := fut.exception()) is not None:
                    result.set_exception(exc)
                else:
                    result.set_result(fut.result())

            inner.add_done_callback(_relay)

        self._call(_enqueue)
        return result

    def flush(self) -> None:
        self._call(lambda p: p.flush())

    def add_memory(self, scope: Scope | Mapping[str, Any], content: str, **fields: Any) -> Sent[MemoryAdded]:
        return self._call(lambda p: p.add_memory(scope, content, **fields))

    def observe_message(
        self, scope: Scope | Mapping[str, Any], message_id: str, content: str, **fields: Any
    ) -> Sent[MessageObserved]:
        return self._call(lambda p: p.observe_message(scope, message_id, content, **fields))

    def record_decision(
        self,
        scope: Scope | Mapping[str, Any],
        decision_id: str,
        subject: str,
        rating: str,
        decision_text: str,
        deadline: datetime,
        **fields: Any,
    ) -> Sent[DecisionRecorded]:
        return self._call(
            lambda p: p.record_decision(scope, decision_id, subject, rating, decision_text, deadline, **fields)
        )

    def observe_outcome(
        self,
        scope: Scope | Mapping[str, Any],
        outcome_id: str,
        subject: str,
        raw_return: float,
        horizon_days: int,
        **fields: Any,
    ) -> Sent[OutcomeObserved]:
        return self._call(
            lambda p: p.observe_outcome(scope, outcome_id, subject, raw_return, horizon_days, **fields)
        )

    def close(self) -> None:
        """Flush every pending send, disconnect and stop the loop thread. Idempotent."""
        with self._lock:
            self._closed = True
            producer, loop, thread = self._producer, self._loop, self._thread
            self._producer = self._loop = self._thread = None
        if producer is None or loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(producer.stop(), loop).result(self._timeout_s)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    def __enter__(self) -> "SyncProducer":
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
