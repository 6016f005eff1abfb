"""The dead-letter path: records that cannot be used are kept, never dropped, never fatal.

A consumer that meets a record it cannot decode, validate or apply must not stop (one
poison record would halt every memory space on that partition) and must not silently
skip it (the log is the source of truth; a dropped event is lost memory). It publishes
the record to ``<prefix>dead-letter`` and goes on.

A dead-letter record is the *original record, unchanged*: same key, same value bytes,
same headers, so it can be inspected with any Kafka tool and re-published as is once
fixed. What went wrong is appended as headers (after the original ones):

==============================  ===============================================
``memstream-dlq-reason``        one line, e.g. ``not JSON: Expecting value ...``
``memstream-dlq-stage``         ``decode``, ``project``, ``extract``, ``reflect``...
``memstream-dlq-source-topic``  where the record was read
``memstream-dlq-source-partition``  (decimal)
``memstream-dlq-source-offset``     (decimal)
``memstream-dlq-null-key``      ``true`` when the original record had neither key
                                nor value (Kafka needs one of them; the dead
                                letter then carries an empty key)
==============================  ===============================================

The six headers are always written last and in this order, so :func:`parse_dead_letter`
finds them even if the original record itself carried ``memstream-dlq-*`` headers (a
dead letter that was re-published and failed again).

With sealing on, a dead letter never holds the plaintext of a sealed record
(:func:`seal_dead_letter`): the value is sealed again under the key it was sealed under, the
reason in plain names no content (the full reason rides sealed in the header
``memstream-dlq-sealed-reason``), so forgetting the subject shreds its dead letters too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError

from memstream.domain.log import LogPosition
from memstream.settings import StreamsConfig, get_settings
from memstream.streams.connect import until_started
from memstream.streams.producers.producer import create_kafka_producer
from memstream.codec.wire import EncodedRecord
from memstream.sealing import DataKey, SealedHeader, seal
from memstream.sealing.keyring import KID_BYTES
from memstream.streams.sealing.keys import LazyKeys, SubjectKeys
from memstream.streams.sealing.sealed_records import OPENED_HEADER, NotAnEvent, ingress_header
from memstream.streams.topics import Topics
from memstream.streams.trust.worker_identity import HEADER as SIGNATURE_HEADER
from memstream.streams.lifecycle import StartStop

__all__ = [
    "HEADER_DLQ_REASON",
    "HEADER_DLQ_STAGE",
    "HEADER_DLQ_SOURCE_TOPIC",
    "HEADER_DLQ_SOURCE_PARTITION",
    "HEADER_DLQ_SOURCE_OFFSET",
    "HEADER_DLQ_NULL_KEY",
    "DLQ_HEADERS",
    "MAX_REASON_CHARS",
    "DeadLetter",
    "NotADeadLetter",
    "dead_letter_record",
    "is_dead_letter",
    "parse_dead_letter",
    "DeadLetterPublisher",
    "HEADER_DLQ_SEALED_REASON",
    "seal_dead_letter",
]

log = logging.getLogger(__name__)

HEADER_DLQ_REASON = "memstream-dlq-reason"
HEADER_DLQ_STAGE = "memstream-dlq-stage"
HEADER_DLQ_SOURCE_TOPIC = "memstream-dlq-source-topic"
HEADER_DLQ_SOURCE_PARTITION = "memstream-dlq-source-partition"
HEADER_DLQ_SOURCE_OFFSET = "memstream-dlq-source-offset"
HEADER_DLQ_NULL_KEY = "memstream-dlq-null-key"
DLQ_HEADERS: tuple[str, ...] = (
    HEADER_DLQ_REASON,
    HEADER_DLQ_STAGE,
    HEADER_DLQ_SOURCE_TOPIC,
    HEADER_DLQ_SOURCE_PARTITION,
    HEADER_DLQ_SOURCE_OFFSET,
    HEADER_DLQ_NULL_KEY,
)

HEADER_DLQ_SEALED_REASON = "memstream-dlq-sealed-reason"
"""The full reason of a sealed dead letter, sealed like its value (open it with the
subject's key, as any sealed record)."""

MAX_REASON_CHARS = 2000
"""Reasons are cut to this length (headers travel with every fetch of the record)."""


class NotADeadLetter(ValueError):
    """A record that does not carry the dead-letter headers."""


@dataclass(frozen=True)
class DeadLetter:
    """A record that could not be used, where it came from, and why."""

    reason: str
    source_topic: str
    source_partition: int
    source_offset: int
    original_value: bytes | None
    original_key: bytes | None
    original_headers: tuple[tuple[str, bytes], ...] = ()
    stage: str = "decode"

    @property
    def source_position(self) -> LogPosition:
        return LogPosition(
            topic=self.source_topic, partition=self.source_partition, offset=self.source_offset
        )

    def __str__(self) -> str:
        return f"{self.source_topic}:{self.source_partition}:{self.source_offset} [{self.stage}] {self.reason}"


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_REASON_CHARS else line[: MAX_REASON_CHARS - 3] + "..."


def dead_letter_record(dl: DeadLetter) -> EncodedRecord:
    """The record to publish: the original key, value and headers, plus ours.

    ``EncodedRecord.value`` is typed ``bytes`` but holds ``None`` for a tombstone (the
    original value is kept exactly, absence included).
    """
    null_key = dl.original_key is None and dl.original_value is None
    headers = [(k, bytes(v) if v is not None else b"") for k, v in dl.original_headers]
    headers += [
        (HEADER_DLQ_REASON, _one_line(dl.reason).encode("utf-8")),
        (HEADER_DLQ_STAGE, dl.stage.encode("utf-8")),
        (HEADER_DLQ_SOURCE_TOPIC, dl.source_topic.encode("utf-8")),
        (HEADER_DLQ_SOURCE_PARTITION, str(dl.source_partition).encode("ascii")),
        (HEADER_DLQ_SOURCE_OFFSET, str(dl.source_offset).encode("ascii")),
        (HEADER_DLQ_NULL_KEY, b"true" if null_key else b"false"),
    ]
    key = b"" if null_key else dl.original_key
    return EncodedRecord(key=key, value=dl.original_value, headers=headers)  # type: ignore[arg-type,unused-ignore]


def is_dead_letter(headers: Sequence[tuple[str, bytes | None]] | None) -> bool:
    """Whether a record carries the dead-letter headers (as its last headers)."""
    tail = list(headers or ())[-len(DLQ_HEADERS) :]
    return [k for k, _ in tail] == list(DLQ_HEADERS)


def parse_dead_letter(
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] | None,
) -> DeadLetter:
    """Inverse of :func:`dead_letter_record`; raises :class:`NotADeadLetter`."""
    all_headers = list(headers or ())
    if not is_dead_letter(all_headers):
        raise NotADeadLetter("record has no memstream dead-letter headers")
    cut = len(all_headers) - len(DLQ_HEADERS)
    ours = {k: (v or b"").decode("utf-8", "replace") for k, v in all_headers[cut:]}
    try:
        partition = int(ours[HEADER_DLQ_SOURCE_PARTITION])
        offset = int(ours[HEADER_DLQ_SOURCE_OFFSET])
    except ValueError:
        raise NotADeadLetter("dead-letter source partition/offset headers are not integers") from None
    null_key = ours[HEADER_DLQ_NULL_KEY] == "true"
    return DeadLetter(
        reason=ours[HEADER_DLQ_REASON],
        stage=ours[HEADER_DLQ_STAGE],
        source_topic=ours[HEADER_DLQ_SOURCE_TOPIC],
        source_partition=partition,
        source_offset=offset,
        original_value=value,
        original_key=None if null_key else key,
        original_headers=tuple((k, v if v is not None else b"") for k, v in all_headers[:cut]),
    )


