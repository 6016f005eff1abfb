"""CLI commands: analytics."""

from __future__ import annotations

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
