"""CLI commands of the projection side: ``memstream worker`` and ``memstream replay``.

Thin shells: the worker is :func:`memstream.services.worker.run_worker`, the replay is
:func:`memstream.services.replay.rebuild.replay`; this module only turns options into
calls and results into readable lines.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from memstream.cli._errors import CLIError
from memstream.settings import get_settings

__all__ = ["register", "worker", "replay", "WORKER_HELP", "REPLAY_HELP"]

_console = Console()

# Typer keeps a docstring's line breaks in --help: the help texts are single paragraphs.
WORKER_HELP = (
    "Run the stream worker: projects the log into LanceDB, and runs the extractor and "
    "reflector when installed. Resumes from the stored positions; stops cleanly on Ctrl-C "
    "or SIGTERM."
)
REPLAY_HELP = (
    "Rebuild every table from offset 0 into a new table set, catch up with the running worker, "
    "verify, and swap it in atomically.\n\nRuns while `memstream up` serves: the worker keeps "
    "projecting and searches keep answering; the worker pauses only for the final catch-up. "
    "--dry-run builds and compares, then removes the new set (as does Ctrl-C). A new set that "
    "differs from the live one at the same log positions (something the log does not explain) is "
    "listed by memory space and not swapped in (exit 1) unless --force."
)


def worker(
    services: Annotated[
        str | None,
        typer.Option(
            "--services",
            help="Comma-separated services to run (projector, extractor, reflector, sealer); default: all available.",
        ),
    ] = None,
    agents: Annotated[str | None, typer.Option("--agents", hidden=True, help="Deprecated: use --services.")] = None,
    loglevel: Annotated[str, typer.Option("--loglevel", help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the stream worker (help text: :data:`WORKER_HELP`)."""
    from memstream.services.worker import WorkerError, run_worker

    if agents is not None:
        _console.print("[yellow]warning:[/] --agents is deprecated, use --services")
    chosen = services or agents
    names = [a.strip() for a in chosen.split(",") if a.strip()] if chosen else None
    try:
        code = run_worker(get_settings(), services=names, loglevel=loglevel)
    except WorkerError as exc:
        raise CLIError(str(exc)) from None
    if code:
        raise typer.Exit(code)


def replay(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Build and compare, keep the live set.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Swap in the new set even when it differs from the live set at the same log positions "
            "(the differences are still listed by memory space; exit 0 once swapped). Without it such a "
            "replay swaps nothing in and exits 1.",
        ),
    ] = False,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, help="Records per projector batch.")
    ] = 10_000,
    progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="Show the progress bar.")
    ] = True,
    vector_index: Annotated[
        bool,
        typer.Option(
            "--vector-index",
            help="When the IVF_PQ vector index is due, train it after the swap before exiting (for a set "
            "no worker maintains; by default the worker's maintenance trains it, searches are exact meanwhile).",
        ),
    ] = False,
) -> None:
    """Rebuild every table from offset 0 into a fresh set, verify it, swap it in
    (help text: :data:`REPLAY_HELP`)."""
    from memstream.services.replay import ReplayError
    from memstream.services.replay import RichProgress
    from memstream.services.replay import replay as run_replay

    from memstream.gc_tuning import tune_gc

    settings = get_settings()
    tune_gc()  # as the worker does: decoding allocates heavily
    try:
        if progress:
            with RichProgress() as bar:
                report = asyncio.run(
                    _until_ctrl_c(
                        run_replay(
                            settings,
                            dry_run=dry_run,
                            force=force,
                            batch_size=batch_size,
                            on_progress=bar,
                            on_phase=bar.phase,
                            build_vector_index=vector_index,
                        )
                    )
                )
        else:
            report = asyncio.run(
                _until_ctrl_c(run_replay(
                    settings, dry_run=dry_run, force=force, batch_size=batch_size, build_vector_index=vector_index,
                ))
            )
    except ReplayError as exc:
        raise CLIError(str(exc)) from None
    except asyncio.CancelledError:
        _console.print("interrupted: nothing was swapped in; the unfinished set was removed", highlight=False)
        raise typer.Exit(130) from None
    if report.differences:
        table = Table(title="live vs replay", show_lines=False)
        table.add_column("table")
        table.add_column("live rows", justify="right")
        table.add_column("replay rows", justify="right")
        table.add_column("content")
        for d in report.differences:
            same_count = d.live is not None and d.replay is not None and d.live[0] == d.replay[0]
            table.add_row(
                d.table,
                str(d.live[0]) if d.live else "-",
                str(d.replay[0]) if d.replay else "-",
                "differs" if same_count else "counts differ",
            )
        _console.print(table)
    if report.diverged:
        spaces = Table(title="differs from live at the same log positions", show_lines=False)
        for col in ("team", "user", "table"):
            spaces.add_column(col)
        spaces.add_column("live rows", justify="right")
        spaces.add_column("replay rows", justify="right")
        for diff in report.diverged:
            spaces.add_row(diff.team_id, diff.user_id, diff.table, str(diff.live_rows), str(diff.replay_rows))
        _console.print(spaces)
    _console.print(report.summary(), highlight=False, soft_wrap=True)
    if not report.ok:
        raise typer.Exit(1)


async def _until_ctrl_c(work: Any) -> Any:
    """Run ``work`` and cancel it on Ctrl-C through the event loop (the cancellation then
    reaches it at its next await, never in the middle of a step), so its clean-up runs."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, task.cancel)
    try:
        return await task
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
    app.command("worker", help=WORKER_HELP)(worker)
    app.command("replay", help=REPLAY_HELP)(replay)
