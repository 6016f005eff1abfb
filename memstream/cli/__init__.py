"""The ``memstream`` command line. Each area owns one module with its commands; this
module only assembles them and turns errors into one clear line."""

from __future__ import annotations

import sys

import typer

from memstream.cli import (
    analytics,
    bench,
    broker,
    events,
    extract,
    projector,
    reflect,
    serve,
)
from memstream.cli._errors import CLIError, run_cli

__all__ = ["app", "main", "CLIError"]

app = typer.Typer(
    name="memstream",
    help="Long-term memory for fleets of LLM agents: events on Kafka, views in LanceDB.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

for module in (broker, events, projector, analytics, extract, reflect, serve, bench):
    module.register(app)


def main() -> None:
    sys.exit(run_cli(app))