async def seal_dead_letter(dl: DeadLetter, keys: SubjectKeys) -> DeadLetter:
    """``dl`` as a sealed log may keep it in the dead-letter topic.

    A record that was sealed in the log (its reader opened it: ``OPENED_HEADER`` names
    the key) is sealed again under that same key, with the full reason sealed beside
    it and a plain reason naming only the stage; the worker signature (a keyed hash of
    the plaintext) is dropped. If that key is gone (forgotten meanwhile) the value is
    not kept: it is still at its source position, unreadable. Any other record (plain
    in the log, or sealed and never opened) passes unchanged."""
    kid = _opened_kid(dl.original_headers)
    if kid is None:
        return dl
    headers = tuple((k, v) for k, v in dl.original_headers if k not in (OPENED_HEADER, SIGNATURE_HEADER))
    plain_reason = f"{dl.stage} failed on a sealed record"
    key = await _held_key(keys, kid)
    value = dl.original_value
    if key is None or value is None:
        return replace(dl, original_value=None, original_headers=headers, reason=f"{plain_reason}; value not kept (its key is gone)")
    try:
        header = ingress_header(value)
    except NotAnEvent:
        header = SealedHeader("", "", 0, key.subject.team_id, key.subject.user_id, "")
    head = header.encode()
    return replace(
        dl,
        original_value=seal(value, head, key),
        original_headers=(*headers, (HEADER_DLQ_SEALED_REASON, seal(_one_line(dl.reason).encode("utf-8"), head, key))),
        reason=f"{plain_reason}; the reason is sealed in {HEADER_DLQ_SEALED_REASON}",
    )


