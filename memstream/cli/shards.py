"""``memstream shards``: the shards of a sharded table set, one line each (owner,
positions, lag, rows). A thin shell over :mod:`memstream.services.shards.status`."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Annotated

import typer
from aiokafka.errors import KafkaError
from rich.console import Console
from rich.table import Table

from memstream.cli._errors import CLIError
from memstream.settings import get_settings

__all__ = ["register", "shards_cmd"]

_console = Console()


def shards_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per shard.")] = False,
    offline: Annotated[bool, typer.Option("--offline", help="Do not ask Kafka (no lag).")] = False,
) -> None:
    """Per shard of the current table set: the worker writing it, its stored positions,
    its lag behind the log and its row counts."""
    from memstream.services.shards import NotShardedError, end_offsets, shard_statuses
    from memstream.streams.topics import Topics

    settings = get_settings()
    topics = Topics.from_settings(settings.broker)
    ends = None
    if not offline:
        try:
            ends = asyncio.run(end_offsets(settings, [topics.events, topics.messages], settings.broker.partitions))
        except (KafkaError, OSError) as exc:
            raise CLIError(f"cannot read the log's end offsets ({exc}); --offline shows the shards without lag") from None
    try:
        statuses = shard_statuses(settings, ends)
    except NotShardedError as exc:
        raise CLIError(str(exc)) from None
    if as_json:
        for s in statuses:
            typer.echo(json.dumps(dataclasses.asdict(s), sort_keys=True))
        return
    table = Table(title=f"{len(statuses)} shard(s)")
    for column in ("shard", "owner", "events", "messages", "lag", "memories", "turns"):
        table.add_column(column, justify="left" if column == "owner" else "right", overflow="fold")
    for s in statuses:
        table.add_row(
            str(s.partition),
            s.owner or "[dim]none[/dim]",
            str(s.positions.get(topics.events, 0)),
            str(s.positions.get(topics.messages, 0)),
            str(s.total_lag) if ends is not None else "-",
            str(s.rows.get("memories", 0)),
            str(s.rows.get("messages", 0)),
        )
    _console.print(table)


def register(app: typer.Typer) -> None:
    app.command("shards")(shards_cmd)
