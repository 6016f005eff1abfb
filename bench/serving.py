"""A served memstream for the load benchmarks: tenants with their API keys, the banks file
that grants them, the API as its own process, and the broker's pid for CPU accounting."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from memstream.domain.events import Scope
from memstream.settings import Settings, child_env
from memstream.streams.broker.local import status as broker_status


@dataclass
class Tenant:
    """One memory bank, its key, and the memories written to it."""

    name: str
    team: str
    user: str
    key: str = ""
    memory_ids: set[str] = field(default_factory=set)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    @property
    def scope(self) -> Scope:
        return Scope(team_id=self.team, user_id=self.user)


# ------------------------------------------------------------------------------ set-up
def banks_toml(tenants: list[Tenant]) -> str:
    return "".join(
        f'[banks.{t.name}]\nteam_id = "{t.team}"\nuser_id = "{t.user}"\n'
        f'description = "Benchmark tenant {t.name}."\n\n'
        for t in tenants
    )


class ApiProcess:
    """``python -m memstream api`` as a child process, its output in ``api.log``."""

    def __init__(self, settings: Settings, workdir: Path) -> None:
        self.settings = settings
        self.log_path = workdir / "api.log"
        self.url = f"http://{settings.api.host}:{settings.api.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout_s: float = 240.0) -> None:
        env = {**child_env(self.settings), "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "ab") as out:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "memstream", "api"], env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"the API server exited:\n{self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the API server did not become healthy:\n{self.tail()}")
            time.sleep(0.3)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def broker_pid(settings: Settings) -> int | None:
    """The local broker's process id (``None``: an external broker). The benchmark's
    settings have a home of their own: the broker's is the environment's."""
    found = broker_status(Settings(broker={"bootstrap_servers": settings.broker.bootstrap_servers}).local_broker)
    return found.pid if found.state == "running" else None
