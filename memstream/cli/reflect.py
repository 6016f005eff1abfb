"""CLI commands of deferred reflection: record a decision and its outcome, read the lessons.

* ``memstream decide``: record a pending decision (``DecisionRecorded``); the rating is
  read leniently ("Strong Buy", "Rating: Overweight", "neutral").
* ``memstream outcome``: record what happened (``OutcomeObserved``), for one decision
  or for a subject.
* ``memstream reflections context --subject S --team T --user U [--budget N]``: the
  lessons an agent would get injected before deciding on ``S``.
* ``memstream reflections list --team T --user U [--subject S]``: the newest
  reflections of a memory space.

The reflector itself runs in the worker (``memstream worker``); these commands only
write to the log and read the projection.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from memstream.cli._errors import CLIError
from memstream.domain.events import EventValidationError, Scope
from memstream.domain.reflection import RatingParseError, parse_rating
from memstream.settings import Settings, get_settings

__all__ = ["register", "reflections_app", "decide", "outcome", "context", "list_command"]

_console = Console()

reflections_app = typer.Typer(
    help="Lessons from settled decisions (read from the projection).", no_args_is_help=True
)

TeamOpt = Annotated[str, typer.Option("--team", help="team_id of the memory space.")]
UserOpt = Annotated[str, typer.Option("--user", help="user_id of the memory space.")]
AgentOpt = Annotated[str, typer.Option("--agent", help="agent_id (recorded with the event).")]


def _scope(team: str, user: str, agent: str = "default") -> Scope:
    try:
        return Scope(team_id=team, user_id=user, agent_id=agent)
    except ValueError as exc:
        raise CLIError(f"invalid scope: {exc}".splitlines()[0]) from None


def _store(settings: Settings, scope: Scope):  # type: ignore[no-untyped-def]
    """The store holding ``scope``'s space (its shard in a sharded set)."""
    from memstream.projections.store import StoreError
    from memstream.projections.store import TableSets
    from memstream.services.shards import open_store, store_for

    if not TableSets(settings.storage.root).root.exists():
        raise CLIError(
            f"no projection at {settings.storage.root}: start `memstream worker` first "
            "(or set MEMSTREAM_STORAGE_ROOT)"
        )
    try:
        return store_for(open_store(settings, TableSets(settings.storage.root).current()), scope)
    except StoreError as exc:
        raise CLIError(str(exc)) from None


