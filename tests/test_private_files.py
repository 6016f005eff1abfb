"""Files private by default: a worker started as ``memstream up`` starts it writes its
home (keys) and its tables (a projected memory) as 0600 files in 0700 directories,
whatever the umask it was started with. Real broker, worker process and LanceDB."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from memstream.domain.events import MemoryAdded, Scope
from memstream.private_files import private_by_default
from memstream.settings.model import child_env
from memstream.streams.producers.producer import MemstreamProducer

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _open_to_others(root: Path) -> list[str]:
    found = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & 0o077:
            found.append(f"{oct(mode)} {path}")
    return found


def _memory_files(lance: Path) -> list[Path]:
    data = lance / "memories.lance" / "data"
    return list(data.iterdir()) if data.is_dir() else []


async def test_a_worker_writes_its_home_and_tables_private(fresh_topics: Any, settings_for: Any, tmp_path: Path) -> None:
    settings = settings_for(fresh_topics, projector_batch_seconds=0.05)
    lance, home = Path(settings.storage.root), Path(settings.home)
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 - closed below
    before = os.umask(0o022)  # the child inherits the usual default: group and others may read
    try:
        worker = subprocess.Popen(
            [sys.executable, "-m", "memstream.services.worker", "--services", "projector"],
            env=child_env(settings), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    finally:
        os.umask(before)
    try:
        async with MemstreamProducer(settings.streams, topics=fresh_topics, client_id="private-files") as producer:
            await producer.send_many([MemoryAdded(scope=Scope(team_id="acme", user_id="ana"), memory_id="m1",
                                                  content="Ana's passport number is X1234567")])
        deadline = time.monotonic() + 240  # a readiness bound: the worker imports the whole stack
        while not _memory_files(lance):
            if worker.poll() is not None or time.monotonic() > deadline:
                pytest.fail((tmp_path / "worker.log").read_text(errors="replace")[-3000:])
            time.sleep(0.3)
    finally:
        worker.terminate()
        worker.wait(60)
        log.close()
    assert worker.returncode == 0, (tmp_path / "worker.log").read_text(errors="replace")[-3000:]
    assert list(home.iterdir()) and _memory_files(lance)
    assert _open_to_others(home) == [] and _open_to_others(lance) == []


def test_private_by_default_only_narrows_the_umask() -> None:
    before = os.umask(0o027)
    try:
        private_by_default()
        assert os.umask(0o022) == 0o077
        os.umask(0o177)
        private_by_default()
        assert os.umask(0o022) == 0o177
    finally:
        os.umask(before)
