"""The Kafka client factories: each client carries the broker's security settings and
the caller's own options, and works against the real broker."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import NewTopic
from pydantic import SecretStr

from memstream.settings import BrokerSettings
from memstream.streams.clients import create_admin, create_consumer, create_producer
from memstream.streams.producers.kafka_producer import create_kafka_producer


def _sasl_broker() -> BrokerSettings:
    return BrokerSettings(
        bootstrap_servers="127.0.0.1:1",
        security_protocol="SASL_PLAINTEXT",
        username="svc",
        password=SecretStr("pw"),
        sasl_mechanism="SCRAM-SHA-256",
    )


async def test_every_client_carries_the_broker_security() -> None:
    """Built (not started) from SASL settings: every factory's client has them, not
    aiokafka's PLAINTEXT default, and keeps the caller's own options."""
    broker = _sasl_broker()
    consumer = create_consumer(broker, client_id="c", group_id="g", isolation_level="read_committed")
    admin = create_admin(broker, client_id="a")
    producer = create_producer(broker, client_id="p", acks="all")
    events = create_kafka_producer(broker, client_id="e")
    for client, client_id in (
        (consumer._client, "c"),
        (admin._client, "a"),
        (producer.client, "p"),
        (events.client, "e"),
    ):
        assert (client._security_protocol, client._sasl_mechanism) == ("SASL_PLAINTEXT", "SCRAM-SHA-256")
        assert (client._sasl_plain_username, client._sasl_plain_password) == ("svc", "pw")
        assert client._bootstrap_servers == "127.0.0.1:1"
        assert client._client_id == client_id
    assert consumer._group_id == "g"
    assert consumer._isolation_level == "read_committed"


async def test_a_caller_cannot_replace_the_security() -> None:
    """An option that would override the address or the security is refused, not
    silently taken."""
    broker = _sasl_broker()
    with pytest.raises(TypeError, match="security_protocol"):
        create_consumer(broker, client_id="c", security_protocol="PLAINTEXT")
    with pytest.raises(TypeError, match="sasl_plain_password"):
        create_producer(broker, client_id="p", sasl_plain_password="other")
    with pytest.raises(TypeError, match="sasl_mechanism"):
        create_admin(broker, client_id="a", sasl_mechanism="PLAIN")  # type: ignore[call-arg]


async def test_the_clients_work_against_the_broker(kafka_bootstrap: str, topic_prefix: str) -> None:
    """An admin creates a topic, a plain producer writes to it, a consumer reads it back."""
    broker = BrokerSettings(bootstrap_servers=kafka_bootstrap)
    topic = f"{topic_prefix}clients"
    admin = create_admin(broker, client_id="memstream-test")
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
        producer = create_producer(broker, client_id="memstream-test", acks="all")
        await producer.start()
        try:
            value = uuid.uuid4().bytes
            await producer.send_and_wait(topic, value, key=b"k")
        finally:
            await producer.stop()
        consumer = create_consumer(broker, topic, client_id="memstream-test", auto_offset_reset="earliest")
        await consumer.start()
        read: list[bytes | None] = []
        try:
            for _ in range(20):  # a bound, not a timing: the record is there before the first fetch
                batch = await consumer.getmany(timeout_ms=500)
                read.extend(r.value for r in batch.get(TopicPartition(topic, 0), []))
                if read:
                    break
        finally:
            await consumer.stop()
        assert read == [value]
    finally:
        await admin.delete_topics([topic])
        await admin.close()
