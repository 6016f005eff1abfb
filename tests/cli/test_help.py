"""``memstream --help`` and every command's: flags show no ``<bool>`` type, and each
command's summary reads as one sentence (no break where its docstring's line ended).
A wrong broker port ends with the command's one-line error, no aiokafka noise after."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from memstream.cli import app

WIDE = {"COLUMNS": "400", "TERMINAL_WIDTH": "400"}


def _commands(group: typer.Typer, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], typer.models.CommandInfo]]:
    found = []
    for command in group.registered_commands:
        name = command.name or (command.callback.__name__.replace("_", "-") if command.callback else "")
        found.append(((*path, name), command))
    for sub in group.registered_groups:
        if sub.typer_instance is not None and sub.name:
            found += _commands(sub.typer_instance, (*path, sub.name))
    return found


def test_no_flag_shows_a_type_and_every_summary_is_whole() -> None:
    runner = CliRunner()
    top = runner.invoke(app, ["--help"], env=WIDE)
    assert top.exit_code == 0 and "<bool>" not in top.output
    assert "Stop the worker first" in top.output  # the reseal summary, on one line
    commands = _commands(app)
    assert len(commands) > 20
    for path, command in commands:
        shown = runner.invoke(app, [*path, "--help"], env=WIDE)
        assert shown.exit_code == 0, (path, shown.output)
        assert "<bool>" not in shown.output, path
        summary = inspect.cleandoc(command.help or "").split("\n\n")[0]
        assert "\n" not in summary and summary in shown.output, (path, summary)


def test_a_wrong_broker_port_ends_with_the_error_alone(tmp_path: Path) -> None:
    env = {"MEMSTREAM_HOME": str(tmp_path), "MEMSTREAM_BROKER_BOOTSTRAP_SERVERS": "127.0.0.1:1", "PATH": "/usr/bin:/bin"}
    for args in (["dead-letters", "count"], ["shards"]):
        run = subprocess.run([sys.executable, "-m", "memstream", *args], env=env, capture_output=True, text=True, timeout=180)
        assert run.returncode == 1, run.stderr
        assert run.stderr.strip().splitlines()[-1].startswith("error: "), run.stderr
        assert "Unclosed" not in run.stderr, run.stderr
