"""Writes reflections in the background, a few at a time, retrying failures with backoff
(LLM calls never block the reflector's stream)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from memstream.streams.log_ids import log_id
from memstream.domain.events import MemoryReflected, Scope, utcnow
from memstream.services.reflection.writers import ReflectionWriter
from memstream.services.reflection.reflector import SettledDecision

__all__ = ["Backoff", "Deliver", "ReflectionRunner"]

log = logging.getLogger(__name__)


# Kept by hand: a failed decision waits on a timer, not in a retry loop that would hold a
# worker (tenacity and stamina retry in place; test_runner_retries_with_backoff_and_delivers_once).
@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: ``initial * factor**(attempt-1)``, capped."""

    initial: float = 1.0
    factor: float = 2.0
    maximum: float = 300.0
    jitter: float = 0.1

    def delay(self, attempt: int) -> float:
        base = min(self.maximum, self.initial * self.factor ** max(attempt - 1, 0))
        return base * (1.0 + random.uniform(-self.jitter, self.jitter))


Deliver = Callable[[MemoryReflected, SettledDecision], Awaitable[None]]


class ReflectionRunner:
    """Writes reflections in the background, a few at a time, retrying failures.

    ``submit`` is cheap and idempotent: a decision that is queued, being written,
    waiting for a retry, or delivered and not yet confirmed is not queued again. Each
    finished reflection goes to ``deliver`` (the agent sends it through the work
    topic); the agent calls :meth:`finished` once the decision left the settled state.
    A delivered decision that was never confirmed (its partition moved to another
    worker, say) becomes eligible again after ``redeliver_after`` seconds; the state
    machine drops the extra candidate if the first one made it after all.

    A writer or delivery failure is retried after :class:`Backoff` without holding a
    worker, so one failing decision never blocks the others.
    """

    def __init__(
        self,
        writer: ReflectionWriter,
        deliver: Deliver,
        *,
        concurrency: int = 4,
        backoff: Backoff | None = None,
        clock: Callable[[], datetime] = utcnow,
        redeliver_after: float = 600.0,
    ) -> None:
        self.writer = writer
        self.deliver = deliver
        self.concurrency = max(1, concurrency)
        self.backoff = backoff or Backoff()
        self.clock = clock
        self.redeliver_after = redeliver_after
        self.attempts: dict[str, int] = {}
        self.delivered = 0
        self.failures = 0
        # key -> monotonic time it was delivered (None while queued or being written)
        self._tracked: dict[str, float | None] = {}
        self._queue: asyncio.Queue[SettledDecision] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._timers: set[asyncio.TimerHandle] = set()

    @property
    def running(self) -> bool:
        return bool(self._workers)

    @property
    def in_flight(self) -> frozenset[str]:
        """Keys queued, being written, waiting for a retry or awaiting confirmation."""
        return frozenset(self._tracked)

    def start(self) -> None:
        """Start the workers on the running loop (no-op when running)."""
        if self._workers:
            return
        self._queue = asyncio.Queue()
        self._workers = [
            asyncio.create_task(self._work(), name=f"reflection-writer-{i}")
            for i in range(self.concurrency)
        ]

    async def stop(self) -> None:
        """Cancel the workers and pending retries; queued work is forgotten (the
        decisions stay settled in the table and are submitted again after a restart)."""
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
        workers, self._workers = self._workers, []
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        self._tracked.clear()
        self._queue = None

    def submit(self, settled: SettledDecision) -> bool:
        """Queue a reflection unless one for this decision is already under way."""
        if settled.key in self._tracked:
            delivered_at = self._tracked[settled.key]
            if delivered_at is None or time.monotonic() - delivered_at < self.redeliver_after:
                return False
        self.start()
        assert self._queue is not None
        self._tracked[settled.key] = None
        self._queue.put_nowait(settled)
        return True

    def finished(self, key: str) -> None:
        """The decision is reflected (or no longer ours): stop tracking it."""
        self._tracked.pop(key, None)
        self.attempts.pop(key, None)

    def forget_subject(self, scope: Scope) -> None:
        """Stop tracking every decision of the scope's space (its subject was
        forgotten: its keys can no longer be computed; they all begin ``team|user|``)."""
        prefix = f"{scope.team_id}|{scope.user_id}|"
        for key in [k for k in self._tracked if k.startswith(prefix)]:
            self.finished(key)

    def _requeue(self, settled: SettledDecision, box: list[asyncio.TimerHandle]) -> None:
        for handle in box:
            self._timers.discard(handle)
        if self._queue is not None and settled.key in self._tracked:
            self._queue.put_nowait(settled)

    async def _work(self) -> None:
        assert self._queue is not None
        queue = self._queue
        while True:
            settled = await queue.get()
            try:
                reflection = await self.writer.write(settled, self.clock())
                await self.deliver(reflection, settled)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure means "retry later"
                self.failures += 1
                attempt = self.attempts.get(settled.key, 0) + 1
                self.attempts[settled.key] = attempt
                delay = self.backoff.delay(attempt)
                log.warning(
                    "reflection of decision %s failed (attempt %d, retry in %.1fs): %s: %s",
                    log_id(settled.decision.decision_id),
                    attempt,
                    delay,
                    type(exc).__name__,
                    " ".join(str(exc).split())[:300],
                )
                box: list[asyncio.TimerHandle] = []
                handle = asyncio.get_running_loop().call_later(delay, self._requeue, settled, box)
                box.append(handle)
                self._timers.add(handle)
            else:
                self.delivered += 1
                if settled.key in self._tracked:
                    self._tracked[settled.key] = time.monotonic()
