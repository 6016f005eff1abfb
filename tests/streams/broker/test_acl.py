"""The local broker's ACL mode on a real broker: Kafka itself refuses a producer
principal on the log and the key topic, lets it write the ingress, lets the worker
principal write everything it needs, and a write through the ingress made as the API
makes it in ACL mode is sealed and projected by a worker running as the worker principal.

One SASL + StandardAuthorizer broker is started for the module on free ports (data
under a temporary home), next to the session's broker."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError
from aiokafka.structs import TopicPartition

from memstream.cli.serve import api_settings
from memstream.domain.events import MemoryAdded, Scope
from memstream.projections.store.lance_store import LanceStore
from memstream.settings.model import Settings, child_env
from memstream.streams.admin import ensure_topics
from memstream.streams.broker import acl, local
from memstream.streams.connect import kafka_options
from memstream.streams.producers.kafka_producer import create_kafka_producer
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.topics import Topics
from memstream.codec.wire import encode_event
from tests.streams.broker.helpers import broker_settings
from tests.interfaces.iface_stack import stop_process

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def acl_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A running ACL-mode broker; its settings act as the worker principal."""
    root = tmp_path_factory.mktemp("acl")
    settings = broker_settings(
        root, broker_acl=True, topic_prefix="acl.", app_id="aclapp", lance_dir=root / "lance",
        embedder="local", sealing=True, projector_batch_seconds=0.05,
    )
    status = local.start(settings.local_broker)
    try:
        assert status.acl and status.running
        asyncio.run(ensure_topics(settings.broker, Topics.from_settings(settings.broker)))  # as the worker
        yield settings
    finally:
        local.stop(settings.local_broker)


def as_principal(settings: Settings, principal: str) -> Settings:
    return settings.model_copy(
        update={"kafka_username": principal, "kafka_password_file": acl.password_file(settings.credentials_dir, principal)}
    )


async def _write(settings: Settings, topic: str, *, idempotent: bool = True) -> int:
    """One record to ``topic``; its offset (raises what the broker answered)."""
    if idempotent:
        producer = create_kafka_producer(settings.broker, client_id="acl-test")
    else:  # a principal without IdempotentWrite: a plain producer reaches the topic check
        producer = AIOKafkaProducer(**kafka_options(settings.broker), client_id="acl-test", acks=1)
    await producer.start()
    try:
        return (await asyncio.wait_for(producer.send_and_wait(topic, b"{}", key=b"acme/alice"), 30)).offset
    finally:
        await producer.stop()


def test_the_broker_files_hold_the_secrets_privately(acl_settings: Settings) -> None:
    folder = acl_settings.credentials_dir
    assert folder.stat().st_mode & 0o777 == 0o700
    for principal in acl.PRINCIPALS:
        assert acl.password_file(acl_settings.credentials_dir, principal).stat().st_mode & 0o777 == 0o600
    config = local.BrokerPaths.at(acl_settings.resolved_broker_dir).config_file
    assert config.stat().st_mode & 0o777 == 0o600
    assert "StandardAuthorizer" in config.read_text()


async def test_a_producer_principal_is_refused_on_events_and_keys_and_writes_the_ingress(acl_settings: Settings) -> None:
    producer = as_principal(acl_settings, acl.PRODUCER)
    topics = Topics.from_settings(acl_settings.broker)
    for forbidden in (topics.events, topics.keys, topics.messages, topics.pending_reflections, topics.outcomes):
        with pytest.raises(TopicAuthorizationFailedError):
            await _write(producer, forbidden)
    event = MemoryAdded(scope=Scope(team_id="acme", user_id="alice"), memory_id="m-ingress", content="ingress only")
    record = encode_event(event)
    client = create_kafka_producer(producer.broker, client_id="acl-test")
    await client.start()
    try:
        sent = await client.send_and_wait(topics.ingress, record.value, key=record.key, headers=record.headers)
    finally:
        await client.stop()
    assert sent.topic == topics.ingress and sent.offset >= 0


async def test_the_worker_principal_writes_the_log_keys_and_its_own_topics(acl_settings: Settings) -> None:
    # a scratch topic set under the worker's prefix (created by the worker itself), so
    # a test record on a key topic never reaches the module's worker
    scratch = Topics(prefix=f"acl.scratch{uuid.uuid4().hex[:6]}.", partitions=1)
    await ensure_topics(acl_settings.broker, scratch)
    for topic in (scratch.events, scratch.keys, scratch.pending_reflections, scratch.ingress):
        assert await _write(acl_settings, topic) == 0
    # a producer principal may not write even the scratch ingress: its grant is literal
    with pytest.raises(TopicAuthorizationFailedError):
        await _write(as_principal(acl_settings, acl.PRODUCER), scratch.ingress)


