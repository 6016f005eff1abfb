"""Kafka's admin API, in the two ways memstream uses it: idempotent topic creation
(``memstream topics create``, every worker start) and looking up the partitions of
existing topics (``memstream tail``, replay) without ever creating one by accident."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, for_code

from memstream.settings import BrokerSettings
from memstream.streams.connect import kafka_options
from memstream.streams.topics import Topics, TopicSpec

__all__ = ["ensure_topics", "topic_partitions", "TopicCreationError"]

_TOPIC_ALREADY_EXISTS = 36


class TopicCreationError(RuntimeError):
    """A topic could not be created (and does not exist)."""


def _connect(kafka: BrokerSettings | str) -> dict[str, Any]:
    """The broker settings (address and security), or a bare address of a PLAINTEXT broker."""
    return kafka_options(kafka) if isinstance(kafka, BrokerSettings) else {"bootstrap_servers": kafka}


async def ensure_topics(
    kafka: BrokerSettings | str, topics: Topics, *, extra: list[TopicSpec] | None = None
) -> dict[str, str]:
    """Create every topic of the catalogue that does not exist yet.

    Returns ``{name: "created" | "exists"}``. Safe to run any number of times and from
    several processes at once: "already exists" is success.
    """
    specs = topics.catalogue() + list(extra or [])
    options = _connect(kafka)
    admin = AIOKafkaAdminClient(**options, client_id="memstream-admin")
    try:
        await admin.start()
    except BaseException:
        await admin.close()
        raise
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        result = {s.name: "exists" for s in specs if s.name in existing}
        if missing:
            response = await admin.create_topics(
                [
                    NewTopic(
                        name=s.name,
                        num_partitions=s.partitions,
                        replication_factor=s.replication_factor,
                        topic_configs=dict(s.config),
                    )
                    for s in missing
                ]
            )
            for name, code, *rest in response.topic_errors:
                if code == 0:
                    result[name] = "created"
                elif code == _TOPIC_ALREADY_EXISTS:
                    result[name] = "exists"
                else:
                    message = rest[0] if rest else ""
                    raise TopicCreationError(
                        f"cannot create topic {name}: {for_code(code).__name__} {message or ''}".strip()
                    )
        return result
    except KafkaError as exc:
        raise TopicCreationError(f"cannot reach Kafka at {options['bootstrap_servers']}: {exc}") from exc
    finally:
        await admin.close()


async def topic_partitions(
    kafka: BrokerSettings | str, names: Sequence[str], *, client_id: str = "memstream-admin"
) -> dict[str, list[int]]:
    """The sorted partition ids of each topic of ``names`` that exists; a missing topic
    is absent from the answer.

    Existence is read from the full topic list first: a metadata request naming a
    missing topic makes a broker with ``auto.create.topics.enable`` create it, and a
    typo must not become a topic. Raises aiokafka's ``KafkaError`` (or ``OSError``)
    when the cluster cannot be reached.
    """
    admin = AIOKafkaAdminClient(**_connect(kafka), client_id=client_id)
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        wanted = [name for name in dict.fromkeys(names) if name in existing]
        described = await admin.describe_topics(wanted) if wanted else []
    finally:
        await admin.close()
    found: dict[str, list[int]] = {}
    for item in described:
        name = item.get("topic")
        if name in wanted and item.get("error_code") == 0 and item.get("partitions"):
            found[name] = sorted(p["partition"] for p in item["partitions"])
    return found
