"""The local broker (`memstream broker`): configuration, jar cache, and a second real
broker started, reused, stopped and restarted next to the session's broker.

The lifecycle tests launch their own JVM on free ports with data under ``tmp_path``;
the jars come from the shared cache (fetched by Maven on first use), so these are real
starts, not simulations.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from tests.support import free_port

from memstream.settings import Settings, child_env
from memstream.streams.admin import ensure_topics
from memstream.streams.broker import local
from memstream.streams.topics import Topics


def _settings(tmp_path: Path, **overrides: object) -> Settings:
    broker_port = int(overrides.pop("broker_port", free_port()))  # type: ignore[call-overload]
    values: dict[str, object] = {
        "home": tmp_path / "home",
        "broker_port": broker_port,
        "controller_port": free_port(),
        "bootstrap_servers": f"127.0.0.1:{broker_port}",
        "broker_heap": "256m",
        "broker_start_timeout_s": 90.0,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


def _parse_properties(text: str) -> dict[str, str]:
    """Read a .properties file the way java.util.Properties does for the subset the
    generator writes (key=value lines, whole-line comments, backslash and \\uXXXX
    escapes)."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {line!r}"
        value = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), value)
        props[key.strip()] = value.replace("\\\\", "\\")
    return props


@pytest.fixture
def listening_socket() -> Iterator[int]:
    """A port held by a plain TCP listener that never speaks Kafka."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


# --- configuration ------------------------------------------------------------------------


def test_server_properties_describe_one_kraft_node_on_loopback(tmp_path: Path) -> None:
    settings = _settings(tmp_path, broker_port=29192, controller_port=29193)
    props = local.server_properties(settings, tmp_path / "data")

    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:29192,CONTROLLER://127.0.0.1:29193"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:29192"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:29193"
    assert "controller.quorum.voters" not in props  # dynamic quorum, formatted --standalone
    assert props["log.dirs"] == str(tmp_path / "data")
    assert props["group.initial.rebalance.delay.ms"] == "0"
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
        "default.replication.factor",
    ):
        assert props[key] == "1", key
    assert props["auto.create.topics.enable"] == "false"
    flipped = _settings(tmp_path, broker_auto_create_topics=True)
    assert local.server_properties(flipped, tmp_path)["auto.create.topics.enable"] == "true"


def test_rendered_properties_round_trip_odd_paths(tmp_path: Path) -> None:
    odd = tmp_path / "dätä dir" / "back\\slash=x:y #not-a-comment"
    props = local.server_properties(_settings(tmp_path), odd)
    text = local.render_properties(props)

    assert text.isascii()  # Kafka reads .properties as ISO-8859-1
    assert _parse_properties(text) == props


def test_jar_cache_is_trusted_only_with_a_complete_marker(tmp_path: Path) -> None:
    libs = tmp_path / "kafka-9.9.9" / "libs"
    libs.mkdir(parents=True)
    for name in ("kafka_2.13-9.9.9.jar", "kafka-clients-9.9.9.jar"):
        (libs / name).write_bytes(b"jar")
    assert not local.jar_cache_complete(libs)  # no marker: an interrupted download

    marker = libs.parent / "complete.json"
    marker.write_text(json.dumps({"version": "9.9.9", "jars": sorted(p.name for p in libs.iterdir())}))
    assert local.jar_cache_complete(libs)

    (libs / "kafka-clients-9.9.9.jar").unlink()
    assert not local.jar_cache_complete(libs)
    marker.write_text("{not json")
    assert not local.jar_cache_complete(libs)


def test_jar_dir_lives_in_the_configured_cache(tmp_path: Path) -> None:
    settings = _settings(tmp_path, kafka_cache_dir=tmp_path / "cache", kafka_version="4.1.1")
    assert local.jar_dir(settings) == (tmp_path / "cache" / "kafka-4.1.1" / "libs").resolve()


def test_bootstrap_servers_follow_the_broker_port_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMSTREAM_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("MEMSTREAM_BROKER_PORT", "29300")
    assert Settings(_env_file=None).bootstrap_servers == "127.0.0.1:29300"  # type: ignore[call-arg]
    assert Settings(_env_file=None, broker_port=29400).bootstrap_servers == "127.0.0.1:29400"  # type: ignore[call-arg]
    monkeypatch.setenv("MEMSTREAM_BOOTSTRAP_SERVERS", "kafka:9092")
    assert Settings(_env_file=None).bootstrap_servers == "kafka:9092"  # type: ignore[call-arg]


# --- talking to whatever holds the port ------------------------------------------------


def test_probe_gets_nothing_from_a_closed_or_non_kafka_port(listening_socket: int) -> None:
    assert local.probe_metadata(free_port(), timeout=1.0) is None
    assert local.probe_metadata(listening_socket, timeout=0.5) is None


def test_a_port_held_by_another_program_is_reported_and_never_taken_over(
    tmp_path: Path, listening_socket: int
) -> None:
    settings = _settings(tmp_path, broker_port=listening_socket)

    current = local.status(settings)
    assert current.state == "external"
    assert "does not answer as a Kafka broker" in current.detail

    with pytest.raises(local.BrokerError, match=f"port {listening_socket} is in use"):
        local.start(settings)
    paths = local.BrokerPaths.from_settings(settings)
    assert not paths.pid_file.exists()
    assert not paths.data_dir.exists()  # nothing was formatted or launched
    assert local.stop(settings) is False


def test_status_of_a_never_started_broker_is_stopped(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    current = local.status(settings)
    assert current.state == "stopped"
    assert current.pid is None
    assert current.port == settings.broker_port
    assert local.stop(settings) is False


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
    done = _cli(_settings(tmp_path), "broker", "status")
    assert done.returncode == 3, done.stderr
    assert "stopped" in done.stdout


# --- a second real broker ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_second_broker_starts_once_serves_stops_and_keeps_its_data(tmp_path: Path) -> None:
    settings = _settings(tmp_path, topic_prefix="brokertest.", partitions=2)
    paths = local.BrokerPaths.from_settings(settings)
    try:
        first = local.start(settings)
        assert first.state == "running" and first.started
        assert first.pid is not None and paths.pid_file.read_text().strip() == str(first.pid)
        assert first.port == settings.broker_port
        meta = (paths.data_dir / "meta.properties").read_text()
        assert f"cluster.id={first.cluster_id}" in meta

        again = local.start(settings)
        assert again.state == "running" and not again.started
        assert again.pid == first.pid
        current = local.status(settings)
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
        described = asyncio.run(_describe(settings.bootstrap_servers, "brokertest.events"))
        assert described["error_code"] == 0 and len(described["partitions"]) == 2  # type: ignore[arg-type]

        cli_stop = _cli(settings, "broker", "stop")
        assert cli_stop.returncode == 0 and "stopped" in cli_stop.stdout
        stopped = local.status(settings)
        assert stopped.state == "stopped" and stopped.pid is None
        assert not paths.pid_file.exists()
        assert local.stop(settings) is False
        assert _cli(settings, "broker", "status").returncode == 3

        restarted = local.start(settings)
        assert restarted.started and restarted.cluster_id == first.cluster_id
        topics = Topics.from_settings(settings)
        after = asyncio.run(ensure_topics(settings.bootstrap_servers, topics))
        assert set(after.values()) == {"exists"}  # the data survived the stop
    finally:
        local.stop(settings)


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
    settings = _settings(tmp_path, controller_port=listening_socket, broker_start_timeout_s=120.0)

    with pytest.raises(local.BrokerError) as failure:
        local.start(settings)

    message = str(failure.value)
    assert "exited during startup" in message
    assert f"127.0.0.1:{listening_socket}" in message
    assert "Address already in use" in message
    assert "server.log" in message
    assert "\tat " not in message  # stack frames are condensed away
    assert local.status(settings).state == "stopped"
    assert not local.BrokerPaths.from_settings(settings).pid_file.exists()
