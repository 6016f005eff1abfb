"""Starting the worker's Kafka clients while the broker may be briefly unreachable.

Why: a worker restarted during a broker restart (a rolling upgrade, the chaos
benchmark) found no broker for a few seconds and crashed at start-up, so a supervisor
had to notice and start it again. A client that cannot *bootstrap* is retried here with
back-off until the broker answers or the worker stops; every other error still fails
the start at once (a wrong address stays visible in the log as a warning every time it
is retried).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from aiokafka.errors import KafkaConnectionError

__all__ = ["until_reachable", "until_started"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class _Client(Protocol):
    async def start(self) -> Any: ...

    async def stop(self) -> Any: ...


C = TypeVar("C", bound=_Client)

_FIRST_DELAY_S = 0.5
_MAX_DELAY_S = 5.0
_WARN_EVERY_S = 30.0


async def until_reachable(attempt: Callable[[], Awaitable[T]], what: str, *, max_delay_s: float = _MAX_DELAY_S) -> T:
    """``await attempt()`` until it does not fail with ``KafkaConnectionError``
    (back-off 0.5 s doubling to ``max_delay_s``). ``attempt`` must leave nothing open
    when it fails (stop the client it created). Cancellation stops the waiting."""
    delay = _FIRST_DELAY_S
    failures = 0
    warned_at = float("-inf")
    while True:
        try:
            result = await attempt()
        except KafkaConnectionError as exc:
            failures += 1
            now = time.monotonic()
            if now - warned_at >= _WARN_EVERY_S:
                warned_at = now
                log.warning("%s: Kafka unreachable (%s); retrying until it answers", what, exc)
            await asyncio.sleep(delay)
            delay = min(max_delay_s, delay * 2)
            continue
        if failures:
            log.info("%s: connected after %d failed attempt(s)", what, failures)
        return result


async def until_started(make: Callable[[], C], what: str, *, max_delay_s: float = _MAX_DELAY_S) -> C:
    """A started client from ``make()``, retried as :func:`until_reachable` does; a
    client whose start failed is stopped before the next one is made."""

    async def attempt() -> C:
        client = make()
        try:
            await client.start()
        except BaseException:
            await client.stop()
            raise
        return client

    return await until_reachable(attempt, what, max_delay_s=max_delay_s)
