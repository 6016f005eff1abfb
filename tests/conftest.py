"""Shared fixtures: the real Kafka broker and per-test topic prefixes.

The broker is the project's own (``memstream broker start``; `.ci/run` starts it). If
none answers at ``MEMSTREAM_BROKER_BOOTSTRAP_SERVERS`` the session starts one itself, so a
plain ``pytest`` works on a fresh clone too.
"""

from __future__ import annotations

import asyncio
import os
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import settings as hypothesis_settings

from memstream.settings.model import Settings
from memstream.streams.broker import local
from memstream.streams.topics import Topics

# Property tests judge behaviour, not speed: on a shared 2-core machine one example can
# take longer than Hypothesis's default 200 ms deadline without anything being wrong.
hypothesis_settings.register_profile("memstream", deadline=None)
hypothesis_settings.load_profile("memstream")

# Sealing is on by default in the product. Most tests read the log's raw bytes to check
# the wire format, so they run on a plaintext log; the sealing tests (tests/sealing,
# tests/streams/sealing/test_keys.py, test_sealer.py, test_reseal.py, test_forget_e2e.py and
# the tests that pass ``sealing=True``) turn it on. Set MEMSTREAM_SECURITY_SEALING=true to run
# the whole suite sealed.
os.environ.setdefault("MEMSTREAM_SECURITY_SEALING", "false")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """The bootstrap address of a running broker (started here if none is running, and
    then stopped again when the session ends; a broker found running is left alone)."""
    settings = Settings()
    started = False
    if not local.bootstrap_reachable(settings.broker.bootstrap_servers):
        if not local.is_local_bootstrap(settings.broker):
            raise RuntimeError(
                f"no Kafka broker answers at MEMSTREAM_BROKER_BOOTSTRAP_SERVERS={settings.broker.bootstrap_servers}, "
                f"and the local broker would listen on 127.0.0.1:{settings.broker.port}; start that "
                "broker or unset MEMSTREAM_BROKER_BOOTSTRAP_SERVERS"
            )
        started = local.start(settings.local_broker).started
    yield settings.broker.bootstrap_servers
    if started:
        local.stop(settings.local_broker)


@pytest.fixture
def topic_prefix() -> Iterator[str]:
    """A private topic prefix for one test. Its topics (and the Faust topics of the
    app ids :func:`settings_for` handed out for it) are deleted after the test: a
    developer's long-running broker otherwise collects thousands of them and runs out
    of heap."""
    prefix = f"t{uuid.uuid4().hex[:10]}."
    yield prefix
    app_ids = _APP_IDS.pop(prefix, [])
    settings = Settings()
    if local.bootstrap_reachable(settings.broker.bootstrap_servers):
        asyncio.run(_delete_private_topics(settings.broker.bootstrap_servers, (prefix, *(f"{a}-" for a in app_ids))))


@pytest.fixture
async def fresh_topics(kafka_bootstrap: str, topic_prefix: str) -> AsyncIterator[Topics]:
    """A private, freshly created topic set for one test (deleted after it, see
    :func:`topic_prefix`)."""
    from memstream.streams.admin import ensure_topics

    topics = Topics(prefix=topic_prefix, partitions=3, replication_factor=1)
    await ensure_topics(kafka_bootstrap, topics)
    yield topics


_APP_IDS: dict[str, list[str]] = {}
"""Topic prefix -> app ids made for it by :func:`settings_for`."""


async def _delete_private_topics(bootstrap: str, owned: tuple[str, ...]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        names = [t for t in await admin.list_topics() if t.startswith(owned)]
        if names:
            await admin.delete_topics(names)
    except Exception as exc:  # noqa: BLE001 - clean-up only: never fails a test
        warnings.warn(f"could not delete the test topics under {owned[0]}: {exc}", stacklevel=1)
    finally:
        await admin.close()


@pytest.fixture
def settings_for(kafka_bootstrap: str, tmp_path):  # type: ignore[no-untyped-def]
    """Build a Settings bound to the test broker, a private topic prefix and tmp dirs."""

    def make(topics: Topics, **overrides: object) -> Settings:
        app_id = f"app-{uuid.uuid4().hex[:8]}"
        base: dict[str, object] = {
            "bootstrap_servers": kafka_bootstrap,
            "topic_prefix": topics.prefix,
            "partitions": topics.partitions,
            "lance_dir": tmp_path / "lance",
            "home": tmp_path / "home",
            "app_id": app_id,
        }
        base.update(overrides)
        _APP_IDS.setdefault(topics.prefix, []).append(str(base["app_id"]))
        return Settings(**base)  # type: ignore[arg-type]

    return make


def run(coro):  # type: ignore[no-untyped-def]
    """Run a coroutine from sync test code."""
    return asyncio.run(coro)
