"""The broker's JVM process: finding ours, launching Java, formatting storage, ending it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from memstream.settings import BrokerSettings
from memstream.streams.broker.config import cluster_id
from memstream.streams.broker.logs import file_size, last_lines
from memstream.streams.broker.paths import BrokerError, BrokerPaths

__all__ = [
    "POLL_S",
    "children",
    "read_state",
    "alive",
    "our_pid",
    "find_java",
    "jvm_options",
    "launch",
    "format_storage",
    "terminate",
    "forget",
]

_MIN_JAVA = 17
POLL_S = 0.25
_TAIL_LINES = 40

# Popen handles of brokers launched by this process (a test session, `memstream up`).
# A terminated child stays a zombie, still "alive" to os.kill, until its parent reaps it:
# keeping the handle lets ``status`` and ``stop`` reap it and read its exit code.
children: dict[int, subprocess.Popen[bytes]] = {}


def _read_pid(paths: BrokerPaths) -> int | None:
    try:
        return int(paths.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def read_state(paths: BrokerPaths) -> dict[str, object]:
    try:
        data = json.loads(paths.state_file.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def alive(pid: int) -> bool:
    """True while ``pid`` runs and is not a zombie (reaping our own children first)."""
    child = children.get(pid)
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


def our_pid(paths: BrokerPaths) -> int | None:
    """The pid from the pid file if that process is alive and is our broker (the pid
    file may be stale and its number reused by an unrelated process)."""
    pid = _read_pid(paths)
    if pid is None or not alive(pid):
        return None
    cmdline = _cmdline(pid)
    if cmdline is not None and ("kafka.Kafka" not in cmdline or str(paths.config_file) not in cmdline):
        return None
    return pid


def find_java() -> str:
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


def jvm_options(broker: BrokerSettings, paths: BrokerPaths) -> list[str]:
    return [
        f"-Xmx{broker.heap}",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:+ExplicitGCInvokesConcurrent",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={paths.log4j_file}",
        f"-Dkafka.logs.dir={paths.logs_dir}",
    ]


def format_storage(java: str, libs: Path, broker: BrokerSettings, paths: BrokerPaths) -> None:
    command = [
        java,
        *jvm_options(broker, paths),
        "-cp",
        str(libs / "*"),
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        cluster_id(),
        "--config",
        str(paths.config_file),
        "--standalone",
    ]
    done = subprocess.run(
        command, cwd=paths.root, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if done.returncode != 0 or not paths.formatted:
        output = last_lines(done.stdout + done.stderr, _TAIL_LINES)
        raise BrokerError(
            f"formatting Kafka storage in {paths.data_dir} failed (exit code {done.returncode})\n{output}"
        )


def terminate(pid: int, timeout: float) -> None:
    """SIGTERM (Kafka shuts down cleanly on it), SIGKILL if it is still alive after
    ``timeout`` seconds, and wait until the process is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    child = children.pop(pid, None)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=1.0)


def forget(paths: BrokerPaths) -> None:
    paths.pid_file.unlink(missing_ok=True)
    paths.state_file.unlink(missing_ok=True)


def launch(java: str, libs: Path, broker: BrokerSettings, paths: BrokerPaths) -> tuple[int, dict[Path, int]]:
    """Start the broker's JVM in a session of its own and record its pid and settings;
    returns the pid and where its logs stood (failure reports show only this start's)."""
    command = [
        java,
        *jvm_options(broker, paths),
        "-cp",
        str(libs / "*"),
        "kafka.Kafka",
        str(paths.config_file),
    ]
    with open(paths.jvm_out, "ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n".encode())
        out.flush()
        # Failure reports show only what this start logged.
        offsets = {paths.server_log: file_size(paths.server_log), paths.jvm_out: out.tell()}
        process = subprocess.Popen(
            command,
            cwd=paths.root,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the CLI and the terminal that ran it
            close_fds=True,
        )
    children[process.pid] = process
    paths.pid_file.write_text(f"{process.pid}\n")
    paths.state_file.write_text(
        json.dumps(
            {
                "pid": process.pid,
                "version": broker.kafka_version,
                "port": broker.port,
                "controller_port": broker.controller_port,
                "acl": broker.acl,
                "jars": str(libs),
                "started_at": time.time(),
            },
            indent=1,
        )
    )
    return process.pid, offsets
