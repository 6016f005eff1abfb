"""``memstream forget --wait`` and ``memstream forget status`` on the real broker: they
say where a forget stands and exit non-zero until every projection applied it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from memstream.bench._common import WorkerProcess
from memstream.domain.events import MemoryAdded, Scope
from memstream.settings.model import child_env
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ALICE = Scope(team_id="acme", user_id="alice")


def run(settings, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return subprocess.run([sys.executable, "-m", "memstream", "forget", *args], env=child_env(settings),
                          capture_output=True, text=True, timeout=timeout)


async def test_forget_waits_for_the_projections_and_status_says_where_it_stands(
    fresh_topics: Topics, settings_for, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(fresh_topics, embedder="local", embedding_dim=32, sealing=True)
    async with MemstreamProducer(settings.streams) as producer:
        await producer.send_many([MemoryAdded(scope=ALICE, memory_id=f"m{i}", content=f"fact {i}") for i in range(3)])
    worker = WorkerProcess(settings, tmp_path / "worker", services=["projector", "sealer"])
    worker.start()
    worker.stop()  # the tables exist; nothing applies the forget now

    stopped = run(settings, "--team", "acme", "--user", "alice", "--yes", "--wait", "--timeout", "2")
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert "0/2 forget records applied" in stopped.stdout and "not applied within 2s" in stopped.stdout
    status = run(settings, "status", "--team", "acme", "--user", "alice")
    assert status.returncode == 1 and "waiting for" in status.stdout, status.stdout + status.stderr
    assert run(settings, "status", "--team", "acme", "--user", "nobody").returncode == 2

    worker.start()
    try:
        waited = run(settings, "status", "--team", "acme", "--user", "alice", "--wait", "--timeout", "90")
        assert waited.returncode == 0, waited.stdout + waited.stderr
        assert "2/2 forget records applied" in waited.stdout
    finally:
        worker.stop()
    done = run(settings, "status", "--team", "acme", "--user", "alice")
    assert done.returncode == 0 and "rows deleted" in done.stdout
