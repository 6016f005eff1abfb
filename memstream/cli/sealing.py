"""Crypto-shredding from the command line: ``memstream forget`` and ``memstream reseal``
(docs/security.md)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from memstream.cli._errors import CLIError
from memstream.settings import Settings, get_settings

if TYPE_CHECKING:  # imported where used: `memstream --help` must not load the stack
    from memstream.domain.log import LogPosition
    from memstream.services.log_reads import ForgetProgress

__all__ = ["register"]

console = Console()


def reseal_command() -> None:
    """Seal a log written before sealing existed, in place: each kept-forever topic is
    copied, sealed, to a staging topic and back (same partitions and offsets). Stop the
    worker first; an interrupted run resumes where it stopped."""
    from memstream.sealing import MasterKeyError
    from memstream.streams.sealing.reseal import STATE_FILE, ResealError, reseal

    settings = get_settings()
    try:
        counts = asyncio.run(reseal(settings.streams, settings.home / STATE_FILE, progress=lambda line: console.print(line, markup=False, highlight=False)))
    except (ResealError, MasterKeyError) as exc:
        raise CLIError(str(exc)) from None
    total = sum(counts.values())
    console.print(f"resealed: {total} plaintext records sealed ({', '.join(f'{t} {n}' for t, n in counts.items())})")


forget_app = typer.Typer(help="Forget a person or a team (crypto-shredding); `forget status` says where a forget stands.")


@forget_app.callback(invoke_without_command=True)
def forget_command(
    ctx: typer.Context,
    team: str | None = typer.Option(None, "--team", help="The team to forget, or whose user to forget."),
    user: str | None = typer.Option(None, "--user", help="Forget this user only (default: every user of the team)."),
    yes: bool = typer.Option(False, "--yes", help="Do not ask for confirmation."),
    wait: bool = typer.Option(False, "--wait", help="Return once every shard's projections applied the forget (exit 1 if not within --timeout)."),
    timeout: float = typer.Option(120.0, "--timeout", min=0, help="With --wait: seconds to wait."),
) -> None:
    """Forget a person (one user's memory space) or a whole team: their keys are
    destroyed, so what the log holds of them can never be read again, and every
    projection deletes their rows (docs/security.md). This cannot be undone."""
    if ctx.invoked_subcommand is not None:
        return
    subject, user = _subject(team, user)
    what = f"team {subject!r}" + (f" user {user!r}" if user is not None else " and every user of it")
    if not yes and not typer.confirm(f"Forget {what}? This cannot be undone", default=False):
        raise typer.Abort()
    from memstream.sealing import MasterKeyError
    from memstream.streams.sealing.forget import forget

    settings = get_settings()
    try:
        report = asyncio.run(forget(settings.streams, subject, user))
    except MasterKeyError as exc:
        raise CLIError(str(exc)) from None
    console.print(report.summary(), markup=False, highlight=False)
    if not report.forgotten and not report.already_forgotten:
        raise typer.Exit(2)
    if wait and report.positions:
        _wait(settings, report.positions, timeout)


@forget_app.command("status")
def forget_status(
    team: str | None = typer.Option(None, "--team", help="The team forgotten, or whose user was."),
    user: str | None = typer.Option(None, "--user", help="The user (default: every user of the team)."),
    wait: bool = typer.Option(False, "--wait", help="Wait until the projections applied it (exit 1 if not within --timeout)."),
    timeout: float = typer.Option(120.0, "--timeout", min=0, help="With --wait: seconds to wait."),
) -> None:
    """Where the latest forget of a subject stands: its records in the log, and whether the projections have applied them (exit 1 while they have not, 2 if there is none)."""
    from memstream.services.log_reads import forget_positions, progress

    subject, user = _subject(team, user)
    settings = get_settings()
    positions = asyncio.run(forget_positions(settings, subject, user))
    if not positions:
        console.print("no forget of this subject is in the log", markup=False, highlight=False)
        raise typer.Exit(2)
    console.print("forget records: " + ", ".join(str(p) for p in positions), markup=False, highlight=False)
    if wait:
        _wait(settings, positions, timeout)
        return
    state = asyncio.run(progress(settings, positions))
    console.print(state.line(), markup=False, highlight=False)
    if not state.applied:
        raise typer.Exit(1)


def _subject(team: str | None, user: str | None) -> tuple[str, str | None]:
    if team is None or not team.strip() or (user is not None and not user.strip()):
        raise CLIError("--team (and --user, when given) must not be empty")
    return team, user


def _wait(settings: Settings, positions: list[LogPosition], timeout: float) -> None:
    from memstream.services.log_reads import wait_applied

    started = time.monotonic()

    def show(state: ForgetProgress) -> None:
        console.print(f"[{time.monotonic() - started:5.1f}s] {state.line()}", markup=False, highlight=False)

    state = asyncio.run(wait_applied(settings, positions, timeout, show))
    if not state.applied:
        console.print(f"not applied within {timeout:.0f}s (is the worker running?)", markup=False, highlight=False)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(forget_app, name="forget")
    app.command("reseal")(reseal_command)
