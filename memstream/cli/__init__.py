"""The ``memstream`` command line. Each area owns one module with its commands; this
module only assembles them and turns errors into one clear line."""

from __future__ import annotations

import inspect
import logging
import sys
from typing import Any

import typer
from typer.core import TyperOption
from pydantic import ValidationError
from rich.logging import RichHandler

from memstream.cli import (
    analytics,
    banks,
    bench,
    broker,
    console,
    dead_letters,
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

for module in (broker, console, events, dead_letters, projector, shards, analytics, extract, reflect, serve, banks, sealing, trust, bench):
    module.register(app)


def _flag_type(self: TyperOption, ctx: Any) -> str | None:
    """No ``<bool>`` beside a flag in ``--help`` (typer shows every option's type; a
    flag takes no value, so it has none to show)."""
    return None if self.is_flag else _typed(self, ctx)


_typed = TyperOption.display_type_rich
TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign,assignment]


def _unwrap(text: str) -> str:
    """A docstring's paragraphs each as one line: typer's rich help keeps single line
    breaks, and a command's summary would break mid-sentence where its source did."""
    return "\n\n".join(" ".join(part.split()) for part in inspect.cleandoc(text).split("\n\n"))


def _unwrap_help(typer_app: typer.Typer) -> None:
    for command in typer_app.registered_commands:
        doc = command.help or (command.callback.__doc__ if command.callback else None)
        if doc:
            command.help = _unwrap(doc)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            info = group.typer_instance.info
            if isinstance(info.help, str):
                info.help = _unwrap(info.help)
            _unwrap_help(group.typer_instance)


_unwrap_help(app)


def _drop_unclosed_clients(record: logging.LogRecord) -> bool:
    """aiokafka reports a client that failed to start as "Unclosed AIOKafka..." when
    the process ends; after a command's own one-line error that is only noise."""
    return not record.getMessage().startswith("Unclosed AIOKafka")


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
    logging.getLogger("asyncio").addFilter(_drop_unclosed_clients)
    if level != "DEBUG":
        for noisy in ("aiokafka", "kafka", "faust", "mode"):
            logging.getLogger(noisy).setLevel(max(logging.getLevelName(level), logging.ERROR))


def main() -> None:
    private_by_default()
    _configure_logging()
    sys.exit(run_cli(app))
