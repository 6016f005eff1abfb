"""``memstream console``: the web console's operator token (docs/console.md).

The console itself is served by the API at ``/console`` (``MEMSTREAM_API_CONSOLE=false``
turns it off); API keys open the memory pages, the operator token the operations
pages (dead letters, worker status, forget)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from memstream.settings import Settings, get_settings

__all__ = ["register", "prepare_console"]

console = Console(stderr=True, highlight=False)


def prepare_console(settings: Settings) -> None:
    """What ``memstream up`` does for the console: the operator token exists (0600)."""
    from memstream.interfaces.console.session import ensure_operator_token

    if not settings.api.console:
        console.print("Console: off (MEMSTREAM_API_CONSOLE=false)")
        return
    path = ensure_operator_token(settings)
    console.print(f"Console: operator token in {escape(str(path))} (`memstream console token --show` prints it)")


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="The web console served by the API at /console.")
    app.add_typer(group, name="console")

    @group.command("token")
    def token_cmd(
        show: Annotated[bool, typer.Option("--show", help="Print the token itself (else only its file).")] = False,
        rotate: Annotated[bool, typer.Option("--rotate", help="Replace the token: open operator sessions end.")] = False,
    ) -> None:
        """Create (once) the operator token that opens the console's operations pages."""
        from memstream.interfaces.console.session import ensure_operator_token, operator_token_path

        settings = get_settings()
        if rotate:
            operator_token_path(settings).unlink(missing_ok=True)
        path = ensure_operator_token(settings)
        console.print(f"operator token: {escape(str(path))} (mode 0600)")
        if show:
            print(path.read_text(encoding="ascii").strip(), flush=True)
