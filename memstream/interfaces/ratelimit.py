"""Per-key rate limits: one token bucket per API key, shared by REST and MCP over HTTP.

A key holds at most ``burst`` tokens and gains ``rate`` per second; every request
takes one. An empty bucket answers 429 with ``Retry-After`` (whole seconds until a
token is back), so one key cannot starve the others of the server's CPU. Settings:
``MEMSTREAM_API_RATE_PER_S`` and ``MEMSTREAM_API_RATE_BURST`` (``0`` turns it off).
Buckets live in this process only and are dropped when idle long enough to be full.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

__all__ = ["RateLimiter"]

_MAX_KEYS = 100_000


# Kept by hand: `limits` counts whole-second windows on the wall clock, so a bucket of
# 2/s with a burst of 3 has no form there and test_bounds.py::test_token_bucket cannot drive it.
class RateLimiter:
    """Token buckets keyed by a key id; :meth:`take` answers the wait in seconds
    (``0.0``: allowed, a token was taken)."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = float(rate_per_s)
        self.burst = float(burst)
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)

    @property
    def enabled(self) -> bool:
        return self.rate > 0 and self.burst > 0

    def take(self, key: str) -> float:
        if not self.enabled:
            return 0.0
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                self._remember(key, tokens - 1.0, now)
                return 0.0
            self._remember(key, tokens, now)
            return (1.0 - tokens) / self.rate

    def _remember(self, key: str, tokens: float, now: float) -> None:
        if len(self._buckets) >= _MAX_KEYS and key not in self._buckets:
            full_after = self.burst / self.rate
            self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < full_after}
        self._buckets[key] = (tokens, now)

    @staticmethod
    def retry_after(wait_s: float) -> str:
        """The ``Retry-After`` header value: whole seconds, at least 1."""
        return str(max(1, math.ceil(wait_s)))
