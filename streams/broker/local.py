"""A real Apache Kafka broker for development and CI, started by the project itself.

Why not Docker or a tarball: Java 17 and Maven are enough. The first ``start`` asks
Maven for ``org.apache.kafka:kafka_2.13`` and its runtime jars (the packaged ``pom.xml``)
into a cache shared by every clone on the machine, so later starts only launch a JVM.
The broker is one KRaft node (broker and controller in one process) bound to 127.0.0.1,
with replication factors of 1 and no initial rebalance delay, so consumer groups join in
milliseconds instead of seconds.

Layout under ``settings.resolved_broker_dir`` (data survives ``stop``)::

    server.properties   regenerated from Settings on every start
    log4j2.properties   copied from the package on every start
    data/               log.dirs, formatted once (``StorageTool format --standalone``)
    logs/server.log     the broker's log (rolled by size)
    logs/broker.out     the JVM's stdout and stderr (crashes before logging starts)
    broker.pid          the running broker's process id
    broker.json         what that process was started with (version, ports, paths)

``start``, ``stop`` and ``status`` are plain synchronous functions, safe to call from
the CLI, from pytest fixtures and from several processes at once (a file lock per broker
directory and per jar cache serialises them). POSIX only (Linux, macOS): it relies on
``flock``, signals and sessions.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Literal

from memstream.settings import Settings

__all__ = [
    "BrokerError",
    "BrokerPaths",
    "BrokerState",
    "BrokerStatus",
    "MetadataProbe",
    "bootstrap_reachable",
    "unreachable_message",
    "ensure_jars",
    "is_local_bootstrap",
    "jar_cache_complete",
    "jar_dir",
    "probe_metadata",
    "render_properties",
    "server_properties",
    "start",
    "status",
    "stop",
]

BrokerState = Literal["running", "starting", "stopped", "external"]

_PACKAGE = "memstream.streams.broker"
_MARKER = "complete.json"
_MIN_JAVA = 17
_POLL_S = 0.25
_TAIL_LINES = 40
_NODE_ID = 1

# Popen handles of brokers launched by this process (a test session, `memstream up`).
# A terminated child stays a zombie, still "alive" to os.kill, until its parent reaps it:
# keeping the handle lets ``status`` and ``stop`` reap it and read its exit code.
_children: dict[int, subprocess.Popen[bytes]] = {}


class BrokerError(RuntimeError):
    """The local broker could not be prepared, started or stopped. The message is meant
    for a person: it says what failed and, for a failed start, ends with the log's tail."""


@dataclass(frozen=True)
class BrokerPaths:
    """Where one local broker keeps its files (all absolute)."""

    root: Path

    @classmethod
    def from_settings(cls, settings: Settings) -> "BrokerPaths":
        return cls(settings.resolved_broker_dir.expanduser().resolve())

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

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass(frozen=True)
class MetadataProbe:
    """A broker's answer to a Metadata request."""

    cluster_id: str | None
    controller_id: int
    brokers: tuple[tuple[int, str, int], ...]


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------


def server_properties(settings: Settings, data_dir: Path) -> dict[str, str]:
    """The broker's configuration for one combined KRaft node on loopback.

    The controller quorum is given by ``controller.quorum.bootstrap.servers`` (dynamic
    quorum, KIP-853) and storage is formatted with ``--standalone``, so the node is its
    own single voter; changing ``controller_port`` later needs no re-format.
    """
    host = "127.0.0.1"
    port, cport = settings.broker_port, settings.controller_port
    return {
        "process.roles": "broker,controller",
        "node.id": str(_NODE_ID),
        "controller.quorum.bootstrap.servers": f"{host}:{cport}",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{cport}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": str(settings.partitions),
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "3",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "3",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true" if settings.broker_auto_create_topics else "false",
        "delete.topic.enable": "true",
    }


def _escape(value: str) -> str:
    """Escape a value for java.util.Properties, which Kafka reads as ISO-8859-1."""
    out = []
    for ch in value.replace("\\", "\\\\"):
        out.append(ch if 0x20 <= ord(ch) < 0x7F else f"\\u{ord(ch):04x}")
    return "".join(out)


