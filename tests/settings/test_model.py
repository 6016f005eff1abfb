"""Every path setting is absolute: ``home`` against the working directory, the rest
under ``home``; ``<home>/config.env`` is read from any working directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from memstream.settings.model import HOME_RELATIVE_PATHS, Settings, load_settings


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No MEMSTREAM_* variable from the developer's shell, and a working directory
    without a ``.env``."""
    import os

    for name in list(os.environ):
        if name.startswith("MEMSTREAM_"):
            monkeypatch.delenv(name)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_relative_paths_resolve_under_home(clean_env: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    s = Settings(home=home, api={"banks_file": Path("b/banks.toml")}, extraction={"prompts_dir": Path("prompts")})
    assert s.home == home
    assert s.storage.root == home / "lance"
    assert s.api.banks_file == home / "b" / "banks.toml"
    assert s.extraction.prompts_dir == home / "prompts"
    assert s.resolved_broker_dir == home / "broker"
    for path in HOME_RELATIVE_PATHS:
        group, name = path.split(".")
        value = getattr(getattr(s, group), name)
        assert value is None or value.is_absolute(), path


def test_absolute_paths_are_kept(clean_env: Path, tmp_path: Path) -> None:
    s = Settings(home=tmp_path / "home", storage={"root": tmp_path / "elsewhere"})
    assert s.storage.root == tmp_path / "elsewhere"


def test_relative_home_is_taken_against_the_working_directory(clean_env: Path) -> None:
    s = Settings(home=Path("h"))
    assert s.home == clean_env / "h"
    assert s.storage.root == clean_env / "h" / "lance"


def test_same_variables_same_files_from_any_directory(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("MEMSTREAM_HOME", str(home))
    monkeypatch.setenv("MEMSTREAM_STORAGE_ROOT", "tables")
    here = Settings()
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    there = Settings()
    assert here.storage.root == there.storage.root == home / "tables"
    assert here.home == there.home == home


def test_config_file_under_home_is_read_from_any_directory(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.env").write_text(
        "MEMSTREAM_BROKER_BOOTSTRAP_SERVERS=10.0.0.5:29092\nMEMSTREAM_BROKER_TOPIC_PREFIX=cfg.\nMEMSTREAM_STORAGE_ROOT=t\n"
    )
    monkeypatch.setenv("MEMSTREAM_HOME", str(home))
    s = load_settings()
    assert s.broker.bootstrap_servers == "10.0.0.5:29092"
    assert s.broker.topic_prefix == "cfg."
    assert s.storage.root == home / "t"
    # The environment wins over the file, and a .env in the working directory too.
    monkeypatch.setenv("MEMSTREAM_BROKER_TOPIC_PREFIX", "env.")
    (clean_env / ".env").write_text("MEMSTREAM_STORAGE_ROOT=local\n")
    s = load_settings()
    assert s.broker.topic_prefix == "env."
    assert s.storage.root == home / "local"
    assert s.broker.bootstrap_servers == "10.0.0.5:29092"


def test_without_config_file_nothing_changes(clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSTREAM_HOME", str(tmp_path / "nohome"))
    assert load_settings() == Settings()
