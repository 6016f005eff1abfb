"""Shared fixtures: the real Kafka broker and per-test topic prefixes.

The broker is the project's own (``memstream broker start``; `.ci/run` starts it). If
none answers at ``MEMSTREAM_BOOTSTRAP_SERVERS`` the session starts one itself, so a
plain ``pytest`` works on a fresh clone too.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from memstream.settings import Settings
from memstream.streams.broker import local
from memstream.streams.topics import Topics


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """The bootstrap address of a running broker (started here if none is running, and
    then stopped again when the session ends; a broker found running is left alone)."""
    settings = Settings()
    started = False
    if not local.bootstrap_reachable(settings.bootstrap_servers):
        if not local.is_local_bootstrap(settings):
            raise RuntimeError(
                f"no Kafka broker answers at MEMSTREAM_BOOTSTRAP_SERVERS={settings.bootstrap_servers}, "
                f"and the local broker would listen on 127.0.0.1:{settings.broker_port}; start that "
                "broker or unset MEMSTREAM_BOOTSTRAP_SERVERS"
            )
        started = local.start(settings).started
    yield settings.bootstrap_servers
    if started:
        local.stop(settings)


@pytest.fixture
def topic_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}."


@pytest.fixture
async def fresh_topics(kafka_bootstrap: str, topic_prefix: str) -> AsyncIterator[Topics]:
    """A private, freshly created topic set for one test."""
    from memstream.streams.admin import ensure_topics

    topics = Topics(prefix=topic_prefix, partitions=3, replication_factor=1)
    await ensure_topics(kafka_bootstrap, topics)
    yield topics


@pytest.fixture
def settings_for(kafka_bootstrap: str, tmp_path):  # type: ignore[no-untyped-def]
    """Build a Settings bound to the test broker, a private topic prefix and tmp dirs."""

    def make(topics: Topics, **overrides: object) -> Settings:
        base: dict[str, object] = {
            "bootstrap_servers": kafka_bootstrap,
            "topic_prefix": topics.prefix,
            "partitions": topics.partitions,
            "lance_dir": tmp_path / "lance",
            "home": tmp_path / "home",
            "app_id": f"app-{uuid.uuid4().hex[:8]}",
        }
        base.update(overrides)
        return Settings(**base)  # type: ignore[arg-type]

    return make


def run(coro):  # type: ignore[no-untyped-def]
    """Run a coroutine from sync test code."""
    return asyncio.run(coro)
