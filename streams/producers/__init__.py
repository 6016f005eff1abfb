"""Writing events to the log: the durable producer SDK with back-pressure
(``producer``), the aiokafka producer every writer is built from (``kafka_producer``)
and a blocking front for synchronous callers (``sync_producer``)."""

__all__: list[str] = []
