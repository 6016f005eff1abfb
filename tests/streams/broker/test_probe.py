"""Asking a port whether a Kafka broker answers there."""

from __future__ import annotations

from tests.support import free_port

from memstream.streams.broker import probe


def test_probe_gets_nothing_from_a_closed_or_non_kafka_port(listening_socket: int) -> None:
    assert probe.probe_metadata(free_port(), timeout=1.0) is None
    assert probe.probe_metadata(listening_socket, timeout=0.5) is None
