"""Kafka: topics, the serializer, the producer SDK, consumers and dead letters, the Faust app."""
