"""Asking whether, and which, Kafka broker answers at an address."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from memstream.settings import BrokerSettings

__all__ = [
    "MetadataProbe",
    "bootstrap_reachable",
    "is_local_bootstrap",
    "unreachable_message",
    "port_open",
    "probe_metadata",
]


@dataclass(frozen=True)
class MetadataProbe:
    """A broker's answer to a Metadata request."""

    cluster_id: str | None
    controller_id: int
    brokers: tuple[tuple[int, str, int], ...]


_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def bootstrap_reachable(bootstrap: str, timeout: float = 1.0) -> bool:
    """True when any address of a ``host:port,...`` bootstrap list accepts a TCP
    connection: the cheap check made before deciding to start a broker."""
    for entry in bootstrap.split(","):
        host, _, port = entry.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout):
                return True
        except (OSError, ValueError):
            continue
    return False


def is_local_bootstrap(broker: BrokerSettings) -> bool:
    """Whether ``broker.bootstrap_servers`` names only this machine's local broker
    (loopback hosts, ``broker_port``), so that :func:`start` can provide it when
    nothing answers there."""
    entries = [e.strip() for e in broker.bootstrap_servers.split(",")]
    hosts = {e.rpartition(":")[0] for e in entries}
    ports = {e.rpartition(":")[2] for e in entries}
    return hosts <= _LOOPBACK and ports == {str(broker.port)}


def unreachable_message(broker: BrokerSettings) -> str:
    """Why nothing answers and the local broker cannot be started for it, naming the
    variables that move the local broker (a common trap: only the bootstrap address
    was set to another port)."""
    return (
        f"cannot reach Kafka at MEMSTREAM_BROKER_BOOTSTRAP_SERVERS={broker.bootstrap_servers}, and the local broker "
        f"would listen on MEMSTREAM_BROKER_PORT={broker.port} (controller MEMSTREAM_BROKER_CONTROLLER_PORT="
        f"{broker.controller_port}); to run the local broker on another port set MEMSTREAM_BROKER_PORT and a "
        "free MEMSTREAM_BROKER_CONTROLLER_PORT (MEMSTREAM_BROKER_BOOTSTRAP_SERVERS then follows), or start the broker "
        "MEMSTREAM_BROKER_BOOTSTRAP_SERVERS names"
    )


def port_open(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed by peer")
        chunks += chunk
    return bytes(chunks)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return int(value)

    def string(self) -> str | None:
        size = self.take(">h")
        if size < 0:
            return None
        text = self.data[self.pos : self.pos + size].decode("utf-8")
        self.pos += size
        return text


def _call(sock: socket.socket, api_key: int, version: int, correlation: int, payload: bytes) -> _Reader | None:
    """One request with a v1 header (non-flexible); the answer after its correlation id."""
    client_id = b"memstream-broker-probe"
    body = struct.pack(">hhih", api_key, version, correlation, len(client_id)) + client_id + payload
    sock.sendall(struct.pack(">i", len(body)) + body)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    if not 4 <= size <= 1_048_576:
        return None
    reader = _Reader(_recv_exact(sock, size))
    return reader if reader.take(">i") == correlation else None


def _plain_login(sock: socket.socket, username: str, password: str) -> bool:
    """SASL PLAIN: SaslHandshake v1, then SaslAuthenticate v0 with ``\0user\0password``."""
    mechanism = b"PLAIN"
    answer = _call(sock, 17, 1, 1, struct.pack(">h", len(mechanism)) + mechanism)
    if answer is None or answer.take(">h") != 0:
        return False
    token = b"\0" + username.encode() + b"\0" + password.encode()
    answer = _call(sock, 36, 0, 2, struct.pack(">i", len(token)) + token)
    return answer is not None and answer.take(">h") == 0


def probe_metadata(
    port: int, host: str = "127.0.0.1", timeout: float = 2.0, *, plain: tuple[str, str] | None = None
) -> MetadataProbe | None:
    """Ask the broker at ``host:port`` for cluster metadata (no topics) and return its
    answer, or ``None`` if nothing there answers like Kafka (or refuses the login).

    A hand-written Metadata v4 request keeps this synchronous, silent and dependency
    free: v4 is understood by every broker from 0.11 to 4.x and needs no flexible
    encoding. A broker answers only once it has finished starting up, so this is the
    readiness check. ``plain``: log in first with SASL PLAIN (the ACL mode's listener).
    """
    correlation = 0x6D656D
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            if plain is not None and not _plain_login(sock, *plain):
                return None
            # no topics; allow_auto_topic_creation=false
            reader = _call(sock, 3, 4, correlation, struct.pack(">ib", 0, 0))
            if reader is None:
                return None
            reader.take(">i")  # throttle_time_ms
            brokers = []
            for _ in range(reader.take(">i")):
                node_id = reader.take(">i")
                broker_host = reader.string() or ""
                broker_port = reader.take(">i")
                reader.string()  # rack
                brokers.append((node_id, broker_host, broker_port))
            cluster_id = reader.string()
            controller_id = reader.take(">i")
    except (OSError, ConnectionError, struct.error, UnicodeDecodeError):
        return None
    if not brokers:
        return None
    return MetadataProbe(cluster_id, controller_id, tuple(brokers))
