"""``memstream console token`` as an operator runs it: the token file is made once,
private (0600), shown on request, and replaced only by ``--rotate``; a token file
others can read is refused as a credential."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from memstream.interfaces.console.session import ensure_operator_token, matches_operator_token, operator_token_path
from memstream.settings.model import Settings


def run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")}, "MEMSTREAM_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "memstream", "console", "token", *args],
                          env=env, capture_output=True, text=True, timeout=120)


def test_the_token_is_made_once_private_and_rotated_on_request(tmp_path: Path) -> None:
    first = run(tmp_path, "--show")
    assert first.returncode == 0, first.stderr
    token = first.stdout.strip()
    path = tmp_path / "operator.token"
    assert len(token) >= 40 and path.read_text().strip() == token
    assert path.stat().st_mode & 0o777 == 0o600
    again = run(tmp_path)
    assert again.stdout == "" and "operator.token" in again.stderr  # kept, and never printed without --show
    assert path.read_text().strip() == token
    rotated = run(tmp_path, "--rotate", "--show").stdout.strip()
    assert rotated and rotated != token


def test_only_the_exact_token_of_a_private_file_matches(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    assert not matches_operator_token(settings, "anything")  # no file yet
    token = ensure_operator_token(settings).read_text().strip()
    assert matches_operator_token(settings, token)
    assert not matches_operator_token(settings, token[:-1]) and not matches_operator_token(settings, "")
    operator_token_path(settings).chmod(0o644)
    assert not matches_operator_token(settings, token)  # readable by others: no credential
