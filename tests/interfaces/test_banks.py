"""Memory banks and API keys: parsing, access rules, hashing-only storage, reloads."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from memstream.banks import (
    KEY_PREFIX,
    AccessScope,
    Bank,
    BankConfigError,
    RegistrySource,
    UnknownBankError,
    add_bank,
    create_key,
    hash_key,
    keys_path,
    load_registry,
    revoke_key,
    write_default_bank,
)
from memstream.domain.events import Scope
from memstream.settings.model import Settings, child_env

BANKS_TOML = """
[banks.support]
team_id = "acme"
user_id = "alice"
description = "Alice's support preferences."
memory_template = "{content} (noted {now:%Y-%m-%d %H:%M} UTC)"

[banks.team]
team_id = "acme"
description = "Team-wide knowledge."
api_key_sha256 = ["HASH"]

[banks.other]
team_id = "globex"
agent_id = "bot"
description = "Another tenant."
"""


def _settings(tmp_path: Path, text: str, suffix: str = ".toml") -> Settings:
    banks = tmp_path / f"banks{suffix}"
    banks.write_text(text, encoding="utf-8")
    return Settings(home=tmp_path / "home", banks_file=banks, keys_file=tmp_path / "keys.toml")


def test_toml_banks_and_keys_from_both_files(tmp_path: Path) -> None:
    team_key = "msk_team-key-for-tests"
    settings = _settings(tmp_path, BANKS_TOML.replace("HASH", hash_key(team_key)))
    registry = load_registry(settings)
    assert sorted(registry.banks) == ["other", "support", "team"]
    assert registry.authenticate(team_key).bank.name == "team"  # type: ignore[union-attr]

    raw, record = create_key(settings, "support", label="laptop")
    assert raw.startswith(KEY_PREFIX) and len(raw) > 40
    stored = keys_path(settings).read_text()
    assert raw not in stored and hash_key(raw) in stored  # only the hash is kept
    assert oct(keys_path(settings).stat().st_mode & 0o777) == "0o600"

    registry = load_registry(settings)
    principal = registry.authenticate(raw)
    assert principal is not None and principal.bank.name == "support" and principal.key_id == record.key_id
    assert registry.authenticate(raw + "x") is None
    assert registry.authenticate("") is None and registry.authenticate(None) is None


def test_yaml_banks(tmp_path: Path) -> None:
    settings = _settings(
        tmp_path,
        "banks:\n  notes:\n    team_id: t1\n    description: Notes about projects.\n",
        suffix=".yaml",
    )
    bank = load_registry(settings).bank("notes")
    assert bank.scope == Scope(team_id="t1", user_id="default", agent_id="default")
    with pytest.raises(UnknownBankError, match="unknown bank 'nope'"):
        load_registry(settings).bank("nope")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[banks.a]\nteam_id = 'x'\n", "description"),
        ("[banks.a]\nteam_id = 'bad team'\ndescription = 'd'\n", "team_id"),
        ("[banks.a]\nteam_id = 'x'\ndescription = 'd'\nmemory_template = 'no content'\n", "{content}"),
        ("[banks.a]\nteam_id = 'x'\ndescription = 'd'\nmemory_template = '{content.__class__}'\n", "not allowed"),
        ("[banks.a]\nteam_id = 'x'\ndescription = 'd'\napi_key_sha256 = ['msk_plain_key']\n", "64 hex"),
        ("[banks.a]\nteam_id = 'x'\ndescription = 'd'\ncolour = 'red'\n", "colour"),
        ("[bank.a]\nteam_id = 'x'\n", "unknown top-level"),
        ("[banks.a\n", "not valid"),
    ],
)
def test_bad_bank_files_are_reported(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(BankConfigError) as info:
        load_registry(_settings(tmp_path, text))
    assert message in str(info.value)


def test_key_bound_to_undeclared_bank_is_an_error(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "[banks.a]\nteam_id = 'x'\ndescription = 'd'\n")
    keys_path(settings).write_text(f'[[keys]]\nsha256 = "{hash_key("k")}"\nbank = "gone"\n')
    with pytest.raises(BankConfigError, match="bank 'gone'"):
        load_registry(settings)


def test_access_scope_rules() -> None:
    team = AccessScope(team_id="acme")
    alice = AccessScope(team_id="acme", user_id="alice")
    bot = AccessScope(team_id="acme", agent_id="bot")
    assert team.allows(Scope(team_id="acme", user_id="anyone"))
    assert not team.allows(Scope(team_id="globex"))
    assert alice.allows(Scope(team_id="acme", user_id="alice", agent_id="x"))
    assert not alice.allows(Scope(team_id="acme", user_id="bob"))
    assert bot.allows(Scope(team_id="acme", user_id="u", agent_id="bot"))
    assert not bot.allows(Scope(team_id="acme", user_id="u", agent_id="other"))
    assert alice.resolve() == Scope(team_id="acme", user_id="alice")
    assert team.resolve("bob") == Scope(team_id="acme", user_id="bob")
    with pytest.raises(PermissionError):
        alice.resolve("bob")
    with pytest.raises(PermissionError):
        bot.resolve(agent_id="other")


def test_memory_template_renders_current_time() -> None:
    bank = Bank(
        name="b",
        team_id="t",
        description="d",
        memory_template="[{date}] {content} (noted {now:%H:%M} UTC in {bank})",
    )
    when = datetime(2025, 3, 4, 5, 6, tzinfo=timezone.utc)
    assert bank.render_memory("Likes tea", when) == "[2025-03-04] Likes tea (noted 05:06 UTC in b)"
    assert Bank(name="b", team_id="t", description="d").render_memory("x", when) == "x"


def test_registry_source_reloads_on_change_and_fails_closed(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "[banks.a]\nteam_id = 'x'\ndescription = 'd'\n")
    source = RegistrySource(settings)
    assert source.current().keys == {}
    raw, record = create_key(settings, "a")
    assert source.current().authenticate(raw) is not None  # picked up without restart
    revoke_key(settings, record.key_id)
    assert source.current().authenticate(raw) is None
    # A broken banks file is never a reason to keep serving its old keys.
    raw, record = create_key(settings, "a")
    assert source.current().authenticate(raw) is not None
    assert settings.api.banks_file is not None
    settings.api.banks_file.write_text("[banks.a\n")
    os.utime(settings.api.banks_file, ns=(1, 1))
    assert source.current().banks == {} and source.current().authenticate(raw) is None
    assert source.last_error and "not valid" in source.last_error


def test_an_invalid_bank_entry_is_skipped_with_its_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = "[banks.a]\nteam_id = 'x'\ndescription = 'd'\n"
    settings = _settings(tmp_path, good + "[banks.b]\nteam_id = 'y'\ndescription = 'd'\n")
    raw_a, _ = create_key(settings, "a")
    raw_b, _ = create_key(settings, "b")
    source = RegistrySource(settings)
    assert source.current().authenticate(raw_b) is not None
    assert settings.api.banks_file is not None
    # bank b becomes invalid (a bad team id): b and its key are out, a keeps working
    settings.api.banks_file.write_text(good + "\n[banks.b]\nteam_id = 'bad team'\ndescription = 'd'\n")
    with caplog.at_level("ERROR", logger="memstream.banks"):
        registry = source.current()
    assert set(registry.banks) == {"a"}
    assert registry.authenticate(raw_a) is not None and registry.authenticate(raw_b) is None
    assert source.last_error and f"{settings.api.banks_file}:5: skipped: bank 'b'" in source.last_error
    assert any(":5: skipped" in r.getMessage() for r in caplog.records)
    # a keys file that does not parse grants nothing (the banks file's own keys still work)
    assert settings.api.keys_file is not None
    settings.api.keys_file.write_text("[[keys]\n")
    assert source.current().authenticate(raw_a) is None


def test_registry_source_reloads_every_few_seconds_whatever_the_stat_says(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "[banks.a]\nteam_id = 'x'\ndescription = 'd'\n")
    now = [0.0]
    loads: list[int] = []

    def loader(s: Settings, **kw: object) -> object:
        loads.append(1)
        return load_registry(s, **kw)  # type: ignore[arg-type]

    source = RegistrySource(settings, loader=loader, clock=lambda: now[0])  # type: ignore[arg-type]
    source.current()
    source.current()
    assert len(loads) == 1  # nothing changed, inside the bound
    now[0] += RegistrySource.RELOAD_EVERY_S
    source.current()
    assert len(loads) == 2


def test_revoke_needs_an_unambiguous_id(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "[banks.a]\nteam_id = 'x'\ndescription = 'd'\n")
    with pytest.raises(BankConfigError, match="at least 6"):
        revoke_key(settings, "ab")
    with pytest.raises(BankConfigError, match="no key"):
        revoke_key(settings, "abcdef")


def test_default_bank_is_written_once(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", banks_file=None, keys_file=None)
    bank = write_default_bank(settings)
    assert load_registry(settings).bank("default") == bank
    with pytest.raises(BankConfigError, match="already exists"):
        write_default_bank(settings)


def test_cli_keys_create_prints_the_key_once_and_stores_its_hash(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "[banks.a]\nteam_id = 'x'\ndescription = 'd'\n")
    env = child_env(settings)
    done = subprocess.run(
        [sys.executable, "-m", "memstream", "keys", "create", "--bank", "a", "--label", "ci"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    assert key.startswith(KEY_PREFIX)
    assert load_registry(settings).authenticate(key) is not None
    assert key not in keys_path(settings).read_text()

    unknown = subprocess.run(
        [sys.executable, "-m", "memstream", "keys", "create", "--bank", "nope"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert unknown.returncode == 1 and "unknown bank 'nope'" in unknown.stderr


def test_add_bank_appends_a_parseable_table(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "[banks.a]\nteam_id = 'x'\ndescription = 'd'\n")
    odd = Bank(
        name="ops.eu:1",  # dots and colons are legal in names; the TOML key is quoted
        team_id="x",
        user_id="u",
        description='Says "hi"\nand more',
        memory_template="{content} ({now:%Y})",
    )
    add_bank(settings, odd)
    registry = load_registry(settings)
    assert registry.bank("ops.eu:1") == odd and "a" in registry.banks
    with pytest.raises(BankConfigError, match="already declared"):
        add_bank(settings, odd)
    yaml_settings = _settings(tmp_path, "banks: {}\n", suffix=".yaml")
    with pytest.raises(BankConfigError, match="YAML"):
        add_bank(yaml_settings, odd)


def test_cli_banks_add_then_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """In process, through the real entry point (``memstream.cli.main``)."""
    from memstream.cli import main
    from memstream.settings.model import get_settings

    for name in ("API_BANKS_FILE", "API_KEYS_FILE"):
        monkeypatch.delenv(f"MEMSTREAM_{name}", raising=False)
    monkeypatch.setenv("MEMSTREAM_HOME", str(tmp_path / "home"))

    def run(*args: str) -> tuple[int, str, str]:
        get_settings.cache_clear()
        monkeypatch.setattr(sys, "argv", ["memstream", *args])
        try:
            with pytest.raises(SystemExit) as exit_info:
                main()
        finally:
            get_settings.cache_clear()
        out = capsys.readouterr()
        return int(exit_info.value.code or 0), out.out, out.err

    code, _, err = run("banks", "add", "support", "--team", "acme", "--user", "alice", "--description", "Support notes.")
    assert code == 0, err
    code, out, _ = run("banks", "list")
    assert code == 0 and "support" in out and "acme" in out
    code, _, err = run("banks", "add", "x y", "--team", "acme", "--description", "d")
    assert code == 1 and "invalid bank: name" in err
    code, key, err = run("keys", "create", "--bank", "support")
    assert code == 0 and key.strip().startswith(KEY_PREFIX), err
    code, out, _ = run("keys", "list")
    assert code == 0 and hash_key(key.strip())[:12] in out
