"""``memstream trust-legacy`` as an operator runs it: it records the events topic's
ends once, says what it trusts in one line, refuses to move the record without
``--extend`` and reports a bad file in one line, without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memstream.domain.events import MemoryAdded, Scope
from memstream.settings.model import settings_env
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.topics import Topics

pytestmark = pytest.mark.kafka


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memstream", "trust-legacy", *args],
        env=env, capture_output=True, text=True, timeout=120,
    )


async def test_the_command_records_once_and_speaks_in_one_line(
    fresh_topics: Topics, settings_for, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    settings = settings_for(fresh_topics)
    async with MemstreamProducer(settings.streams) as producer:
        await producer.send(MemoryAdded(scope=Scope(team_id="acme", user_id="ana"), memory_id="m1", content="tea"))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")}, **settings_env(settings)}

    shown = run(env, "--show")
    assert shown.returncode == 0 and shown.stdout.startswith("nothing trusted")
    first = run(env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("\n") == 1 and f"on {fresh_topics.events}" in first.stdout
    assert "partition 0 below offset" in first.stdout

    again = run(env)
    assert again.returncode != 0 and "--extend" in again.stderr
    assert "Traceback" not in again.stderr and again.stderr.strip().count("\n") == 0
    assert run(env, "--extend").returncode == 0

    path = Path(settings.home) / "legacy-trust.json"
    path.write_text("{broken")
    bad = run(env, "--show")
    assert bad.returncode != 0 and "not a legacy trust file" in bad.stderr and "Traceback" not in bad.stderr
