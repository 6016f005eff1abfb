"""Turn any failure into one readable line on stderr and a non-zero exit code."""

from __future__ import annotations

import logging

import click
import typer
from rich.console import Console

__all__ = ["CLIError", "run_cli", "err_console"]

err_console = Console(stderr=True)


class CLIError(Exception):
    """An error whose message is meant for the user as is."""


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
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        return 1
    except Exception as exc:  # noqa: BLE001 - the CLI's last line of defence
        logging.getLogger("memstream").debug("unhandled", exc_info=True)
        err_console.print(f"[red]error:[/red] {type(exc).__name__}: {exc}", highlight=False)
        return 1
    return result if isinstance(result, int) and not isinstance(result, bool) else 0
