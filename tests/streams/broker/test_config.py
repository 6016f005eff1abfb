"""The broker's server.properties: one KRaft node on loopback, rendered for Java."""

from __future__ import annotations

from pathlib import Path

from memstream.streams.broker import config
from tests.streams.broker.helpers import broker_settings, parse_properties


def test_server_properties_describe_one_kraft_node_on_loopback(tmp_path: Path) -> None:
    settings = broker_settings(tmp_path, broker_port=29192, controller_port=29193)
    props = config.server_properties(settings.broker, tmp_path / "data")

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
    flipped = broker_settings(tmp_path, broker_auto_create_topics=True)
    assert config.server_properties(flipped.broker, tmp_path)["auto.create.topics.enable"] == "true"


def test_rendered_properties_round_trip_odd_paths(tmp_path: Path) -> None:
    odd = tmp_path / "dätä dir" / "back\\slash=x:y #not-a-comment"
    props = config.server_properties(broker_settings(tmp_path).broker, odd)
    text = config.render_properties(props)

    assert text.isascii()  # Kafka reads .properties as ISO-8859-1
    assert parse_properties(text) == props
