"""CLI commands for Kafka itself: ``memstream broker start|stop|status`` and
``memstream topics create``.

The broker commands are thin shells over :mod:`memstream.streams.broker.local`, so the
CLI, `.ci/run` and the test fixtures start the very same broker. ``broker status`` exits
with 3 when no broker of ours is running (as ``systemctl status`` does), so scripts can
write ``memstream broker status || memstream broker start``.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from memstream.cli._errors import CLIError
from memstream.settings import get_settings, load_settings
from memstream.streams.broker import local

__all__ = ["register", "broker_app", "topics_app"]

_NOT_RUNNING_EXIT = 3

console = Console()

broker_app = typer.Typer(
    help="Run a local Apache Kafka broker (one KRaft node on 127.0.0.1, jars from Maven Central).",
    no_args_is_help=True,
)
topics_app = typer.Typer(help="Kafka topics of memstream.", no_args_is_help=True)


def _describe(status: local.BrokerStatus) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    colour = {"running": "green", "starting": "yellow", "external": "yellow"}.get(status.state, "red")
    table.add_row("state", f"[{colour}]{status.state}[/{colour}]")
    if status.detail:
        table.add_row("", status.detail)
    table.add_row("kafka", status.version)
    table.add_row("bootstrap", status.bootstrap_servers)
    table.add_row("controller", f"127.0.0.1:{status.controller_port}")
    table.add_row("acl", "on (SASL PLAIN, StandardAuthorizer)" if status.acl else "off")
    table.add_row("pid", str(status.pid) if status.pid is not None else "-")
    if status.cluster_id:
        table.add_row("cluster id", status.cluster_id)
    table.add_row("data", str(status.data_dir))
    table.add_row("log", str(status.log_file))
    return table


_ACL_HELP = (
    "Run with SASL and Kafka's ACLs (MEMSTREAM_BROKER_ACL=true): per-home principals for the worker, "
    "producers and readers, passwords in <home>/kafka/ (docs/security.md)."
)


@broker_app.command("start")
def start(acl: Annotated[bool, typer.Option("--acl", help=_ACL_HELP)] = False) -> None:
    """Start the broker (fetching Kafka's jars with Maven on first use) and wait until it
    answers; does nothing if it already runs."""
    settings = load_settings(broker_acl=True) if acl else get_settings()
    try:
        status = local.start(settings.local_broker)
    except local.BrokerError as exc:
        raise CLIError(str(exc)) from exc
    mode = " with ACLs (SASL PLAIN)" if status.acl else ""
    if status.started:
        console.print(
            f"[green]started[/green] Kafka {status.version}{mode} at {status.bootstrap_servers} "
            f"(pid {status.pid}, data {status.data_dir})",
            highlight=False,
            soft_wrap=True,
        )
    else:
        console.print(
            f"already running: Kafka {status.version}{mode} at {status.bootstrap_servers} (pid {status.pid})",
            highlight=False,
            soft_wrap=True,
        )


@broker_app.command("stop")
def stop() -> None:
    """Stop the broker started by `memstream broker start` (its data is kept)."""
    settings = get_settings()
    try:
        stopped = local.stop(settings.local_broker)
    except local.BrokerError as exc:
        raise CLIError(str(exc)) from exc
    if stopped:
        console.print("[green]stopped[/green]")
    else:
        status = local.status(settings.local_broker)
        note = f" ({status.detail})" if status.state == "external" else ""
        console.print(f"not running{note}", highlight=False, soft_wrap=True)


@broker_app.command("status")
def status() -> None:
    """Show whether the broker runs, where, and where its data and log are. Exit code 3
    when no broker of ours is running."""
    current = local.status(get_settings().local_broker)
    console.print(_describe(current))
    if current.state != "running":
        raise typer.Exit(_NOT_RUNNING_EXIT)


@topics_app.command("create")
def create() -> None:
    """Create every topic of the catalogue that does not exist yet (safe to repeat)."""
    from memstream.streams.admin import TopicCreationError, ensure_topics  # the Kafka clients, only when run
    from memstream.streams.topics import Topics

    settings = get_settings()
    topics = Topics.from_settings(settings.broker)
    try:
        result = asyncio.run(ensure_topics(settings.broker, topics))
    except TopicCreationError as exc:
        raise CLIError(f"{exc} (is the broker running? `memstream broker status`)") from exc
    table = Table(title=f"topics at {settings.broker.bootstrap_servers}")
    table.add_column("topic")
    table.add_column("partitions", justify="right")
    table.add_column("retention")
    table.add_column("status")
    for spec in topics.catalogue():
        outcome = result.get(spec.name, "?")
        retention = "forever" if spec.config.get("retention.ms") == "-1" else spec.config.get("retention.ms", "broker default")
        colour = "green" if outcome == "created" else "dim"
        table.add_row(spec.name, str(spec.partitions), retention, f"[{colour}]{outcome}[/{colour}]")
    console.print(table)


def register(app: typer.Typer) -> None:
    """Add ``broker`` and ``topics`` to the main app."""
    app.add_typer(broker_app, name="broker")
    app.add_typer(topics_app, name="topics")
