"""The local broker's lifecycle (`memstream broker`): a second real broker started,
reused, stopped and restarted next to the session's broker, and the ports it will not take.

The lifecycle tests launch their own JVM on free ports with data under ``tmp_path``;
the jars come from the shared cache (fetched by Maven on first use), so these are real
starts, not simulations."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from memstream.settings.model import Settings, child_env
from memstream.streams.admin import ensure_topics
from memstream.streams.broker import local
from memstream.streams.topics import Topics
from tests.streams.broker.helpers import broker_settings


def test_bootstrap_servers_follow_the_broker_port_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMSTREAM_BROKER_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("MEMSTREAM_BROKER_PORT", "29300")
    assert Settings(_env_file=None).broker.bootstrap_servers == "127.0.0.1:29300"  # type: ignore[call-arg]
    assert Settings(_env_file=None, broker={"port": 29400}).broker.bootstrap_servers == "127.0.0.1:29400"  # type: ignore[call-arg]
    monkeypatch.setenv("MEMSTREAM_BROKER_BOOTSTRAP_SERVERS", "kafka:9092")
    assert Settings(_env_file=None).broker.bootstrap_servers == "kafka:9092"  # type: ignore[call-arg]


def test_a_port_held_by_another_program_is_reported_and_never_taken_over(
    tmp_path: Path, listening_socket: int
) -> None:
    settings = broker_settings(tmp_path, broker_port=listening_socket)

    current = local.status(settings.local_broker)
    assert current.state == "external"
    assert "does not answer as a Kafka broker" in current.detail

    with pytest.raises(local.BrokerError, match=f"port {listening_socket} is in use"):
        local.start(settings.local_broker)
    paths = local.BrokerPaths.at(settings.resolved_broker_dir)
    assert not paths.pid_file.exists()
    assert not paths.data_dir.exists()  # nothing was formatted or launched
    assert local.stop(settings.local_broker) is False


def test_status_of_a_never_started_broker_is_stopped(tmp_path: Path) -> None:
    settings = broker_settings(tmp_path)
    current = local.status(settings.local_broker)
    assert current.state == "stopped"
    assert current.pid is None
    assert current.port == settings.broker.port
    assert local.stop(settings.local_broker) is False


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**child_env(settings), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "memstream", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_cli_status_exits_3_when_stopped(tmp_path: Path) -> None:
    done = _cli(broker_settings(tmp_path), "broker", "status")
    assert done.returncode == 3, done.stderr
    assert "stopped" in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_second_broker_starts_once_serves_stops_and_keeps_its_data(tmp_path: Path) -> None:
    settings = broker_settings(tmp_path, topic_prefix="brokertest.", partitions=2)
    paths = local.BrokerPaths.at(settings.resolved_broker_dir)
    try:
        first = local.start(settings.local_broker)
        assert first.state == "running" and first.started
        assert first.pid is not None and paths.pid_file.read_text().strip() == str(first.pid)
        assert first.port == settings.broker.port
        meta = (paths.data_dir / "meta.properties").read_text()
        assert f"cluster.id={first.cluster_id}" in meta

        again = local.start(settings.local_broker)
        assert again.state == "running" and not again.started
        assert again.pid == first.pid
        current = local.status(settings.local_broker)
        assert (current.state, current.pid, current.cluster_id) == ("running", first.pid, first.cluster_id)

        # The CLI drives the same broker: start is a no-op, status says running.
        cli_start = _cli(settings, "broker", "start")
        assert cli_start.returncode == 0, cli_start.stderr
        assert "already running" in cli_start.stdout and str(first.pid) in cli_start.stdout
        cli_status = _cli(settings, "broker", "status")
        assert cli_status.returncode == 0 and "running" in cli_status.stdout

        created = _cli(settings, "topics", "create")
        assert created.returncode == 0, created.stderr
        assert "brokertest.events" in created.stdout and "created" in created.stdout
        repeated = _cli(settings, "topics", "create")
        assert repeated.returncode == 0 and "exists" in repeated.stdout and "created" not in repeated.stdout
        described = asyncio.run(_describe(settings.broker.bootstrap_servers, "brokertest.events"))
        assert described["error_code"] == 0 and len(described["partitions"]) == 2  # type: ignore[arg-type]

        cli_stop = _cli(settings, "broker", "stop")
        assert cli_stop.returncode == 0 and "stopped" in cli_stop.stdout
        stopped = local.status(settings.local_broker)
        assert stopped.state == "stopped" and stopped.pid is None
        assert not paths.pid_file.exists()
        assert local.stop(settings.local_broker) is False
        assert _cli(settings, "broker", "status").returncode == 3

        restarted = local.start(settings.local_broker)
        assert restarted.started and restarted.cluster_id == first.cluster_id
        topics = Topics.from_settings(settings.broker)
        after = asyncio.run(ensure_topics(settings.broker.bootstrap_servers, topics))
        assert set(after.values()) == {"exists"}  # the data survived the stop
    finally:
        local.stop(settings.local_broker)


async def _describe(bootstrap: str, topic: str) -> dict[str, object]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="memstream-test")
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
        return dict(described)
    finally:
        await admin.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_broker_that_cannot_start_fails_with_its_log_tail(tmp_path: Path, listening_socket: int) -> None:
    # The controller port is taken: Kafka formats its storage, launches, fails to bind and
    # exits. start() must notice the exit (not wait for the deadline) and say why.
    settings = broker_settings(tmp_path, controller_port=listening_socket, broker_start_timeout_s=120.0)

    with pytest.raises(local.BrokerError) as failure:
        local.start(settings.local_broker)

    message = str(failure.value)
    assert "exited during startup" in message
    assert f"127.0.0.1:{listening_socket}" in message
    assert "Address already in use" in message
    assert "server.log" in message
    assert "\tat " not in message  # stack frames are condensed away
    assert local.status(settings.local_broker).state == "stopped"
    assert not local.BrokerPaths.at(settings.resolved_broker_dir).pid_file.exists()
