"""The flat names of the last release: every old variable still lands on the setting it
became, with a warning naming the new variable; a new name beats an old one; removed
settings are ignored with a warning; old keywords and attributes still work."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from memstream.settings.model import Settings, load_settings
from memstream.settings.legacy import REMOVED, RENAMED, SettingDeprecationWarning, env_name


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in list(os.environ):
        if name.startswith("MEMSTREAM_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _read(settings: Settings, path: str) -> object:
    group, name = path.split(".")
    return getattr(getattr(settings, group), name)


def _sample(path: str) -> str:
    """A value other than the default that the setting accepts."""
    default = _read(Settings.model_construct(), path)
    if isinstance(default, bool):
        return "false" if default else "true"
    if isinstance(default, (int, float)):
        return str(default + 1)
    literal = {
        "broker.security_protocol": "SSL",
        "broker.sasl_mechanism": "SCRAM-SHA-256",
        "extraction.llm_max_tokens": "7",
        "extraction.llm_temperature": "0.5",
        "extraction.prompt": "compact",
    }
    return literal.get(path, "x-7")


@pytest.mark.parametrize("old", [o for o, new in RENAMED.items() if new and env_name(new) != f"MEMSTREAM_{o.upper()}"])
def test_an_old_variable_lands_on_its_new_setting_with_a_warning(old: str, clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    new = RENAMED[old]
    assert new is not None
    monkeypatch.setenv(f"MEMSTREAM_{old.upper()}", _sample(new))
    with pytest.warns(SettingDeprecationWarning, match=env_name(new)):
        settings = Settings()
    default = _read(Settings.model_construct(), new)
    assert _read(settings, new) != default, old


def test_the_new_name_wins_over_the_old_one(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSTREAM_PARTITIONS", "5")
    monkeypatch.setenv("MEMSTREAM_BROKER_PARTITIONS", "9")
    with pytest.warns(SettingDeprecationWarning):
        assert Settings().broker.partitions == 9


@pytest.mark.parametrize("removed", sorted(o for o, new in RENAMED.items() if new is None))
def test_a_removed_setting_is_ignored_with_a_warning(removed: str, clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"MEMSTREAM_{removed.upper()}", "1")
    with pytest.warns(SettingDeprecationWarning, match=f"MEMSTREAM_{removed.upper()} is deprecated: it is no longer a setting"):
        assert Settings() == Settings.model_validate({})


@pytest.mark.parametrize("path", REMOVED)
def test_a_setting_turned_constant_is_gone_from_its_group_and_its_grouped_name_warns(path: str) -> None:
    group, name = path.split(".")
    assert name not in type(getattr(Settings.model_construct(), group)).model_fields
    assert RENAMED[path.replace(".", "_")] is None  # so the test above warns for MEMSTREAM_<GROUP>_<FIELD>


def test_old_names_in_the_home_config_file_are_read_too(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = clean_env / "home"
    home.mkdir()
    (home / "config.env").write_text("MEMSTREAM_TOPIC_PREFIX=old.\nMEMSTREAM_EMBEDDING_DIM=64\n")
    monkeypatch.setenv("MEMSTREAM_HOME", str(home))
    with pytest.warns(SettingDeprecationWarning, match="MEMSTREAM_BROKER_TOPIC_PREFIX"):
        settings = load_settings()
    assert (settings.broker.topic_prefix, settings.embeddings.dim) == ("old.", 64)


def test_the_new_names_alone_warn_nothing(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSTREAM_BROKER_PORT", "29092")
    monkeypatch.setenv("MEMSTREAM_STORAGE_ROOT", "tables")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settings = Settings()
    assert settings.broker.bootstrap_servers == "127.0.0.1:29092"
    assert settings.storage.root == settings.home / "tables"


def test_an_old_keyword_beats_a_new_variable_as_any_keyword_beats_the_environment(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMSTREAM_SECURITY_SEALING", "false")
    assert Settings(sealing=True).security.sealing is True


def test_old_keywords_attributes_and_copies_reach_the_groups(clean_env: Path) -> None:
    settings = Settings(partitions=6, embedder="local", extract_max_attempts=2)
    assert (settings.broker.partitions, settings.embeddings.provider, settings.extraction.max_attempts) == (6, "local", 2)
    assert settings.partitions == 6  # type: ignore[attr-defined]
    copy = settings.model_copy(update={"partitions": 4, "storage.sharded": True})
    assert (copy.broker.partitions, copy.storage.sharded, settings.broker.partitions) == (4, True, 6)


def test_every_new_name_in_the_table_is_a_setting() -> None:
    for old, new in RENAMED.items():
        if new is not None:
            _read(Settings.model_construct(), new)  # AttributeError names a stale entry
