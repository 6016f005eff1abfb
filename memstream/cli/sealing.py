"""Crypto-shredding from the command line: ``memstream forget`` and ``memstream reseal``
(docs/security.md)."""

from __future__ import annotations

import asyncio

import typer
from rich.console import Console

from memstream.cli._errors import CLIError
from memstream.sealing import MasterKeyError
from memstream.settings import get_settings
from memstream.streams.forget import forget
from memstream.streams.reseal import ResealError, reseal

__all__ = ["register"]

console = Console()


def reseal_command() -> None:
    """Seal a log written before sealing existed, in place: each kept-forever topic is
    copied, sealed, to a staging topic and back (same partitions and offsets). Stop the
    worker first; an interrupted run resumes where it stopped."""
    settings = get_settings()
    try:
        counts = asyncio.run(reseal(settings, progress=lambda line: console.print(line, markup=False, highlight=False)))
    except (ResealError, MasterKeyError) as exc:
        raise CLIError(str(exc)) from None
    total = sum(counts.values())
    console.print(f"resealed: {total} plaintext records sealed ({', '.join(f'{t} {n}' for t, n in counts.items())})")


def forget_command(
    team: str = typer.Option(..., "--team", help="The team to forget, or whose user to forget."),
    user: str = typer.Option(None, "--user", help="Forget this user only (default: every user of the team)."),
    yes: bool = typer.Option(False, "--yes", help="Do not ask for confirmation."),
) -> None:
    """Forget a person (one user's memory space) or a whole team: their keys are
    destroyed, so what the log holds of them can never be read again, and every
    projection deletes their rows (docs/security.md). This cannot be undone."""
    if not team.strip() or (user is not None and not user.strip()):
        raise CLIError("--team (and --user, when given) must not be empty")
    what = f"team {team!r}" + (f" user {user!r}" if user is not None else " and every user of it")
    if not yes and not typer.confirm(f"Forget {what}? This cannot be undone", default=False):
        raise typer.Abort()
    try:
        report = asyncio.run(forget(get_settings(), team, user))
    except MasterKeyError as exc:
        raise CLIError(str(exc)) from None
    console.print(report.summary(), markup=False, highlight=False)
    if not report.forgotten and not report.already_forgotten:
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.command("forget")(forget_command)
    app.command("reseal")(reseal_command)
