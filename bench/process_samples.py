"""What a benchmark samples of the processes it runs while they work: resident memory
every second, and the API's search-cache gauges (``GET /metrics``) every few seconds,
so that a slope of the API's memory can be set beside the growth of what its caches
hold (``bench mixed``'s ten-minute memory check)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["ProcessSampler", "CACHE_GAUGES", "rss_mb", "slope"]

CACHE_GAUGES = {
    "memstream_search_cache_rows": "cache_rows",
    "memstream_search_kept_memories": "kept_memories",
    "memstream_search_kept_bytes": "kept_mb",
}
"""The API's gauges sampled, by the series name they are kept under (bytes as MiB)."""
_METRICS_EVERY_S = 10.0


class ProcessSampler(threading.Thread):
    """``VmRSS`` of some processes every second (series named as ``pids``), and, given
    ``metrics_url``, :data:`CACHE_GAUGES` every :data:`_METRICS_EVERY_S` (series
    ``api_<name>``; a failed scrape is skipped)."""

    def __init__(self, pids: dict[str, int], metrics_url: str | None = None) -> None:
        super().__init__(name="memstream-bench-samples", daemon=True)
        self.pids = pids
        self.metrics_url = metrics_url
        names = [*pids, *(f"api_{n}" for n in CACHE_GAUGES.values())]
        self.samples: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        self._stop_event = threading.Event()

    def run(self) -> None:
        scraped = 0.0
        with httpx.Client(timeout=5.0) as client:
            while not self._stop_event.is_set():
                now = time.perf_counter()
                for name, pid in self.pids.items():
                    mb = rss_mb(pid)
                    if mb is not None:
                        self.samples[name].append((now, mb))
                if self.metrics_url and now - scraped >= _METRICS_EVERY_S:
                    scraped = now
                    self._scrape(client, now)
                self._stop_event.wait(1.0)

    def _scrape(self, client: httpx.Client, now: float) -> None:
        try:
            text = client.get(self.metrics_url or "").text
        except httpx.HTTPError:
            return
        for family in text_string_to_metric_families(text):
            name = CACHE_GAUGES.get(family.name)
            if name is not None and family.samples:
                value = family.samples[0].value
                self.samples[f"api_{name}"].append((now, value / 2**20 if name == "kept_mb" else value))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)

    def slope_per_min(self, name: str, since: float, until: float) -> float | None:
        """The series' least-squares slope per minute between two ``perf_counter`` times."""
        points = [(t, v) for t, v in self.samples[name] if since <= t <= until]
        return slope(points) * 60.0 if len(points) >= 3 else None

    def last(self, name: str) -> float | None:
        return self.samples[name][-1][1] if self.samples[name] else None


def rss_mb(pid: int) -> float | None:
    """``VmRSS`` of ``pid`` in MiB (Linux), or None."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return None


def slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of ``(time, value)`` points (0 without spread in time)."""
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return sum((t - mx) * (v - my) for t, v in points) / var if var > 0 else 0.0
