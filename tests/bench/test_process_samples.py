"""What ``bench mixed`` samples of its processes: resident memory, and the API's
search-cache gauges scraped over HTTP from a real Prometheus endpoint."""

from __future__ import annotations

import os
import socket
import time

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from memstream.bench.process_samples import ProcessSampler, rss_mb, slope
from memstream.metrics import SearchCacheCollector


def test_slope_is_the_least_squares_rate() -> None:
    assert slope([(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]) == pytest.approx(2.0)
    assert slope([(0.0, 4.0), (10.0, 4.0), (20.0, 4.0)]) == 0.0
    assert slope([(5.0, 1.0), (5.0, 9.0)]) == 0.0  # no spread in time


def test_rss_of_this_process_and_of_none() -> None:
    mine = rss_mb(os.getpid())
    assert mine is not None and mine > 1.0
    assert rss_mb(2**22 + 12345) is None


def test_the_sampler_reads_memory_and_the_search_cache_gauges() -> None:
    held = {"rows": 100, "kept_bytes": 3 * 2**20}
    stats = {
        "spaces": 2, "rows_max": 30_000, "change_steps": 7, "kept_spaces": 1, "kept_memories": 40,
        "kept_memories_max": 60_000,
    }
    registry = CollectorRegistry()
    registry.register(SearchCacheCollector(lambda: {**stats, **held}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    sampler = ProcessSampler({"me": os.getpid()}, f"http://127.0.0.1:{port}/metrics")
    try:
        sampler.start()
        deadline = time.monotonic() + 10
        while not sampler.samples["api_kept_mb"] and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sampler.stop()
        server.shutdown()
        thread.join()
    assert sampler.last("api_cache_rows") == 100
    assert sampler.last("api_kept_memories") == 40
    assert sampler.last("api_kept_mb") == pytest.approx(3.0)
    me = sampler.last("me")
    assert me is not None and me > 1.0


def test_a_collector_without_a_cache_yet_exports_nothing() -> None:
    registry = CollectorRegistry()
    registry.register(SearchCacheCollector(lambda: None))
    assert registry.get_sample_value("memstream_search_cache_rows") is None
