"""Versioned prompt files: the packaged defaults, overrides by team and agent, errors."""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

import pytest

from memstream.domain.events import Scope
from memstream.domain.prompts import PromptError, PromptLibrary, override_paths, packaged_prompt, parse_prompt

ACME_BOT = Scope(team_id="acme", user_id="ana", agent_id="bot")


@pytest.mark.parametrize(
    ("prompt_id", "variables", "version"),
    [("extraction", ("background", "turns", "known", "max_memories"), "2"), ("judgment", ("items",), "2")],
)
def test_packaged_prompts_have_id_version_and_the_file_digest(prompt_id: str, variables: tuple[str, ...], version: str) -> None:
    prompt = packaged_prompt(prompt_id)
    data = (resources.files("memstream.domain") / "prompts" / f"{prompt_id}.toml").read_bytes()
    assert prompt.id == prompt_id
    assert prompt.version == version
    assert prompt.sha256 == hashlib.sha256(data).hexdigest()
    assert prompt.variables == variables
    assert prompt.ref() == {"prompt_id": prompt_id, "prompt_version": version, "prompt_sha256": prompt.sha256}
    system, user = prompt.render({v: f"<{v}>" for v in variables})
    assert "$" not in system.replace("$$", "") and all(f"<{v}>" in system + user for v in variables)


def test_render_without_a_value_is_an_error() -> None:
    with pytest.raises(PromptError, match=r"\$turns"):
        packaged_prompt("extraction").render({"background": "", "known": "", "max_memories": 3})


def override(version: str, marker: str, prompt_id: str = "judgment") -> str:
    return f'id = "{prompt_id}"\nversion = "{version}"\nsystem = "{marker} system"\nuser = "$items"\n'


def test_the_most_specific_override_wins(tmp_path: Path) -> None:
    lib = PromptLibrary(tmp_path)
    assert lib.get("judgment", ACME_BOT).source == "package:judgment.toml"

    (tmp_path / "judgment.toml").write_text(override("d1", "deployment"))
    assert lib.get("judgment", ACME_BOT).version == "d1"
    assert lib.get("judgment", None).version == "d1"

    team_dir = tmp_path / "teams" / "acme"
    team_dir.mkdir(parents=True)
    (team_dir / "judgment.toml").write_text(override("t1", "team"))
    assert lib.get("judgment", ACME_BOT).version == "t1"
    assert lib.get("judgment", Scope(team_id="other")).version == "d1"

    agent_dir = team_dir / "agents" / "bot"
    agent_dir.mkdir(parents=True)
    (agent_dir / "judgment.toml").write_text(override("a1", "agent"))
    chosen = lib.get("judgment", ACME_BOT)
    assert chosen.version == "a1"
    assert chosen.render({"items": "X"}) == ("agent system", "X")
    assert chosen.sha256 == hashlib.sha256((agent_dir / "judgment.toml").read_bytes()).hexdigest()
    assert lib.get("judgment", Scope(team_id="acme", agent_id="other")).version == "t1"

    # an edited override takes effect without a restart
    (agent_dir / "judgment.toml").write_text(override("a2", "agent"))
    assert lib.get("judgment", ACME_BOT).version == "a2"


def test_override_paths_order(tmp_path: Path) -> None:
    assert override_paths(tmp_path, "extraction", ACME_BOT) == [
        tmp_path / "teams/acme/agents/bot/extraction.toml",
        tmp_path / "teams/acme/extraction.toml",
        tmp_path / "extraction.toml",
    ]


def test_override_ids_never_leave_the_prompts_directory(tmp_path: Path) -> None:
    # another team's override, reachable by "../" ids before
    prompts = tmp_path / "prompts"
    beta = prompts / "teams" / "beta"
    beta.mkdir(parents=True)
    (beta / "judgment.toml").write_text(override("beta-secret", "beta"))
    (tmp_path / "judgment.toml").write_text(override("outside", "outside"))
    lib = PromptLibrary(prompts)
    for scope in (
        Scope(team_id="acme", agent_id="../../beta"),
        Scope(team_id="acme", agent_id=".."),
        Scope(team_id="..", agent_id="teams"),
        Scope(team_id="../prompts/teams/beta"),
    ):
        assert lib.get("judgment", scope).source == "package:judgment.toml", scope
        for path in override_paths(prompts, "judgment", scope):
            assert ".." not in path.relative_to(prompts).parts
    assert override_paths(prompts, "../judgment", ACME_BOT) == []
    assert lib.get("judgment", Scope(team_id="beta")).version == "beta-secret"  # its own team still works


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('id = "other"\nversion = "1"\nsystem = "s"\nuser = "$items"\n', "expected 'judgment'"),
        ('id = "judgment"\nsystem = "s"\nuser = "$items"\n', "'version'"),
        ('id = "judgment"\nversion = "1"\nsystem = ""\nuser = "$items"\n', "'system'"),
        ('id = "judgment"\nversion = "1"\nsystem = "s $secret"\nuser = "$items"\n', r"unknown placeholder\(s\) \$secret"),
        ('id = "judgment"\nversion = "1"\nsystem = "costs $ 5"\nuser = "$items"\n', "malformed placeholder"),
        ("id = [", "invalid TOML"),
    ],
)
def test_a_broken_override_is_an_error_not_a_silent_fallback(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "judgment.toml").write_text(text)
    with pytest.raises(PromptError, match=message):
        PromptLibrary(tmp_path).get("judgment", ACME_BOT)


def test_integer_version_and_dollar_escape() -> None:
    prompt = parse_prompt(b'id = "x"\nversion = 3\nsystem = "costs $$5"\nuser = "u"\n', source="mem")
    assert prompt.version == "3"
    assert prompt.render({}) == ("costs $5", "u")


def test_unknown_packaged_prompt() -> None:
    with pytest.raises(PromptError, match="no packaged prompt"):
        PromptLibrary().get("nonexistent")


def test_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "judgment.toml").write_bytes(b"\xff\xfe")
    with pytest.raises(PromptError, match="UTF-8"):
        PromptLibrary(tmp_path).get("judgment")
