"""The factories every memstream Kafka client is built with: a consumer, an admin
client and a plain producer, each given the broker's address and security
(:func:`~memstream.streams.connect.kafka_options`) so that no caller can forget the
SASL/TLS settings. The callers' own options (group, fetch sizes, isolation level,
offsets) pass through unchanged; one that tries to set the address or the security
itself fails at once (a ``TypeError`` naming the repeated keyword).

Event writers use :func:`~memstream.streams.producers.kafka_producer.create_kafka_producer`
(idempotent, memstream's partitioner), built on :func:`create_producer` here.
``KafkaConsumer``, ``KafkaProducer`` and ``KafkaAdmin`` name the client types for
annotations outside ``streams/``; building one goes through a factory.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from memstream.settings import BrokerSettings
from memstream.streams.connect import kafka_options

__all__ = [
    "KafkaAdmin",
    "KafkaConsumer",
    "KafkaProducer",
    "create_admin",
    "create_consumer",
    "create_producer",
]

KafkaConsumer: TypeAlias = AIOKafkaConsumer
KafkaProducer: TypeAlias = AIOKafkaProducer
KafkaAdmin: TypeAlias = AIOKafkaAdminClient


def create_consumer(
    broker: BrokerSettings,
    *topics: str,
    client_id: str,
    group_id: str | None = None,
    bootstrap_servers: str | None = None,
    **options: Any,
) -> AIOKafkaConsumer:
    """A consumer (not started) of ``topics`` (none: the caller assigns or subscribes)."""
    return AIOKafkaConsumer(
        *topics,
        **kafka_options(broker, bootstrap_servers=bootstrap_servers),
        client_id=client_id,
        group_id=group_id,
        **options,
    )


def create_admin(broker: BrokerSettings, *, client_id: str, bootstrap_servers: str | None = None) -> AIOKafkaAdminClient:
    """An admin client (not started)."""
    return AIOKafkaAdminClient(**kafka_options(broker, bootstrap_servers=bootstrap_servers), client_id=client_id)


def create_producer(
    broker: BrokerSettings, *, client_id: str, bootstrap_servers: str | None = None, **options: Any
) -> AIOKafkaProducer:
    """A plain producer (not started), for records that are not memstream events."""
    return AIOKafkaProducer(**kafka_options(broker, bootstrap_servers=bootstrap_servers), client_id=client_id, **options)
