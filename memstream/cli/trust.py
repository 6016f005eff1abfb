"""``memstream trust-legacy``: the operator's explicit trust in a log's unsigned past
(:mod:`memstream.streams.trust.legacy_trust`, docs/security.md)."""

from __future__ import annotations

import asyncio

import typer
from aiokafka.errors import KafkaError

from memstream.cli._errors import CLIError
from memstream.settings import get_settings
from memstream.streams.trust.legacy_trust import LegacyTrustError, legacy_trust_path, load_legacy_trust, record_legacy_trust

__all__ = ["register"]

def trust_legacy_command(
    extend: bool = typer.Option(False, "--extend", help="Move an existing record to the log's current end."),
    show: bool = typer.Option(False, "--show", help="Print what is trusted now; change nothing."),
) -> None:
    """Trust the unsigned system events already on the events topic (a log written
    before the worker signed its records), up to its current end per partition. Run it
    once, right after upgrading, before any producer writes again: everything below the
    recorded offsets replays as before; unsigned system events after them are still
    dead-lettered."""
    settings = get_settings()
    try:
        if show:
            trust = load_legacy_trust(settings.resolved_worker_key_file)
        else:
            trust = asyncio.run(record_legacy_trust(settings.streams, extend=extend))
    except LegacyTrustError as exc:
        raise CLIError(str(exc)) from None
    except KafkaError as exc:
        raise CLIError(f"cannot reach Kafka at {settings.broker.bootstrap_servers}: {exc}") from None
    path = legacy_trust_path(settings.resolved_worker_key_file)
    if not trust:
        typer.echo(f"nothing trusted: no {path}")
        return
    below = ", ".join(f"partition {p} below offset {o}" for (_, p), o in sorted(trust.items()))
    topic = next(iter(trust))[0]
    verb = "trusted" if show else "now trusted"
    typer.echo(f"{verb}: unsigned system events on {topic}, {below} ({path})")


def register(app: typer.Typer) -> None:
    app.command("trust-legacy")(trust_legacy_command)
