"""``memstream up`` from a fresh directory: first bank and key, worker and API running,
prefixed logs, "up" said only once the worker reads its partitions, the broker named by
its cluster id, a second ``up`` in the same home refused naming the first, a write read
back through the worker, and a clean Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from memstream.settings.model import Settings, child_env
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

            # "up" is said only once the worker reads its partitions (it wrote its mark)
            while "memstream is up" not in stderr.read_text():
                assert proc.poll() is None and time.monotonic() < deadline + 120, stderr.read_text()
                time.sleep(0.3)
            assert (settings.home / "worker.ready").exists()
            log = stderr.read_text()
            assert log.index("projector reading") < log.index("memstream is up"), log
            assert "cluster id " in log and "not started by memstream up here" in log

            # a second `up` in the same home refuses at once, naming the first
            second = subprocess.run([sys.executable, "-m", "memstream", "up"], env=env, capture_output=True, text=True, timeout=120)
            assert second.returncode == 1, second.stdout + second.stderr
            assert f"pid {proc.pid}" in second.stderr and f"API port {port}" in second.stderr, second.stderr

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


def _wait_for_line(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text(errors="replace"):
        assert proc.poll() is None, path.read_text(errors="replace")
        assert time.monotonic() < deadline, path.read_text(errors="replace")
        time.sleep(0.3)


def test_ctrl_c_stops_the_broker_that_up_started(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A broker of its own (fresh ports and home): ``up`` starts it, Ctrl-C stops it."""
    from memstream.streams.broker import local

    broker_port, controller_port, api_port = free_port(), free_port(), free_port()
    settings = Settings(
        broker_port=broker_port,
        controller_port=controller_port,
        bootstrap_servers=f"127.0.0.1:{broker_port}",
        home=tmp_path / "home",
        api_port=api_port,
        app_id=f"app-{uuid.uuid4().hex[:8]}",
    )
    err = tmp_path / "up.err"
    with open(err, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "memstream", "up"], env=child_env(settings),
            stdout=subprocess.DEVNULL, stderr=sink, stdin=subprocess.DEVNULL,
        )
        try:
            _wait_for_line(err, "memstream is up", proc)
            pid = local.status(settings.local_broker).pid
            assert pid is not None and bootstrap_reachable(settings.broker.bootstrap_servers)
        finally:
            proc.send_signal(signal.SIGINT)
            code = proc.wait(120)
    log = err.read_text()
    assert code == 0, log
    assert "Kafka: local broker stopped" in log
    assert not bootstrap_reachable(settings.broker.bootstrap_servers), log
    assert local.status(settings.local_broker).state == "stopped", log
    assert bootstrap_reachable(kafka_bootstrap)  # the session's broker was never touched


def test_only_the_bootstrap_address_elsewhere_names_the_variables(tmp_path: Path) -> None:
    elsewhere = free_port()
    env = {k: v for k, v in child_env(Settings(home=tmp_path / "home")).items()
           if k not in ("MEMSTREAM_BROKER_PORT", "MEMSTREAM_BROKER_CONTROLLER_PORT")}
    env["MEMSTREAM_BROKER_BOOTSTRAP_SERVERS"] = f"127.0.0.1:{elsewhere}"
    run = subprocess.run([sys.executable, "-m", "memstream", "up"], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    line = " ".join(run.stderr.split())
    for name in ("MEMSTREAM_BROKER_BOOTSTRAP_SERVERS", "MEMSTREAM_BROKER_PORT", "MEMSTREAM_BROKER_CONTROLLER_PORT"):
        assert name in line.replace("MEMSTREAM_ ", "MEMSTREAM_"), run.stderr
    assert str(elsewhere) in line
