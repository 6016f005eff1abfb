"""The running memstream the interface tests share (see ``conftest.py``): its
settings, keys, URL and child processes."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from memstream.bench.openai_fake import OpenAICompatServer
from memstream.settings.model import Settings
from memstream.streams.topics import Topics

__all__ = ["BANKS", "Stack", "start_process", "stop_process"]

BANKS = """
[banks.alice]
team_id = "acme"
user_id = "alice"
description = "Alice's travel and food preferences."

[banks.acme]
team_id = "acme"
description = "Team-wide knowledge of ACME."

[banks.bot]
team_id = "acme"
agent_id = "bot"
description = "What the ACME bot remembers."

[banks.globex]
team_id = "globex"
user_id = "bob"
description = "Bob's notes at Globex."

[banks.carol]
team_id = "mcpteam"
user_id = "carol"
description = "Carol's preferences as a traveller and investor."
memory_template = "{content} (noted {now:%Y-%m-%d} UTC)"

[banks.dave]
team_id = "mcpteam"
user_id = "dave"
description = "Dave's preferences."

[banks.erin]
team_id = "mcpteam"
user_id = "erin"
description = "Erin's preferences, reached over stdio."

[banks.frank]
team_id = "acme"
user_id = "frank"
description = "Frank's facts, asked for in other words."

[banks.planner]
team_id = "trust"
user_id = "u1"
agent_id = "planner"
description = "The planner agent's memory of user u1."

[banks.spy]
team_id = "trust"
user_id = "u1"
agent_id = "spy"
description = "Another agent of the same user, trying to read the planner's."

[banks.trustteam]
team_id = "trust"
description = "Team-wide key of team trust."
"""


@dataclass
class Stack:
    settings: Settings
    env: dict[str, str]
    base_url: str
    keys: dict[str, str]
    logs: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    rerank: OpenAICompatServer | None = None
    """The scripted server behind ``MEMSTREAM_EMBEDDINGS_RERANK_URL`` (its ``rerank`` script)."""

    @property
    def topics(self) -> Topics:
        return Topics.from_settings(self.settings.broker)

    def headers(self, bank: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[bank]}"}

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.logs / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def start_process(stack: Stack, name: str, argv: list[str]) -> None:
    """Start a child with the stack's environment, its output in ``logs/<name>.log``."""
    out = open(stack.logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
    stack.processes[name] = subprocess.Popen(
        argv, env=stack.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """SIGTERM, then SIGKILL after ``timeout``; the exit code (negative for a signal)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)
