"""The local broker's lifecycle: ``start``, ``stop`` and ``status``.

A real Apache Kafka broker for development and CI, started by the project itself: Java
17 and Maven are enough. The first ``start`` asks Maven for Kafka's jars (:mod:`.jars`)
into a cache shared by every clone on the machine, so later starts only launch a JVM.
The broker is one KRaft node bound to 127.0.0.1 (:mod:`.config`).

Layout under ``LocalBrokerConfig.broker_dir`` (data survives ``stop``)::

    server.properties   regenerated from Settings on every start
    log4j2.properties   copied from the package on every start
    data/               log.dirs, formatted once (``StorageTool format --standalone``)
    logs/server.log     the broker's log (rolled by size)
    logs/broker.out     the JVM's stdout and stderr (crashes before logging starts)
    broker.pid          the running broker's process id
    broker.json         what that process was started with (version, ports, paths)
    acls.json           ACL mode: the ACL set last created (``acl.apply_acls``)
    admin-client.properties  ACL mode: the admin's client login for AclCommand (0600)

ACL mode (``broker_acl``, :mod:`.acl`): SASL listeners, the StandardAuthorizer and
per-home principals; ``server.properties`` then holds their passwords (always 0600).

These are plain synchronous functions, safe to call from the CLI, from pytest fixtures
and from several processes at once (a file lock per broker directory and per jar cache
serialises them). POSIX only: it relies on ``flock``, signals and sessions. The public
names of the sibling modules are re-exported here, the one import callers need.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from importlib import resources
from pathlib import Path

from memstream.settings import LocalBrokerConfig
from memstream.streams.broker import acl
from memstream.streams.broker.config import render_properties, server_properties
from memstream.streams.broker.jars import PACKAGE, ensure_jars, jar_cache_complete, jar_dir, locked
from memstream.streams.broker.logs import log_report
from memstream.streams.broker.paths import BrokerError, BrokerPaths, BrokerState, BrokerStatus
from memstream.streams.broker.probe import (
    MetadataProbe,
    bootstrap_reachable,
    is_local_bootstrap,
    port_open,
    probe_metadata,
    unreachable_message,
)
from memstream.streams.broker.process import (
    POLL_S,
    alive,
    children,
    find_java,
    forget,
    format_storage,
    jvm_options,
    launch,
    our_pid,
    read_state,
    terminate,
)

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

STOP_TIMEOUT_S = 30.0
"""How long `memstream broker stop` waits after SIGTERM before it sends SIGKILL."""

def _login(credentials_dir: Path, acl_mode: bool) -> tuple[str, str] | None:
    """The admin's PLAIN login for probing an ACL-mode broker (``None``: plain mode,
    or no credentials in this home)."""
    if not acl_mode:
        return None
    try:
        return acl.ADMIN, acl.read_password(credentials_dir, acl.ADMIN)
    except BrokerError:
        return None


def _status(config: LocalBrokerConfig, paths: BrokerPaths) -> BrokerStatus:
    state = read_state(paths)
    pid = our_pid(paths)
    acl_mode = bool(state.get("acl")) if pid is not None and state.get("pid") == pid else config.broker.acl
    base = BrokerStatus(
        "stopped",
        version=config.broker.kafka_version,
        port=config.broker.port,
        controller_port=config.broker.controller_port,
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
    probe = probe_metadata(base.port, plain=_login(config.credentials_dir, acl_mode)) if port_open(base.port) else None
    base = replace(base, acl=acl_mode and (pid is not None or probe is not None))
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
    if port_open(base.port):
        detail = f"port {base.port} is in use by a program that does not answer as a Kafka broker"
        return replace(base, state="external", detail=detail)
    return base


def status(config: LocalBrokerConfig) -> BrokerStatus:
    """Report the local broker of ``config`` without changing anything."""
    return _status(config, BrokerPaths.at(config.broker_dir))


def start(config: LocalBrokerConfig) -> BrokerStatus:
    """Start the local broker and return once it answers metadata requests.

    A no-op (``started=False``) when our broker already runs. Raises ``BrokerError``
    when the port is taken by something else, when the jars cannot be fetched, or when
    the broker does not answer within ``config.broker.start_timeout_s`` (the process
    is then killed and the message ends with the log's tail).
    """
    paths = BrokerPaths.at(config.broker_dir)
    paths.root.mkdir(parents=True, exist_ok=True)
    with locked(paths.lock_file):
        current = _status(config, paths)
        if current.state == "running":
            if current.acl != config.broker.acl:
                raise BrokerError(
                    f"the local broker runs {'with' if current.acl else 'without'} ACLs (SASL); stop it "
                    f"(`memstream broker stop`) to start it {'with' if config.broker.acl else 'without'} them"
                )
            return current
        if current.state == "external":
            raise BrokerError(
                f"cannot start the local broker: {current.detail}. Stop that program, or "
                "choose other ports with MEMSTREAM_BROKER_PORT and MEMSTREAM_BROKER_CONTROLLER_PORT"
            )
        if current.state == "starting" and current.pid is not None:
            # Our process from an earlier start is still coming up (or hung): give it
            # the same deadline as a fresh start.
            return _await_ready(config, paths, current.pid, started=False)

        forget(paths)
        libs = ensure_jars(config.kafka_cache_dir, config.broker.kafka_version)
        java = find_java()
        paths.logs_dir.mkdir(parents=True, exist_ok=True)
        paths.data_dir.mkdir(parents=True, exist_ok=True)
        sasl = acl.sasl_properties(acl.ensure_credentials(config.credentials_dir)) if config.broker.acl else None
        # 0600: in ACL mode it holds the principals' passwords
        paths.config_file.touch(mode=0o600)
        paths.config_file.chmod(0o600)
        paths.config_file.write_text(
            render_properties(server_properties(config.broker, paths.data_dir, sasl)), encoding="ascii"
        )
        paths.log4j_file.write_bytes(
            resources.files(PACKAGE).joinpath("log4j2.properties").read_bytes()
        )
        if not paths.formatted:
            acl.forget_acls(paths)  # a fresh metadata log holds no ACLs yet
            format_storage(java, libs, config.broker, paths)

        pid, offsets = launch(java, libs, config.broker, paths)
        ready = _await_ready(config, paths, pid, started=True, offsets=offsets)
        if config.broker.acl:
            acl.apply_acls(java, libs, config, paths, jvm_options(config.broker, paths))
        return ready


def _await_ready(
    config: LocalBrokerConfig,
    paths: BrokerPaths,
    pid: int,
    *,
    started: bool,
    offsets: Mapping[Path, int] | None = None,
) -> BrokerStatus:
    """Wait until the broker ``pid`` answers a metadata request. If it exits or the
    deadline passes (then it is killed), raise with what it logged."""
    deadline = time.monotonic() + config.broker.start_timeout_s
    port = config.broker.port
    state = read_state(paths)
    if state.get("pid") == pid:
        port = int(str(state.get("port", port)))
    while True:
        if not alive(pid):
            child = children.pop(pid, None)
            code = child.returncode if child is not None else None
            forget(paths)
            how = f" with exit code {code}" if code is not None else ""
            raise BrokerError(
                f"the Kafka broker exited during startup{how} (port {port}, controller port "
                f"{config.broker.controller_port}, data {paths.data_dir})\n{log_report(paths, offsets)}"
            )
        if port_open(port):
            probe = probe_metadata(port, plain=_login(config.credentials_dir, bool(state.get("acl", config.broker.acl))))
            if probe is not None:
                current = _status(config, paths)
                if current.state == "running":
                    return replace(current, started=started)
        if time.monotonic() >= deadline:
            terminate(pid, timeout=5.0)
            forget(paths)
            raise BrokerError(
                f"the Kafka broker did not answer at 127.0.0.1:{port} within "
                f"{config.broker.start_timeout_s:.0f} s (MEMSTREAM_BROKER_START_TIMEOUT_S); "
                f"it was stopped\n{log_report(paths, offsets)}"
            )
        time.sleep(POLL_S)


def stop(config: LocalBrokerConfig) -> bool:
    """Stop our local broker: SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``.

    Returns True if a broker was stopped, False if none of ours was running (a stale
    pid file is removed). Data is kept; an external broker is never touched.
    """
    paths = BrokerPaths.at(config.broker_dir)
    if not paths.root.exists():
        return False
    with locked(paths.lock_file):
        pid = our_pid(paths)
        if pid is None:
            forget(paths)
            return False
        terminate(pid, timeout=STOP_TIMEOUT_S)
        if alive(pid):
            raise BrokerError(f"the Kafka broker (pid {pid}) survived SIGKILL; is the machine overloaded?")
        forget(paths)
        return True
