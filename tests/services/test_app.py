"""The worker's Faust app: its internal topics exist, and are visible, before its
consumer first joins, so the first assignment includes them."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from memstream.services.app import MemstreamApp, build_app
from memstream.services.reflection.agent import state_topics, work_topic_name
from memstream.settings.model import Settings
from memstream.streams.admin import topic_partitions
from memstream.streams.topics import Topics


@pytest.fixture
def reflector_only(fresh_topics: Topics, settings_for: Callable[..., Settings]) -> tuple[Settings, MemstreamApp]:
    """A worker app of private topics running the reflector alone (not started)."""
    settings = settings_for(fresh_topics)
    return settings, build_app(settings, services=["reflector"])


@pytest.mark.kafka
async def test_internal_topics_are_the_reflectors_state(reflector_only: tuple[Settings, MemstreamApp]) -> None:
    settings, app = reflector_only
    names = sorted(name for topic in app.internal_topics() for name in topic.topics)
    assert names == sorted(state_topics(settings))


@pytest.mark.kafka
async def test_declared_topics_are_listed_before_the_app_subscribes(
    reflector_only: tuple[Settings, MemstreamApp], fresh_topics: Topics, kafka_bootstrap: str
) -> None:
    settings, app = reflector_only
    assert await topic_partitions(kafka_bootstrap, state_topics(settings)) == {}
    try:
        await app.declare_internal_topics()
        visible = await topic_partitions(kafka_bootstrap, state_topics(settings))
    finally:
        await app.producer.stop()
    expected = list(range(fresh_topics.partitions))
    assert visible == {name: expected for name in state_topics(settings)}


@pytest.mark.kafka
async def test_the_first_assignment_includes_the_work_topic(reflector_only: tuple[Settings, MemstreamApp]) -> None:
    settings, app = reflector_only
    work = work_topic_name(settings)
    await app.start()
    try:
        deadline = time.monotonic() + 45
        while not any(tp.topic == work for tp in app.consumer.assignment()):
            assert time.monotonic() < deadline, f"{work} not assigned: {sorted(app.consumer.assignment())}"
            await app.sleep(0.2)
    finally:
        await app.stop()
