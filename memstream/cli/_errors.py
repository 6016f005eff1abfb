"""Turn any failure into one readable line on stderr and a non-zero exit code."""

from __future__ import annotations

import logging

import click
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

__all__ = ["CLIError", "run_cli", "err_console", "validation_line"]

# soft_wrap: a piped stderr must get the error as one line, not hard-wrapped at 80 columns
err_console = Console(stderr=True, soft_wrap=True)


class CLIError(Exception):
    """An error whose message is meant for the user as is."""


def validation_line(exc: ValidationError) -> str:
    """pydantic's multi-line report as one line: the first problem, named the way the
    user set it (``MEMSTREAM_LOG_LEVEL`` rather than ``log_level``)."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    if exc.title == "Settings":
        what = f"setting MEMSTREAM_{where.replace('.', '_').upper()}" if where else "settings"
    else:
        what = f"{exc.title} {where}".strip()
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"invalid {what}: {first.get('msg', 'invalid value')}{more}"


def run_cli(app: typer.Typer) -> int:
    result: object = None
    try:
        # Without standalone mode click *returns* the code of a `typer.Exit(code)`
        # raised inside a command instead of raising it.
        result = app(standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code or 0)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        err_console.print("aborted")
        return 130
    except KeyboardInterrupt:
        return 130
    except CLIError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 1
    except ValidationError as exc:  # most often a bad MEMSTREAM_* variable or .env line
        err_console.print(f"[red]error:[/red] {escape(validation_line(exc))}", highlight=False)
        return 1
    except Exception as exc:  # noqa: BLE001 - the CLI's last line of defence
        logging.getLogger("memstream").debug("unhandled", exc_info=True)
        err_console.print(f"[red]error:[/red] {type(exc).__name__}: {escape(str(exc))}", highlight=False)
        return 1
    return result if isinstance(result, int) and not isinstance(result, bool) else 0