def _parse_time(text: str, what: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CLIError(f"{what} {text!r} is not an ISO 8601 date-time") from None
    if moment.tzinfo is None:
        raise CLIError(f"{what} {text!r} needs a UTC offset (e.g. 2025-01-31T16:00:00Z)")
    return moment


async def _send(settings: Settings, build):  # type: ignore[no-untyped-def]
    from aiokafka.errors import KafkaError

    from memstream.streams.producers.producer import MemstreamProducer

    try:
        async with MemstreamProducer(streams=settings.streams, client_id="memstream-cli") as producer:
            return await build(producer)
    except KafkaError as exc:
        raise CLIError(f"cannot reach Kafka at {settings.broker.bootstrap_servers}: {exc}") from None


def decide(
    team: TeamOpt,
    user: UserOpt,
    subject: Annotated[str, typer.Option("--subject", help="What the decision is about, e.g. a ticker.")],
    rating: Annotated[str, typer.Option("--rating", help="buy, overweight, hold, underweight, sell (or text holding one).")],
    text: Annotated[str, typer.Option("--text", help="The decision and its reasoning.")],
    decision_id: Annotated[str | None, typer.Option("--id", help="Decision id (default: a new one).")] = None,
    agent: AgentOpt = "default",
    horizon: Annotated[int, typer.Option("--horizon", min=1, help="Horizon in trading days.")] = 5,
    deadline: Annotated[
        str | None, typer.Option("--deadline", help="ISO time after which the decision expires.")
    ] = None,
    deadline_days: Annotated[
        int, typer.Option("--deadline-days", min=1, help="Deadline in calendar days from now (when --deadline is absent).")
    ] = 14,
) -> None:
    """Record a pending decision; the reflector settles it when its outcome arrives."""
    settings = get_settings()
    try:
        parsed = parse_rating(rating)
    except RatingParseError as exc:
        raise CLIError(exc.reason) from None
    scope = _scope(team, user, agent)
    when = _parse_time(deadline, "--deadline") if deadline else datetime.now(timezone.utc) + timedelta(days=deadline_days)
    the_id = decision_id or f"d-{datetime.now(timezone.utc):%Y%m%d%H%M%S}-{subject}"[:128]
    try:
        sent = asyncio.run(
            _send(
                settings,
                lambda p: p.record_decision(
                    scope, the_id, subject, parsed.value, text, when, horizon_days=horizon
                ),
            )
        )
    except EventValidationError as exc:
        raise CLIError(exc.reason) from None
    _console.print(
        f"decision [bold]{escape(the_id)}[/bold]: {parsed.value} {escape(subject)}, horizon {horizon} days, "
        f"deadline {when.isoformat()} -> {sent.position}",
        highlight=False,
    )


def outcome(
    team: TeamOpt,
    user: UserOpt,
    subject: Annotated[str, typer.Option("--subject", help="What the outcome is about.")],
    raw_return: Annotated[float, typer.Option("--return", help="Raw return over the horizon, e.g. 0.031 for +3.1%.")],
    horizon: Annotated[int, typer.Option("--horizon", min=0, help="Trading days the outcome covers.")],
    decision_id: Annotated[str | None, typer.Option("--decision", help="The decision it settles (default: any of the subject).")] = None,
    benchmark_return: Annotated[float | None, typer.Option("--benchmark-return", help="The benchmark's return over the same window.")] = None,
    outcome_id: Annotated[str | None, typer.Option("--id", help="Outcome id (default: a new one).")] = None,
    agent: AgentOpt = "default",
) -> None:
    """Record an observed outcome; it settles the decisions whose whole horizon it covers."""
    settings = get_settings()
    scope = _scope(team, user, agent)
    the_id = outcome_id or f"o-{datetime.now(timezone.utc):%Y%m%d%H%M%S%f}-{subject}"[:128]
    alpha = raw_return - benchmark_return if benchmark_return is not None else None
    try:
        sent = asyncio.run(
            _send(
                settings,
                lambda p: p.observe_outcome(
                    scope,
                    the_id,
                    subject,
                    raw_return,
                    horizon,
                    decision_id=decision_id,
                    benchmark_return=benchmark_return,
                    alpha=alpha,
                    source="cli",
                ),
            )
        )
    except EventValidationError as exc:
        raise CLIError(exc.reason) from None
    _console.print(f"outcome [bold]{escape(the_id)}[/bold] for {escape(subject)} -> {sent.position}", highlight=False)


@reflections_app.command("context")
def context(
    subject: Annotated[str, typer.Option("--subject", help="The subject of the coming decision.")],
    team: TeamOpt,
    user: UserOpt,
    budget: Annotated[int, typer.Option("--budget", min=0, help="Token budget for the text.")] = 800,
    agent: Annotated[
        str | None, typer.Option("--agent", help="Only this agent's reflections (default: the whole space).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the context as JSON.")] = False,
) -> None:
    """The lessons injected before a decision on SUBJECT: 5 on it, 3 on others."""
    from memstream.projections.reads import context_for

    settings = get_settings()
    scope = _scope(team, user, agent or "default")
    ctx = context_for(_store(settings, scope), scope, subject, budget, same_agent=agent is not None)
    if as_json:
        typer.echo(json.dumps(ctx.to_dict(), ensure_ascii=False))
        return
    if ctx.text:
        typer.echo(ctx.text)
    else:
        _console.print(escape(f"no reflections yet for {team}/{user}"), highlight=False)
    _console.print(
        f"[dim]{len(ctx.same_subject)} on {escape(subject)}, {len(ctx.other_subjects)} on other subjects, "
        f"~{ctx.token_estimate}/{ctx.budget_tokens} tokens"
        + (f", {ctx.omitted} left out for the budget" if ctx.omitted else "")
        + "[/dim]",
        highlight=False,
    )


@reflections_app.command("list")
def list_command(
    team: TeamOpt,
    user: UserOpt,
    subject: Annotated[str | None, typer.Option("--subject", help="Only this subject.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="How many, newest first.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """The newest reflections of a memory space."""
    from memstream.projections.reads import list_reflections

    settings = get_settings()
    scope = _scope(team, user)
    rows = list_reflections(_store(settings, scope), scope, subject=subject, limit=limit)
    if as_json:
        for r in rows:
            typer.echo(json.dumps(r.to_dict(), ensure_ascii=False))
        return
    if not rows:
        _console.print(escape(f"no reflections yet for {team}/{user}"), highlight=False)
        return
    table = Table("when", "subject", "rating", "alpha", "right", "reflection", show_lines=False)
    for r in rows:
        table.add_row(
            r.occurred_at.strftime("%Y-%m-%d %H:%M"),
            escape(r.subject),
            r.rating.value + (" (tpl)" if r.templated else ""),
            f"{r.alpha * 100:+.1f}%" if r.alpha is not None else "-",
            {True: "yes", False: "no", None: "-"}[r.correct],
            escape(r.content),  # tenant text: "[/bold]" in a lesson is text, not markup
        )
    _console.print(table)


def register(app: typer.Typer) -> None:
    """Add ``decide``, ``outcome`` and the ``reflections`` group to the main app."""
    app.command("decide")(decide)
    app.command("outcome")(outcome)
    app.add_typer(reflections_app, name="reflections")