def render_properties(props: Mapping[str, str]) -> str:
    """A ``.properties`` file: one ``key=value`` a line, comments only on their own line
    (Java's format has no inline comments)."""
    lines = ["# Generated by `memstream broker start` from memstream settings; edits are overwritten."]
    lines += [f"{key}={_escape(value)}" for key, value in props.items()]
    return "\n".join(lines) + "\n"


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (what
    ``StorageTool random-uuid`` prints), computed here to save a JVM start. Ids starting
    with '-' are avoided, as Kafka does, because command lines read them as options."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


# --------------------------------------------------------------------------------------
# Jars from Maven Central
# --------------------------------------------------------------------------------------


def _version_dir(settings: Settings) -> Path:
    cache = settings.resolved_kafka_cache_dir.expanduser().resolve()
    return cache / f"kafka-{settings.kafka_version}"


def jar_dir(settings: Settings) -> Path:
    """Where the jars of ``settings.kafka_version`` live once fetched."""
    return _version_dir(settings) / "libs"


def jar_cache_complete(libs: Path) -> bool:
    """True when ``libs`` holds every jar its completion marker lists. The marker is
    written only after Maven succeeded, so an interrupted download is never trusted."""
    marker = libs.parent / _MARKER
    try:
        listed = json.loads(marker.read_text())["jars"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(listed) and all((libs / name).is_file() for name in listed)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_jars(settings: Settings) -> Path:
    """Make sure the broker's jars are in the cache and return their directory.

    The first call runs ``mvn dependency:copy-dependencies`` on the packaged pom into a
    temporary directory and renames it into place, then writes the completion marker;
    later calls only check the marker. Maven Central is the only source.
    """
    libs = jar_dir(settings)
    if jar_cache_complete(libs):
        return libs
    version_dir = libs.parent
    with _locked(version_dir.parent / f"kafka-{settings.kafka_version}.lock"):
        if jar_cache_complete(libs):  # another process fetched them while we waited
            return libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise BrokerError(
                "Maven (mvn) is needed once to fetch Kafka's jars from Maven Central, "
                "but it is not on PATH; install Maven 3 and retry"
            )
        version_dir.mkdir(parents=True, exist_ok=True)
        pom = version_dir / "pom.xml"
        pom.write_bytes(resources.files(_PACKAGE).joinpath("pom.xml").read_bytes())
        staging = version_dir / f"libs.partial-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        command = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging}",
            f"-Dkafka.version={settings.kafka_version}",
        ]
        try:
            done = subprocess.run(
                command,
                cwd=version_dir,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=settings.kafka_fetch_timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise BrokerError(
                f"fetching Kafka {settings.kafka_version} with Maven took longer than "
                f"{settings.kafka_fetch_timeout_s:.0f} s (MEMSTREAM_KAFKA_FETCH_TIMEOUT_S)"
            ) from exc
        jars = sorted(p.name for p in staging.glob("*.jar")) if staging.is_dir() else []
        if done.returncode != 0 or not any(n.startswith("kafka_2.13-") for n in jars):
            shutil.rmtree(staging, ignore_errors=True)
            output = _last_lines((done.stdout or "") + (done.stderr or ""), 25)
            raise BrokerError(
                f"Maven could not fetch Kafka {settings.kafka_version} "
                f"(exit code {done.returncode}); is Maven Central reachable?\n{output}"
            )
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
        marker = {"version": settings.kafka_version, "jars": jars}
        tmp_marker = version_dir / f"{_MARKER}.tmp"
        tmp_marker.write_text(json.dumps(marker, indent=1))
        tmp_marker.replace(version_dir / _MARKER)
        return libs


# --------------------------------------------------------------------------------------
# Talking to a broker
# --------------------------------------------------------------------------------------


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


def is_local_bootstrap(settings: Settings) -> bool:
    """Whether ``settings.bootstrap_servers`` names only this machine's local broker
    (loopback hosts, ``broker_port``), so that :func:`start` can provide it when
    nothing answers there."""
    entries = [e.strip() for e in settings.bootstrap_servers.split(",")]
    hosts = {e.rpartition(":")[0] for e in entries}
    ports = {e.rpartition(":")[2] for e in entries}
    return hosts <= _LOOPBACK and ports == {str(settings.broker_port)}


def unreachable_message(settings: Settings) -> str:
    """Why nothing answers and the local broker cannot be started for it, naming the
    variables that move the local broker (a common trap: only the bootstrap address
    was set to another port)."""
    return (
        f"cannot reach Kafka at MEMSTREAM_BOOTSTRAP_SERVERS={settings.bootstrap_servers}, and the local broker "
        f"would listen on MEMSTREAM_BROKER_PORT={settings.broker_port} (controller MEMSTREAM_CONTROLLER_PORT="
        f"{settings.controller_port}); to run the local broker on another port set MEMSTREAM_BROKER_PORT and a "
        "free MEMSTREAM_CONTROLLER_PORT (MEMSTREAM_BOOTSTRAP_SERVERS then follows), or start the broker "
        "MEMSTREAM_BOOTSTRAP_SERVERS names"
    )


def _port_open(port: int, timeout: float = 0.5) -> bool:
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


def probe_metadata(port: int, host: str = "127.0.0.1", timeout: float = 2.0) -> MetadataProbe | None:
    """Ask the broker at ``host:port`` for cluster metadata (no topics) and return its
    answer, or ``None`` if nothing there answers like Kafka.

    A hand-written Metadata v4 request keeps this synchronous, silent and dependency
    free: v4 is understood by every broker from 0.11 to 4.x and needs no flexible
    encoding. A broker answers only once it has finished starting up, so this is the
    readiness check.
    """
    client_id = b"memstream-broker-probe"
    correlation = 0x6D656D
    body = struct.pack(">hhih", 3, 4, correlation, len(client_id)) + client_id
    body += struct.pack(">ib", 0, 0)  # no topics; allow_auto_topic_creation=false
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack(">i", len(body)) + body)
            (size,) = struct.unpack(">i", _recv_exact(sock, 4))
            if not 8 <= size <= 1_048_576:
                return None
            reader = _Reader(_recv_exact(sock, size))
            if reader.take(">i") != correlation:
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