def _opened_kid(headers: Sequence[tuple[str, bytes]]) -> bytes | None:
    """The key id a reader's ``OPENED_HEADER`` names; None unless exactly one names a
    well-formed id (the readers refuse records that bring their own, so any other
    shape is hostile bytes, kept as they are)."""
    found = [v for k, v in headers if k == OPENED_HEADER]
    if len(found) != 1:
        return None
    try:
        kid = bytes.fromhex(bytes(found[0] or b"").decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None
    return kid if len(kid) == KID_BYTES else None


async def _held_key(keys: SubjectKeys, kid: bytes) -> DataKey | None:
    ring = keys.keyring
    assert ring is not None
    if ring.by_kid(kid) is None and not ring.was_forgotten(kid):
        await keys.sync()  # made elsewhere a moment ago
    return ring.by_kid(kid)


class DeadLetterPublisher(StartStop):
    """Publishes dead letters durably (idempotent producer, ``acks=all``).

    Give it a running ``producer`` to share one connection (it is then not stopped
    here), or let it create and own one from ``streams``. :meth:`publish` returns only
    once the broker has the record: a consumer commits its input offsets after that,
    so a crash can duplicate a dead letter but never lose one.
    """

    def __init__(
        self,
        topic: str,
        *,
        streams: StreamsConfig | None = None,
        bootstrap_servers: str | None = None,
        producer: AIOKafkaProducer | None = None,
        client_id: str = "memstream-dead-letter",
    ) -> None:
        self.topic = topic
        self._streams = streams or get_settings().streams
        self._bootstrap = bootstrap_servers
        self._client_id = client_id
        self._producer = producer
        self._owned = producer is None
        self._started = producer is not None
        self._keys = LazyKeys(self._streams, Topics.from_settings(self._streams.broker), client_id=f"{client_id}-keys")
        """With sealing on, the keyring that seals dead letters, started at the first."""

    async def start(self) -> None:
        if self._started:
            return
        self._producer = await until_started(
            lambda: create_kafka_producer(
                self._streams.broker, bootstrap_servers=self._bootstrap, client_id=self._client_id
            ),
            f"dead-letter producer ({self.topic})",
        )
        self._started = True

    async def stop(self) -> None:
        await self._keys.stop()
        producer = self._producer
        if self._owned and producer is not None:
            self._producer, self._started = None, False
            await producer.stop()


    @property
    def producer(self) -> AIOKafkaProducer:
        """The started producer (shared by the projector's re-routing of misplaced records)."""
        if self._producer is None:
            raise RuntimeError("the dead-letter publisher is not started")
        return self._producer

    async def publish(self, dl: DeadLetter) -> LogPosition:
        """Publish one dead letter and wait for the broker's ack."""
        return (await self.publish_many([dl]))[0]

    async def publish_many(self, dls: Iterable[DeadLetter]) -> list[LogPosition]:
        """Publish dead letters (pipelined) and wait until all are acknowledged."""
        if not self._started:
            await self.start()
        producer = self._producer
        assert producer is not None
        futures = []
        keys = await self._keys.get()
        for dl in dls:
            if keys is not None:
                dl = await seal_dead_letter(dl, keys)
            log.warning("dead letter %s", dl)
            record = dead_letter_record(dl)
            try:
                fut = await producer.send(
                    self.topic, value=record.value, key=record.key, headers=record.headers
                )
            except MessageSizeTooLargeError:
                # The original fit the source topic but not with our headers added: keep
                # the evidence that it existed (position, reason, key) rather than block
                # the consumer forever on a record that can never be republished.
                size = len(dl.original_value or b"")
                slim = replace(
                    dl,
                    original_value=None,
                    reason=f"{dl.reason} (original value of {size} bytes too large to keep)",
                )
                record = dead_letter_record(slim)
                fut = await producer.send(
                    self.topic, value=record.value, key=record.key, headers=record.headers
                )
            futures.append(fut)
        positions = []
        for fut in futures:
            md = await fut
            positions.append(LogPosition(topic=md.topic, partition=md.partition, offset=md.offset))
        return positions
