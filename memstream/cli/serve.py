"""CLI commands that serve memory: ``api``, ``mcp``, ``up``, ``keys`` and ``banks``.

``memstream up`` is the one command a new user runs: it makes sure a broker answers
(starting the local one when the configured address is this machine's and nothing
listens), creates the topics, writes a first bank and key on a fresh setup, then runs
the worker (projector, extractor, reflector) and the API server as child processes
with prefixed, readable logs. Ctrl-C stops the API first (no new writes), then the
worker (it finishes its batch and stores its position), then the broker if ``up``
started it (``--keep-broker`` leaves it running); a broker that was already running
is never touched.

Children get the supervisor's settings as ``MEMSTREAM_*`` environment variables
(:func:`memstream.settings.model.settings_env`), so every process agrees on broker, topics and directories.
They run in their own process sessions: the terminal's Ctrl-C reaches only the
supervisor, which stops them in order.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from memstream.banks import (
    RegistrySource,
    UnknownBankError,
    banks_path,
    create_key,
    keys_path,
    write_default_bank,
)
from memstream.cli._errors import CLIError
from memstream.cli.banks import registry_or_fail
from memstream.cli.console import prepare_console
from memstream.settings import Settings, child_env, get_settings, load_settings, parse_log_level, settings_env
from memstream.streams.broker import acl

__all__ = ["register", "settings_env", "child_env", "run_api", "run_mcp_stdio", "run_up", "Child", "Supervisor"]

console = Console(stderr=True, highlight=False, soft_wrap=True)


def _with(settings: Settings, **updates: Any) -> Settings:
    changes = {k: v for k, v in updates.items() if v is not None}
    return settings.model_copy(update=changes) if changes else settings


# --- api ---------------------------------------------------------------------------------


def _log_config(prefix: str | None = None) -> dict[str, Any]:
    fmt = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": fmt}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr", "formatter": "plain"}},
        "loggers": {
            "uvicorn": {"level": "INFO"},
            "uvicorn.error": {"level": "INFO"},
            "uvicorn.access": {"level": "INFO"},
            "aiokafka": {"level": "WARNING"},
            "mcp": {"level": "WARNING"},
            "httpx": {"level": "WARNING"},
        },
        "root": {"level": "INFO", "handlers": ["stderr"]},
    }


def run_api(settings: Settings) -> None:
    """Serve the HTTP API (and MCP at /mcp) until SIGINT/SIGTERM."""
    import uvicorn

    from memstream.interfaces.api import create_api

    registry_or_fail(settings)
    app = create_api(settings)
    uvicorn.run(
        app,
        host=settings.api.host,
        port=settings.api.port,
        log_config=_log_config(),
        access_log=settings.api.access_log,
        # the C request parser and libuv's event loop: the Python ones cost a write
        # more CPU than its own checks (docs/benchmarks-history.md)
        http="httptools",
        loop="uvloop",
        proxy_headers=False,
        server_header=False,
    )


# --- mcp -----------------------------------------------------------------------------------


def run_mcp_stdio(settings: Settings, bank_name: str) -> None:
    """Serve one bank's MCP server over stdio. stdout carries the protocol only; every
    log line goes to stderr."""
    from memstream.interfaces.mcp_server import build_mcp_server
    from memstream.projections.store import TableSets

    registry = registry_or_fail(settings)
    try:
        bank = registry.bank(bank_name)
    except UnknownBankError as exc:
        raise CLIError(f"{exc}; declare it in {banks_path(settings)}") from None
    if not TableSets(settings.storage.root).has_projection():
        # A reader must never create an empty set of its own (it would answer nothing).
        raise CLIError(
            f"no projection in {settings.storage.root} (MEMSTREAM_HOME={settings.home}): "
            "run `memstream up` there first, or set MEMSTREAM_HOME / MEMSTREAM_STORAGE_ROOT"
        )
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # The bank as banks.toml says at each tool call: a moved, removed or revoked bank
    # takes effect without restarting the host's server (fails closed, like HTTP).
    source = RegistrySource(settings)
    server = build_mcp_server(bank, settings, live=lambda: source.current().bank(bank_name))
    server.run("stdio")


def _print_mcp_config(settings: Settings, bank_name: str) -> None:
    """The host snippet on stdout (nothing else there, so it can be piped); where to
    paste it and what was left out on stderr."""
    from memstream.cli.mcp_config import secrets_left_out, snippet_json

    registry = registry_or_fail(settings)
    try:
        registry.bank(bank_name)
    except UnknownBankError as exc:
        raise CLIError(f"{exc}; declare it in {banks_path(settings)}") from None
    print(snippet_json(settings, bank_name))
    console.print(
        "Paste this into your MCP host's config (Claude Desktop: claude_desktop_config.json; "
        "Cursor: .cursor/mcp.json; VS Code: .vscode/mcp.json under \"servers\")."
    )
    left_out = secrets_left_out(settings)
    if left_out:
        console.print(f"Not printed: {', '.join(left_out)}; put them in {settings.config_file}.")


# --- up ------------------------------------------------------------------------------------


_COLORS = ("cyan", "magenta", "green", "yellow")


@dataclass
class Child:
    """One supervised process whose output is relayed line by line with a prefix."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    color: str = "cyan"
    stop_timeout_s: float = 30.0
    process: subprocess.Popen[bytes] | None = None
    _pump: threading.Thread | None = field(default=None, repr=False)

    def start(self, out: IO[str]) -> None:
        self.process = subprocess.Popen(
            list(self.argv),
            env=dict(self.env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._pump = threading.Thread(target=self._relay, args=(out,), name=f"relay-{self.name}", daemon=True)
        self._pump.start()

    def _relay(self, out: IO[str]) -> None:
        assert self.process is not None and self.process.stdout is not None
        sink = Console(file=out, highlight=False, soft_wrap=True)
        prefix = (f"{self.name:>6} | ", self.color)
        for raw in iter(self.process.stdout.readline, b""):
            # Text, not markup: a child's "[...]" must print as is.
            sink.print(Text.assemble(prefix, raw.decode("utf-8", errors="replace").rstrip("\r\n")))

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def poll(self) -> int | None:
        return self.process.poll() if self.process else None

    def stop(self) -> int | None:
        """SIGTERM, wait ``stop_timeout_s``, then SIGKILL. Returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            try:
                self.process.send_signal(signal.SIGTERM)
                self.process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                console.print(f"{self.name} did not stop in {self.stop_timeout_s:.0f}s; killing it")
                self.process.kill()
                self.process.wait()
        if self._pump is not None:
            self._pump.join(timeout=2.0)
        return self.process.returncode


class Supervisor:
    """Starts children in order, relays their logs, stops them in reverse order on
    SIGINT/SIGTERM or as soon as one of them exits on its own."""

    def __init__(self, children: Sequence[Child], out: IO[str] = sys.stderr) -> None:
        self.children = list(children)
        self.out = out
        self._stop = threading.Event()
        self.failed: Child | None = None

    def request_stop(self, *_: object) -> None:
        self._stop.set()

    def run(self, on_started: Any = None) -> int:
        previous = {s: signal.signal(s, self.request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for child in self.children:
                child.start(self.out)
            if on_started is not None:
                on_started(self)
            while not self._stop.wait(0.2):
                for child in self.children:
                    if child.poll() is not None:
                        self.failed = child
                        self._stop.set()
                        break
        finally:
            for child in reversed(self.children):
                if child.process is None:
                    continue
                console.print(f"stopping {child.name} (pid {child.pid})")
                code = child.stop()
                console.print(f"{child.name} stopped" + (f" (exit code {code})" if code not in (0, -signal.SIGTERM) else ""))
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.failed is not None:
            console.print(f"[red]{self.failed.name} exited with code {self.failed.poll()}; stopped the rest[/]")
            return 1
        return 0


def _wait_http(url: str, timeout_s: float, alive: Any) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        try:
            with urllib.request.urlopen(url, timeout=2.0) as resp:  # noqa: S310 - loopback URL we built
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    return False


def _ensure_broker(settings: Settings) -> bool:
    """A broker answering at ``bootstrap_servers``, started here when it is this
    machine's local one and nothing answers. True when this call started it (even if
    Ctrl-C came during its start: it is stopped again before the interrupt goes on)."""
    from memstream.streams.broker import local

    if local.bootstrap_reachable(settings.broker.bootstrap_servers):
        current = local.status(settings.local_broker) if local.is_local_bootstrap(settings.broker) else None
        if current is not None and current.running and current.acl != settings.broker.acl:
            raise CLIError(
                f"the local broker runs {'with' if current.acl else 'without'} ACLs; stop it "
                f"(`memstream broker stop`) or run `memstream up` {'with' if current.acl else 'without'} --acl"
            )
        from memstream.cli.up_guard import cluster_id

        mine = " (the local broker of this home)" if current is not None and current.running else ", not started by memstream up here"
        console.print(f"Kafka: using the broker at {settings.broker.bootstrap_servers}, cluster id {cluster_id(settings)}{mine}")
        return False
    if not local.is_local_bootstrap(settings.broker):
        raise CLIError(local.unreachable_message(settings.broker))
    from memstream.streams.broker.jars import jar_cache_complete, jar_dir

    first = "" if jar_cache_complete(jar_dir(settings.resolved_kafka_cache_dir, settings.broker.kafka_version)) else " (first start downloads it)"
    console.print(f"Kafka: starting the local broker on 127.0.0.1:{settings.broker.port}{first}")
    try:
        status = local.start(settings.local_broker)
    except local.BrokerError as exc:
        raise CLIError(str(exc)) from None
    except KeyboardInterrupt:
        local.stop(settings.local_broker)
        raise
    console.print(f"Kafka: broker ready (pid {status.pid}, data in {status.data_dir})")
    return status.started


def _ensure_topics(settings: Settings) -> None:
    from memstream.streams.admin import TopicCreationError, ensure_topics
    from memstream.streams.topics import Topics

    try:
        result = asyncio.run(ensure_topics(settings.broker, Topics.from_settings(settings.broker)))
    except TopicCreationError as exc:
        raise CLIError(str(exc)) from None
    created = [name for name, state in result.items() if state == "created"]
    console.print(f"Topics: {len(result)} ready" + (f" ({len(created)} created)" if created else ""))


def _ensure_bank(settings: Settings) -> None:
    path = banks_path(settings)
    if not path.exists():
        bank = write_default_bank(settings)
        raw, record = create_key(settings, bank.name, label="created by memstream up")
        console.print(f"Banks: created {escape(str(path))} with bank [bold]{escape(bank.name)}[/] (team {escape(repr(bank.team_id))})")
        console.print(
            f"API key for bank {bank.name!r} (shown once; only its hash is kept in {keys_path(settings)}):"
        )
        print(raw, flush=True)
        return
    registry = registry_or_fail(settings)
    names = ", ".join(sorted(registry.banks)) or "none"
    console.print(f"Banks: {escape(names)} ({len(registry.keys)} key(s)) from {escape(str(path))}")
    if not registry.keys:
        console.print("  no API keys yet: create one with `memstream keys create --bank NAME`")


def _fresh_metrics_dir(settings: Settings) -> Path:
    """prometheus_client's shared directory for the children's counters, emptied so a
    run starts from zero (files of dead processes would otherwise be summed forever)."""
    path = (settings.home / "metrics").resolve()
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink()
    return path


def _ensure_store(settings: Settings) -> None:
    """Create the LanceDB tables once, here, so the worker (writer) and the API (reader)
    never race to create them."""
    from memstream.projections.store import TableSets
    from memstream.services.shards import open_store

    open_store(settings, TableSets(settings.storage.root).current())  # sharded with MEMSTREAM_STORAGE_SHARDED
    console.print(f"Store: LanceDB tables ready in {settings.storage.root}")


def api_settings(settings: Settings) -> Settings:
    """The API's settings: in ACL mode it acts as the producer principal and writes only
    the ingress (the worker seals it into the log); otherwise as given."""
    if not settings.broker.acl:
        return settings
    return settings.model_copy(
        update={
            "broker.username": acl.PRODUCER,
            "broker.password": None,
            "broker.password_file": acl.password_file(settings.credentials_dir, acl.PRODUCER),
            "security.produce_via_ingress": True,
        }
    )


def run_up(settings: Settings, *, keep_broker: bool = False, loglevel: str = "info", share_broker: bool = False) -> int:
    """Broker, topics, banks, then worker + API until Ctrl-C. Returns the exit code.
    A broker started here is stopped on the way out (unless ``keep_broker``); one that
    was already running is left running. One ``up`` per home; topics another home
    serves are refused unless ``share_broker`` (:mod:`memstream.cli.up_guard`)."""
    from memstream.cli.up_guard import claim_topics, hold_home

    try:
        parse_log_level(loglevel)  # refused here, before anything starts
    except ValueError as exc:
        raise CLIError(f"--loglevel: {exc}") from None
    lock = hold_home(settings)
    started_broker = _ensure_broker(settings)
    try:
        console.print(claim_topics(settings, share=share_broker))
        return _serve(settings, loglevel, stops_broker=started_broker and not keep_broker)
    finally:
        lock.release()
        if started_broker and not keep_broker:
            from memstream.streams.broker import local

            if local.stop(settings.local_broker):
                console.print("Kafka: local broker stopped")


def _serve(settings: Settings, loglevel: str, *, stops_broker: bool) -> int:
    _ensure_topics(settings)
    _ensure_store(settings)
    _ensure_bank(settings)
    prepare_console(settings)
    shared = {"PYTHONUNBUFFERED": "1", "PROMETHEUS_MULTIPROC_DIR": str(_fresh_metrics_dir(settings))}
    env = {**child_env(settings), **shared}
    worker = Child(
        "worker",
        [sys.executable, "-m", "memstream.services.worker", "--loglevel", loglevel],
        env,
        color=_COLORS[0],
        stop_timeout_s=60.0,
    )
    api_env = {**child_env(api_settings(settings)), **shared}
    api = Child("api", [sys.executable, "-m", "memstream", "api"], api_env, color=_COLORS[1], stop_timeout_s=20.0)
    base = f"http://{'127.0.0.1' if settings.api.host in ('0.0.0.0', '::') else settings.api.host}:{settings.api.port}"

    from memstream.services.projector import ready_file

    ready = ready_file(settings)
    ready.unlink(missing_ok=True)  # the worker writes it again once it reads its partitions

    def announce(sup: Supervisor) -> None:
        alive = lambda: api.poll() is None and worker.poll() is None and not sup._stop.is_set()  # noqa: E731
        if not _wait_http(f"{base}/healthz", 120.0, alive):
            return
        deadline = time.monotonic() + 120.0
        while not ready.exists() and alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not ready.exists():
            if alive():
                console.print("[yellow]the API answers, but the worker has not taken its partitions after 120 s[/]")
            return
        if alive():
            console.print(
                f"[bold green]memstream is up[/]: API {base} (docs {base}/docs), MCP {base}/mcp, "
                + (f"console {base}/console, " if settings.api.console else "")
                + f"metrics {base}/metrics. Ctrl-C stops the API and the worker"
                + (" and the broker it started." if stops_broker else "; the broker keeps running.")
            )

    return Supervisor([worker, api]).run(
        on_started=lambda sup: threading.Thread(target=announce, args=(sup,), daemon=True).start()
    )


# --- commands -----------------------------------------------------------------------------------


def api_cmd(
    host: Annotated[str | None, typer.Option(help="Bind address (MEMSTREAM_API_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (MEMSTREAM_API_PORT).")] = None,
) -> None:
    """Serve the HTTP API, with MCP over streamable HTTP at /mcp."""
    run_api(_with(get_settings(), **{"api.host": host, "api.port": port}))


def mcp_cmd(
    bank: Annotated[str, typer.Option("--bank", help="The memory bank to serve (from the banks file).")],
    bootstrap_servers: Annotated[
        str | None, typer.Option("--bootstrap-servers", help="Kafka brokers (MEMSTREAM_BROKER_BOOTSTRAP_SERVERS).")
    ] = None,
    print_config: Annotated[
        bool, typer.Option("--print-config", help="Print the JSON snippet for an MCP host's config and exit.")
    ] = False,
) -> None:
    """Serve one memory bank as an MCP server over stdio (for MCP clients' config)."""
    settings = _with(get_settings(), **{"broker.bootstrap_servers": bootstrap_servers})
    if print_config:
        _print_mcp_config(settings, bank)
        return
    run_mcp_stdio(settings, bank)


def up_cmd(
    keep_broker: Annotated[
        bool, typer.Option("--keep-broker", help="Leave a broker that up started running on exit.")
    ] = False,
    host: Annotated[str | None, typer.Option(help="API bind address.")] = None,
    port: Annotated[int | None, typer.Option(help="API port.")] = None,
    loglevel: Annotated[str, typer.Option(help="Worker log level.")] = "info",
    acl_mode: Annotated[
        bool,
        typer.Option(
            "--acl",
            help="Kafka enforces who writes what (MEMSTREAM_BROKER_ACL=true): the local broker runs SASL + "
            "ACLs, the worker acts as the worker principal, the API as a producer that writes only the "
            "ingress (docs/security.md).",
        ),
    ] = False,
    share_broker: Annotated[
        bool, typer.Option("--share-broker", help="Serve topics another memstream home on this broker serves too.")
    ] = False,
) -> None:
    """Run everything one machine needs: broker, topics, worker and API (Ctrl-C stops)."""
    base = load_settings(broker_acl=True) if acl_mode else get_settings()
    code = run_up(_with(base, **{"api.host": host, "api.port": port}), keep_broker=keep_broker, loglevel=loglevel, share_broker=share_broker)
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add ``api``, ``mcp`` and ``up`` to the main app."""
    app.command("api")(api_cmd)
    app.command("mcp")(mcp_cmd)
    app.command("up")(up_cmd)
