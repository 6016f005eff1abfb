"""One running memstream for the interface tests: real broker, real worker, real API.

Session-scoped because a Faust worker and a uvicorn server take seconds to start;
tests stay independent by using their own bank (memory space) each. The worker and
the API run as subprocesses with the settings passed as ``MEMSTREAM_*`` variables,
exactly as ``memstream up`` runs them.
"""

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
from memstream.bench.openai_fake import OpenAICompatServer
from memstream.settings.model import Settings, child_env
from memstream.streams.admin import ensure_topics
from memstream.streams.topics import Topics


@pytest.fixture(scope="session")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("interfaces")
    (root / "banks.toml").write_text(BANKS, encoding="utf-8")
    port = free_port()
    rerank = OpenAICompatServer().start()  # the reranker searches may ask for (rerank=true)
    settings = Settings(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=f"t{uuid.uuid4().hex[:10]}.",
        partitions=3,
        lance_dir=root / "lance",
        home=root / "home",
        app_id=f"app-{uuid.uuid4().hex[:8]}",
        banks_file=root / "banks.toml",
        keys_file=root / "keys.toml",
        api_host="127.0.0.1",
        api_port=port,
        read_wait_max_s=20.0,
        api_max_body_bytes=256 * 1024,
        # the default embedder (all-MiniLM-L6-v2 on onnxruntime), as a fresh install runs it
        projector_batch_seconds=0.05,
        reflection_poll_seconds=0.5,
        rerank_url=rerank.base_url,
    )
    asyncio.run(ensure_topics(kafka_bootstrap, Topics.from_settings(settings.broker)))
    from memstream.projections.store.lance_store import LanceStore

    LanceStore.from_settings(settings.storage, settings.embeddings.dim)  # create the tables before two processes open them
    keys = {name: create_key(settings, name)[0] for name in ("alice", "acme", "bot", "globex", "carol", "dave", "erin", "frank", "planner", "spy", "trustteam")}
    env = {**child_env(settings), "PYTHONUNBUFFERED": "1"}
    logs = root / "logs"
    logs.mkdir()
    s = Stack(settings=settings, env=env, base_url=f"http://127.0.0.1:{port}", keys=keys, logs=logs, rerank=rerank)
    start_process(s, "worker", [sys.executable, "-m", "memstream.services.worker"])
    start_process(s, "api", [sys.executable, "-m", "memstream", "api"])
    try:
        # a readiness bound, not a speed check: two processes importing the whole stack
        # on a loaded 2-core CI machine took 80 s to come up (niced, load 12)
        deadline = time.monotonic() + 240
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
        rerank.stop()
        codes = {name: stop_process(p) for name, p in reversed(list(s.processes.items()))}
        # Both stop cleanly on SIGTERM: Faust exits 0; uvicorn finishes its shutdown
        # (lifespan: producer flushed, MCP sessions closed), then re-raises the signal.
        assert codes["worker"] == 0, s.log_tail("worker")
        assert codes["api"] in (0, -15), s.log_tail("api")
        assert "Application shutdown complete" in s.log_tail("api", 400), s.log_tail("api")
