"""Where a local broker keeps its files, and what ``status`` reports about it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["BrokerError", "BrokerPaths", "BrokerState", "BrokerStatus"]

BrokerState = Literal["running", "starting", "stopped", "external"]


class BrokerError(RuntimeError):
    """The local broker could not be prepared, started or stopped. The message is meant
    for a person: it says what failed and, for a failed start, ends with the log's tail."""


@dataclass(frozen=True)
class BrokerPaths:
    """Where one local broker keeps its files (all absolute)."""

    root: Path

    @classmethod
    def at(cls, broker_dir: Path) -> "BrokerPaths":
        return cls(broker_dir.expanduser().resolve())

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def server_log(self) -> Path:
        return self.logs_dir / "server.log"

    @property
    def jvm_out(self) -> Path:
        return self.logs_dir / "broker.out"

    @property
    def config_file(self) -> Path:
        return self.root / "server.properties"

    @property
    def log4j_file(self) -> Path:
        return self.root / "log4j2.properties"

    @property
    def pid_file(self) -> Path:
        return self.root / "broker.pid"

    @property
    def state_file(self) -> Path:
        return self.root / "broker.json"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    @property
    def formatted(self) -> bool:
        return (self.data_dir / "meta.properties").is_file()


@dataclass(frozen=True)
class BrokerStatus:
    """What ``status`` found (and what ``start`` left running).

    ``state``: ``running`` (ours, answers metadata requests), ``starting`` (our process
    is alive but does not answer yet), ``stopped`` (nothing of ours runs, the port is
    free), ``external`` (something memstream did not start holds the port). For a
    running broker, version and ports are the ones it was started with.
    """

    state: BrokerState
    version: str
    port: int
    controller_port: int
    broker_dir: Path
    data_dir: Path
    log_file: Path
    pid: int | None = None
    cluster_id: str | None = None
    detail: str = ""
    started: bool = False
    """True only on the value returned by the ``start`` call that launched the process."""
    acl: bool = False
    """Runs in ACL mode (SASL listener, StandardAuthorizer; docs/security.md)."""

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"
