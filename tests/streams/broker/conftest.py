"""Fixtures of the local broker tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


@pytest.fixture
def listening_socket() -> Iterator[int]:
    """A port held by a plain TCP listener that never speaks Kafka."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])
