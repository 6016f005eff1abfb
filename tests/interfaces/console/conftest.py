"""The console tests' own running memstream: real broker, worker and API as
``memstream up`` runs them, with sealing on (the product's default; the rest of the
suite runs a plaintext log), so an operator's forget has keys to shred. Same banks
and keys as the interface tests' stack (``iface_stack.BANKS``)."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from tests.interfaces.iface_stack import BANKS, Stack, start_process, stop_process
from tests.support import free_port

from memstream.banks import create_key
from memstream.projections.store.lance_store import LanceStore
from memstream.settings.model import Settings, child_env
from memstream.streams.admin import ensure_topics
from memstream.streams.topics import Topics


@pytest.fixture(scope="session")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("console")
    (root / "banks.toml").write_text(BANKS, encoding="utf-8")
    port = free_port()
    settings = Settings(
        bootstrap_servers=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}.", partitions=3,
        lance_dir=root / "lance", home=root / "home", app_id=f"app-{uuid.uuid4().hex[:8]}",
        banks_file=root / "banks.toml", keys_file=root / "keys.toml", api_host="127.0.0.1", api_port=port,
        read_wait_max_s=20.0, projector_batch_seconds=0.05, reflection_poll_seconds=0.5, sealing=True,
    )
    asyncio.run(ensure_topics(kafka_bootstrap, Topics.from_settings(settings.broker)))
    LanceStore.from_settings(settings.storage, settings.embeddings.dim)  # the tables, before two processes open them
    keys = {name: create_key(settings, name)[0] for name in ("acme", "globex", "planner", "spy", "trustteam")}
    logs = root / "logs"
    logs.mkdir()
    s = Stack(settings=settings, env={**child_env(settings), "PYTHONUNBUFFERED": "1"},
              base_url=f"http://127.0.0.1:{port}", keys=keys, logs=logs)
    start_process(s, "worker", [sys.executable, "-m", "memstream.services.worker"])
    start_process(s, "api", [sys.executable, "-m", "memstream", "api"])
    try:
        deadline = time.monotonic() + 240  # a readiness bound on a loaded machine, not a speed check
        while True:
            if s.processes["api"].poll() is not None:
                pytest.fail(f"the API server exited:\n{s.log_tail('api')}")
            try:
                if httpx.get(f"{s.base_url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the API server did not become healthy:\n{s.log_tail('api')}")
            time.sleep(0.3)
        yield s
    finally:
        for p in reversed(list(s.processes.values())):
            stop_process(p)
