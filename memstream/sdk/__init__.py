"""The public SDK in one import: ``from memstream.sdk import MemstreamProducer, Scope``.

Agent fleets should not need to know the package layout (``memstream.streams``,
``memstream.domain``...): everything a producer or a simple consumer needs is
re-exported here, and this module's ``__all__`` is the supported surface.

Example::

    import asyncio
    from memstream.sdk import MemstreamProducer

    async def main() -> None:
        async with MemstreamProducer() as producer:        # MEMSTREAM_* settings
            sent = await producer.add_memory(
                {"team_id": "acme", "user_id": "ana"}, "Ana prefers short answers",
                memory_type="persona",
            )
            print(sent.event.memory_id, sent.position)      # durable once this returns

    asyncio.run(main())

Code without asyncio uses :class:`SyncProducer` the same way (``with SyncProducer() as p``).
"""

from __future__ import annotations

from memstream.domain.events import (
    DecisionExpired,
    DecisionRecorded,
    EmbeddingPayload,
    Entity,
    EventBase,
    EventValidationError,
    MemoryAdded,
    MemoryLinked,
    MemoryReflected,
    MemoryType,
    MessageObserved,
    OutcomeObserved,
    Provenance,
    Scope,
    parse_event,
)
from memstream.domain.log import LogPosition, PositionedEvent
from memstream.settings import Settings, get_settings
from memstream.streams.consumer import ConsumedBatch, EventConsumer, decode_or_dead_letter
from memstream.streams.dead_letters.publisher import DeadLetter, DeadLetterPublisher, parse_dead_letter
from memstream.streams.producers.producer import (
    MemstreamProducer,
    NotSentError,
    ProduceError,
    ProducerClosedError,
    Sent,
)
from memstream.streams.producers.sync_producer import SyncProducer
from memstream.codec.wire import (
    DecodeError,
    EncodedRecord,
    EncodeError,
    decode_record,
    encode_event,
    record_key,
)
from memstream.streams.topics import Topics, topic_for

__all__ = [
    # producing
    "MemstreamProducer",
    "SyncProducer",
    "Sent",
    "ProduceError",
    "NotSentError",
    "ProducerClosedError",
    # consuming
    "EventConsumer",
    "ConsumedBatch",
    "decode_or_dead_letter",
    "DeadLetter",
    "DeadLetterPublisher",
    "parse_dead_letter",
    # events
    "EventBase",
    "MessageObserved",
    "MemoryAdded",
    "MemoryLinked",
    "DecisionRecorded",
    "OutcomeObserved",
    "MemoryReflected",
    "DecisionExpired",
    "Scope",
    "MemoryType",
    "Entity",
    "EmbeddingPayload",
    "Provenance",
    "EventValidationError",
    "parse_event",
    # wire format and positions
    "EncodedRecord",
    "encode_event",
    "decode_record",
    "record_key",
    "DecodeError",
    "EncodeError",
    "LogPosition",
    "PositionedEvent",
    # configuration
    "Settings",
    "get_settings",
    "Topics",
    "topic_for",
]