# --------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------


def _read_pid(paths: BrokerPaths) -> int | None:
    try:
        return int(paths.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _read_state(paths: BrokerPaths) -> dict[str, object]:
    try:
        data = json.loads(paths.state_file.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _alive(pid: int) -> bool:
    """True while ``pid`` runs and is not a zombie (reaping our own children first)."""
    child = _children.get(pid)
    if child is not None and child.poll() is not None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        pass
    try:
        done = subprocess.run(
            ["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, check=False
        )
    except OSError:
        return None
    return done.stdout.strip() or None


def _our_pid(paths: BrokerPaths) -> int | None:
    """The pid from the pid file if that process is alive and is our broker (the pid
    file may be stale and its number reused by an unrelated process)."""
    pid = _read_pid(paths)
    if pid is None or not _alive(pid):
        return None
    cmdline = _cmdline(pid)
    if cmdline is not None and ("kafka.Kafka" not in cmdline or str(paths.config_file) not in cmdline):
        return None
    return pid


def _last_lines(text: str, count: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-count:])


_STACK_FRAME = re.compile(r"^\s+(at |\.\.\. \d+ (more|common frames omitted))")
_LOG_ENTRY = re.compile(r"^\[[^\]]+\] (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ")
_ERROR_LINES = 12
_LAST_LINES = 15


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _condensed_lines(path: Path, offset: int = 0) -> list[str]:
    """The log's lines written since ``offset`` (at most its last 256 KiB), with Java
    stack frames left out: the messages and "Caused by:" lines say what went wrong,
    the frames do not."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(offset, size - 256 * 1024) if offset <= size else 0)
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip() and not _STACK_FRAME.match(line)]


def _error_entries(lines: list[str]) -> list[str]:
    """ERROR and FATAL entries with their continuation lines (exception messages)."""
    picked: list[str] = []
    keep = False
    for line in lines:
        entry = _LOG_ENTRY.match(line)
        if entry:
            keep = entry.group(1) in ("ERROR", "FATAL")
        if keep:
            picked.append(line)
    return picked


def _log_report(paths: BrokerPaths, offsets: Mapping[Path, int] | None = None) -> str:
    """What a person needs to see when the broker did not come up: the errors it
    logged during this start, then the last lines of its log and of the JVM's output."""
    offsets = offsets or {}
    parts = []
    server = _condensed_lines(paths.server_log, offsets.get(paths.server_log, 0))
    errors = _error_entries(server)
    if errors:
        parts.append(f"--- errors in {paths.server_log} ---\n" + "\n".join(errors[-_ERROR_LINES:]))
    if server:
        parts.append(f"--- last lines of {paths.server_log} ---\n" + "\n".join(server[-_LAST_LINES:]))
    jvm = _condensed_lines(paths.jvm_out, offsets.get(paths.jvm_out, 0))
    if jvm:
        parts.append(f"--- last lines of {paths.jvm_out} ---\n" + "\n".join(jvm[-_LAST_LINES:]))
    return "\n".join(parts) if parts else f"(nothing was logged in {paths.logs_dir})"


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise BrokerError(f"Java {_MIN_JAVA}+ is needed to run Kafka, but `java` is not on PATH")
    done = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if match:
        major = int(match.group(1))
        if major == 1 and match.group(2):  # "1.8.0_392" style
            major = int(match.group(2))
        if major < _MIN_JAVA:
            raise BrokerError(f"Kafka 4 needs Java {_MIN_JAVA} or newer; {java} is Java {major}")
    return java


def _jvm_options(settings: Settings, paths: BrokerPaths) -> list[str]:
    return [
        f"-Xmx{settings.broker_heap}",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:+ExplicitGCInvokesConcurrent",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={paths.log4j_file}",
        f"-Dkafka.logs.dir={paths.logs_dir}",
    ]


def _format_storage(java: str, libs: Path, settings: Settings, paths: BrokerPaths) -> None:
    command = [
        java,
        *_jvm_options(settings, paths),
        "-cp",
        str(libs / "*"),
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        _cluster_id(),
        "--config",
        str(paths.config_file),
        "--standalone",
    ]
    done = subprocess.run(
        command, cwd=paths.root, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if done.returncode != 0 or not paths.formatted:
        output = _last_lines(done.stdout + done.stderr, _TAIL_LINES)
        raise BrokerError(
            f"formatting Kafka storage in {paths.data_dir} failed (exit code {done.returncode})\n{output}"
        )


def _terminate(pid: int, timeout: float) -> None:
    """SIGTERM (Kafka shuts down cleanly on it), SIGKILL if it is still alive after
    ``timeout`` seconds, and wait until the process is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    child = _children.pop(pid, None)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=1.0)


def _forget(paths: BrokerPaths) -> None:
    paths.pid_file.unlink(missing_ok=True)
    paths.state_file.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------


def _status(settings: Settings, paths: BrokerPaths) -> BrokerStatus:
    state = _read_state(paths)
    pid = _our_pid(paths)
    base = BrokerStatus(
        "stopped",
        version=settings.kafka_version,
        port=settings.broker_port,
        controller_port=settings.controller_port,
        broker_dir=paths.root,
        data_dir=paths.data_dir,
        log_file=paths.server_log,
    )
    if pid is not None and state.get("pid") == pid:
        base = replace(
            base,
            version=str(state.get("version", base.version)),
            port=int(str(state.get("port", base.port))),
            controller_port=int(str(state.get("controller_port", base.controller_port))),
        )
    probe = probe_metadata(base.port) if _port_open(base.port) else None
    if pid is not None:
        if probe is not None:
            return replace(base, state="running", pid=pid, cluster_id=probe.cluster_id)
        return replace(
            base, state="starting", pid=pid, detail="the process is alive but does not answer yet"
        )
    if probe is not None:
        detail = (
            f"a Kafka broker that memstream did not start (cluster {probe.cluster_id}) "
            f"answers at 127.0.0.1:{base.port}"
        )
        return replace(base, state="external", cluster_id=probe.cluster_id, detail=detail)
    if _port_open(base.port):
        detail = f"port {base.port} is in use by a program that does not answer as a Kafka broker"
        return replace(base, state="external", detail=detail)
    return base


def status(settings: Settings) -> BrokerStatus:
    """Report the local broker of ``settings`` without changing anything."""
    return _status(settings, BrokerPaths.from_settings(settings))


def start(settings: Settings) -> BrokerStatus:
    """Start the local broker and return once it answers metadata requests.

    A no-op (``started=False``) when our broker already runs. Raises ``BrokerError``
    when the port is taken by something else, when the jars cannot be fetched, or when
    the broker does not answer within ``settings.broker_start_timeout_s`` (the process
    is then killed and the message ends with the log's tail).
    """
    paths = BrokerPaths.from_settings(settings)
    paths.root.mkdir(parents=True, exist_ok=True)
    with _locked(paths.lock_file):
        current = _status(settings, paths)
        if current.state == "running":
            return current
        if current.state == "external":
            raise BrokerError(
                f"cannot start the local broker: {current.detail}. Stop that program, or "
                "choose other ports with MEMSTREAM_BROKER_PORT and MEMSTREAM_CONTROLLER_PORT"
            )
        if current.state == "starting" and current.pid is not None:
            # Our process from an earlier start is still coming up (or hung): give it
            # the same deadline as a fresh start.
            return _await_ready(settings, paths, current.pid, started=False)

        _forget(paths)
        libs = ensure_jars(settings)
        java = _java()
        paths.logs_dir.mkdir(parents=True, exist_ok=True)
        paths.data_dir.mkdir(parents=True, exist_ok=True)
        paths.config_file.write_text(
            render_properties(server_properties(settings, paths.data_dir)), encoding="ascii"
        )
        paths.log4j_file.write_bytes(
            resources.files(_PACKAGE).joinpath("log4j2.properties").read_bytes()
        )
        if not paths.formatted:
            _format_storage(java, libs, settings, paths)

        command = [
            java,
            *_jvm_options(settings, paths),
            "-cp",
            str(libs / "*"),
            "kafka.Kafka",
            str(paths.config_file),
        ]
        with open(paths.jvm_out, "ab") as out:
            out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n".encode())
            out.flush()
            # Failure reports show only what this start logged.
            offsets = {paths.server_log: _size(paths.server_log), paths.jvm_out: out.tell()}
            process = subprocess.Popen(
                command,
                cwd=paths.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # survives the CLI and the terminal that ran it
                close_fds=True,
            )
        _children[process.pid] = process
        paths.pid_file.write_text(f"{process.pid}\n")
        paths.state_file.write_text(
            json.dumps(
                {
                    "pid": process.pid,
                    "version": settings.kafka_version,
                    "port": settings.broker_port,
                    "controller_port": settings.controller_port,
                    "jars": str(libs),
                    "started_at": time.time(),
                },
                indent=1,
            )
        )
        return _await_ready(settings, paths, process.pid, started=True, offsets=offsets)


def _await_ready(
    settings: Settings,
    paths: BrokerPaths,
    pid: int,
    *,
    started: bool,
    offsets: Mapping[Path, int] | None = None,
) -> BrokerStatus:
    """Wait until the broker ``pid`` answers a metadata request. If it exits or the
    deadline passes (then it is killed), raise with what it logged."""
    deadline = time.monotonic() + settings.broker_start_timeout_s
    port = settings.broker_port
    state = _read_state(paths)
    if state.get("pid") == pid:
        port = int(str(state.get("port", port)))
    while True:
        if not _alive(pid):
            child = _children.pop(pid, None)
            code = child.returncode if child is not None else None
            _forget(paths)
            how = f" with exit code {code}" if code is not None else ""
            raise BrokerError(
                f"the Kafka broker exited during startup{how} (port {port}, controller port "
                f"{settings.controller_port}, data {paths.data_dir})\n{_log_report(paths, offsets)}"
            )
        if _port_open(port):
            probe = probe_metadata(port)
            if probe is not None:
                current = _status(settings, paths)
                if current.state == "running":
                    return replace(current, started=started)
        if time.monotonic() >= deadline:
            _terminate(pid, timeout=5.0)
            _forget(paths)
            raise BrokerError(
                f"the Kafka broker did not answer at 127.0.0.1:{port} within "
                f"{settings.broker_start_timeout_s:.0f} s (MEMSTREAM_BROKER_START_TIMEOUT_S); "
                f"it was stopped\n{_log_report(paths, offsets)}"
            )
        time.sleep(_POLL_S)


def stop(settings: Settings) -> bool:
    """Stop our local broker: SIGTERM, then SIGKILL after ``broker_stop_timeout_s``.

    Returns True if a broker was stopped, False if none of ours was running (a stale
    pid file is removed). Data is kept; an external broker is never touched.
    """
    paths = BrokerPaths.from_settings(settings)
    if not paths.root.exists():
        return False
    with _locked(paths.lock_file):
        pid = _our_pid(paths)
        if pid is None:
            _forget(paths)
            return False
        _terminate(pid, timeout=settings.broker_stop_timeout_s)
        if _alive(pid):
            raise BrokerError(f"the Kafka broker (pid {pid}) survived SIGKILL; is the machine overloaded?")
        _forget(paths)
        return True
