"""``memstream.cli._errors``: every failure becomes one line on stderr and an exit code."""

from __future__ import annotations

import pytest
import typer
from pydantic import ValidationError

from memstream.cli._errors import CLIError, run_cli, validation_line
from memstream.settings.model import Settings


@pytest.fixture(autouse=True)
def _no_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["memstream"])  # click reads the command line from here


def _app(failure: BaseException | None, result: int | None = None) -> typer.Typer:
    app = typer.Typer(pretty_exceptions_enable=False, add_completion=False)

    @app.command()
    def go() -> int | None:
        if failure is not None:
            raise failure
        return result

    return app


def _settings_error() -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        Settings(log_level="LOUD")
    return caught.value


def test_a_cli_error_is_its_message_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli(_app(CLIError("no projection in /x: start `memstream worker`")))
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip().splitlines() == ["error: no projection in /x: start `memstream worker`"]


def test_a_bad_setting_names_the_variable_the_user_set(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli(_app(_settings_error()))
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert len(err.splitlines()) == 1
    assert err.startswith("error: invalid setting MEMSTREAM_LOG_LEVEL:")


def test_a_bad_grouped_setting_names_its_variable() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(broker={"partitions": 0})
    assert validation_line(caught.value).startswith("invalid setting MEMSTREAM_BROKER_PARTITIONS:")


def test_validation_line_counts_the_other_problems() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(log_level="LOUD", embedding_dim=-3)
    line = validation_line(caught.value)
    assert "\n" not in line
    assert line.endswith("(and 1 more)")


def test_an_unexpected_exception_is_one_line_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli(_app(RuntimeError("disk on fire")))
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err == "error: RuntimeError: disk on fire"
    assert "Traceback" not in err


def test_ctrl_c_exits_130(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(_app(KeyboardInterrupt())) == 130


def test_exit_codes_pass_through() -> None:
    assert run_cli(_app(typer.Exit(3))) == 3
    assert run_cli(_app(None, result=4)) == 4
    assert run_cli(_app(None)) == 0
