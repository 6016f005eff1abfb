"""Idempotent topic creation with Kafka's admin API (``memstream topics create``)."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, for_code

from memstream.streams.topics import Topics, TopicSpec

__all__ = ["ensure_topics", "TopicCreationError"]

_TOPIC_ALREADY_EXISTS = 36


class TopicCreationError(RuntimeError):
    """A topic could not be created (and does not exist)."""


async def ensure_topics(
    bootstrap_servers: str, topics: Topics, *, extra: list[TopicSpec] | None = None
) -> dict[str, str]:
    """Create every topic of the catalogue that does not exist yet.

    Returns ``{name: "created" | "exists"}``. Safe to run any number of times and from
    several processes at once: "already exists" is success.
    """
    specs = topics.catalogue() + list(extra or [])
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, client_id="memstream-admin")
    await admin.start()
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
        raise TopicCreationError(f"cannot reach Kafka at {bootstrap_servers}: {exc}") from exc
    finally:
        await admin.close()
