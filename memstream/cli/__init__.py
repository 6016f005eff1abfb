"""The ``memstream`` command line. Each area owns one module with its commands; this
module only assembles them and turns errors into one clear line."""

from __future__ import annotations

import logging
import sys

import typer
from pydantic import ValidationError
from rich.logging import RichHandler

from memstream.cli import (
    analytics,
    bench,
    broker,
    console,
    events,
    extract,
    projector,
    reflect,
    sealing,
    serve,
    shards,
    trust,
)
from memstream.cli._errors import CLIError, run_cli
from memstream.private_files import private_by_default
from memstream.settings import get_settings

__all__ = ["app", "main", "CLIError"]

app = typer.Typer(
    name="memstream",
    help="Long-term memory for fleets of LLM agents: events on Kafka, views in LanceDB.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

for module in (broker, console, events, projector, shards, analytics, extract, reflect, serve, sealing, trust, bench):
    module.register(app)


def _configure_logging() -> None:
    """Readable logs on stderr. Library chatter (aiokafka's reconnect warnings, faust's
    banners) stays at WARNING unless ``Settings.log_level`` (MEMSTREAM_LOG_LEVEL) asks
    for more; long-running commands (worker, up) raise their own level to INFO. Unusable
    settings leave the default here: the command itself reports them in one line."""
    try:
        level = get_settings().log_level
    except ValidationError:
        level = "WARNING"
    logging.basicConfig(
        level=level,
        format="%(name)s: %(message)s",
        handlers=[RichHandler(show_path=False, rich_tracebacks=False, markup=False)],
    )
    if level != "DEBUG":
        for noisy in ("aiokafka", "kafka", "faust", "mode"):
            logging.getLogger(noisy).setLevel(max(logging.getLevelName(level), logging.ERROR))


def main() -> None:
    private_by_default()
    _configure_logging()
    sys.exit(run_cli(app))
