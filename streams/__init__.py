"""Kafka: topics, the serializer, the producer SDK, consumers and dead letters, the Faust app."""

__all__: list[str] = []