async def _read_from_start(settings: Settings, topic: str, partitions: int) -> int:
    """How many records ``settings``' principal gets from ``topic`` (an unauthorized
    topic yields none: aiokafka logs the refusal and returns nothing)."""
    consumer = AIOKafkaConsumer(**kafka_options(settings.broker), group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        await consumer.seek_to_beginning()
        seen = 0
        for _ in range(6):
            seen += sum(len(batch) for batch in (await consumer.getmany(timeout_ms=500)).values())
        return seen
    finally:
        await consumer.stop()


async def test_a_reader_reads_the_sealed_log_only(acl_settings: Settings) -> None:
    reader = as_principal(acl_settings, acl.READER)
    topics = Topics.from_settings(acl_settings.broker)
    with pytest.raises(TopicAuthorizationFailedError):
        await _write(reader, topics.ingress, idempotent=False)
    await _write(acl_settings, topics.events)  # the worker writes one record to each
    await _write(acl_settings, topics.ingress)
    partitions = acl_settings.broker.partitions
    assert await _read_from_start(reader, topics.events, partitions) >= 1
    assert await _read_from_start(acl_settings, topics.ingress, partitions) >= 1
    assert await _read_from_start(reader, topics.ingress, partitions) == 0  # plaintext: not for readers


async def test_a_wrong_password_or_no_login_gets_nothing(acl_settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    wrong = acl_settings.model_copy(update={"kafka_password_file": None, "kafka_password": SecretStr("not-the-password")})
    producer = AIOKafkaProducer(**kafka_options(wrong.broker), client_id="acl-test", request_timeout_ms=5000)
    with pytest.raises(KafkaConnectionError):
        await producer.start()
    await producer.stop()
    assert "Invalid username or password" in caplog.text  # the broker's SaslAuthenticationFailed
    # no login at all: the listener speaks SASL only
    anonymous = AIOKafkaProducer(bootstrap_servers=acl_settings.broker.bootstrap_servers, request_timeout_ms=5000)
    with pytest.raises(KafkaConnectionError):
        await anonymous.start()
    await anonymous.stop()
    assert local.probe_metadata(acl_settings.broker.port) is None  # unauthenticated probe: nothing


def test_a_write_through_the_ingress_as_the_api_makes_it_is_projected(acl_settings: Settings, tmp_path: Path) -> None:
    """The API's ACL-mode settings (producer principal, ingress only, no master key) and
    a worker subprocess as the worker principal: the memory reaches the view."""
    LanceStore.from_settings(acl_settings.storage, acl_settings.embeddings.dim)  # tables created before the worker opens them
    log_file = tmp_path / "worker.log"
    with open(log_file, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "memstream.services.worker"],
            env={**child_env(acl_settings), "PYTHONUNBUFFERED": "1"}, stdout=out, stderr=out,
        )
    try:
        api = api_settings(acl_settings)
        assert api.kafka_username == acl.PRODUCER and api.produce_via_ingress
        scope = Scope(team_id="acme", user_id="ana")
        content = f"Ana prefers answers under ACLs {uuid.uuid4().hex[:6]}"

        async def write() -> str:
            async with MemstreamProducer(api.streams, client_id="acl-api") as producer:
                sent = await producer.add_memory(scope, content, memory_type="persona")
            assert sent.position.topic == Topics.from_settings(acl_settings.broker).ingress
            return sent.event.memory_id

        memory_id = asyncio.run(write())
        store = LanceStore.from_settings(acl_settings.storage, acl_settings.embeddings.dim, read_consistency_interval=timedelta(0))
        # a readiness bound for a worker starting on a loaded machine, not a speed check
        deadline = time.monotonic() + 240
        while (row := store.get_memory(scope, memory_id)) is None:
            assert worker.poll() is None, log_file.read_text()[-3000:]
            assert time.monotonic() < deadline, f"not projected:\n{log_file.read_text()[-3000:]}"
            time.sleep(0.5)
        assert row["content"] == content
    finally:
        assert stop_process(worker) == 0, log_file.read_text()[-3000:]
