"""``memstream up`` from a fresh directory: first bank and key, worker and API running,
prefixed logs, a write read back through the worker, and a clean Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from memstream.settings import Settings, child_env
from memstream.streams.broker.local import bootstrap_reachable
from tests.support import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_up_runs_everything_and_stops_cleanly(kafka_bootstrap: str, tmp_path: Path) -> None:
    port = free_port()
    settings = Settings(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=f"t{uuid.uuid4().hex[:10]}.",
        partitions=3,
        home=tmp_path / "home",
        lance_dir=tmp_path / "lance",
        app_id=f"app-{uuid.uuid4().hex[:8]}",
        api_port=port,
        projector_batch_seconds=0.05,
    )
    env = child_env(settings)
    stdout, stderr = tmp_path / "up.out", tmp_path / "up.err"
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "memstream", "up"], env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL
        )
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, stderr.read_text()
                try:
                    if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, stderr.read_text()
                time.sleep(0.3)

            # A fresh setup gets a default bank and a key, printed once on stdout.
            key = stdout.read_text().strip().splitlines()[-1]
            assert key.startswith("msk_")
            assert key not in (settings.home / "keys.toml").read_text()
            headers = {"Authorization": f"Bearer {key}"}
            written = httpx.post(f"{base}/v1/memories", headers=headers, json={"content": "The user likes jazz"}, timeout=30)
            assert written.status_code == 202, written.text
            found = httpx.get(
                f"{base}/v1/search",
                headers=headers,
                params={"q": "jazz", "min_position": written.json()["position"]},
                timeout=60,
            )
            assert found.status_code == 200 and found.json()["results"][0]["content"] == "The user likes jazz"
            # The children share prometheus_client's multiprocess directory: the API
            # exports the counters of every memstream process.
            scraped = httpx.get(f"{base}/metrics", timeout=30).text
            assert 'memstream_events_in_total{interface="api",type="MemoryAdded"} 1.0' in scraped
            assert any((settings.home / "metrics").glob("*.db"))
        finally:
            proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
            code = proc.wait(90)
    log = stderr.read_text()
    assert code == 0, log
    assert "worker | " in log and "   api | " in log  # prefixed child logs
    assert "memstream is up" in log
    assert not bootstrap_reachable(f"127.0.0.1:{port}")  # the API is gone
    assert bootstrap_reachable(kafka_bootstrap)  # the broker keeps running
