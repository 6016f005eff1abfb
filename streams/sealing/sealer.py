"""The ingress sealer: plaintext from producers that cannot seal, sealed into the log.

kcat, Java or Go producers write events as plain JSON to ``memstream.ingress`` (finite
retention, docs/producers.md). The worker reads that topic in a consumer group, seals
each record under its subject's key and appends it, same key and headers, to the
kept-forever topic its type belongs to; only then are the ingress offsets committed.
A crash between the two re-seals a record (at least once): events are idempotent by
id in every projection. A record without the envelope needed to seal it (JSON with
``type``, ``event_id`` and ``scope.team_id``) goes to the dead-letter topic, which has
the same finite retention. Full validation happens where the log is read, as always.

Once the offsets are committed, the ingress records before them are deleted
(Kafka's DeleteRecords, at most every ``_DELETE_EVERY_S``): plaintext lives in the
ingress for the sealing lag, not for the topic's retention (docs/security.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord
from mode import Service

from memstream.settings import StreamsConfig
from memstream.streams.connect import kafka_options, until_started
from memstream.streams.dead_letters.publisher import DeadLetter, DeadLetterPublisher
from memstream.streams.records.inflation_bound import bound_inflation, refusal
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.records.codec import refused_letter, screen
from memstream.streams.trust.worker_identity import HEADER as SIGNATURE_HEADER
from memstream.streams.sealing.sealed_records import PLAIN_TYPES, NotAnEvent, ingress_header, seal_value
from memstream.streams.producers.kafka_producer import LINGER_MS
from memstream.sealing import Subject
from memstream.streams.topics import Topics, topic_for_type

__all__ = ["IngressSealer", "SealerService", "register_sealer"]

log = logging.getLogger(__name__)

_BATCH = 2000
_DELETE_EVERY_S = 1.0


class IngressSealer:
    """Seals ``memstream.ingress`` into the kept-forever topics; run as a task."""

    def __init__(self, streams: StreamsConfig, app_id: str, keys: SubjectKeys, topics: Topics | None = None) -> None:
        """``app_id``: the worker's (``worker.app_id``); the sealer's consumer group is named after it."""
        self._streams = streams
        self._group_id = f"{app_id}-sealer"
        self._keys = keys
        self._topics = topics or Topics.from_settings(streams.broker)
        self.sealed = 0
        self.dead_lettered = 0
        self._sealed_to: dict[TopicPartition, int] = {}
        self._deleted_to: dict[TopicPartition, int] = {}
        self._deleted_at = 0.0

    async def run(self, *, until_idle: bool = False) -> None:
        """Seal until cancelled (or, with ``until_idle``, until a poll finds nothing)."""
        broker = self._streams.broker
        bound_inflation()
        consumer = AIOKafkaConsumer(
            self._topics.ingress,
            **kafka_options(broker),
            group_id=self._group_id,
            client_id="memstream-sealer",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        producer = AIOKafkaProducer(
            **kafka_options(broker),
            client_id="memstream-sealer",
            enable_idempotence=True,
            acks="all",
            linger_ms=LINGER_MS,
            max_request_size=broker.max_request_bytes,
        )
        admin = AIOKafkaAdminClient(**kafka_options(broker), client_id="memstream-sealer-admin")
        await consumer.start()
        await producer.start()
        await admin.start()
        dead = DeadLetterPublisher(self._topics.dead_letter, streams=self._streams, producer=producer)
        try:
            while True:
                polled = await consumer.getmany(timeout_ms=500, max_records=_BATCH)
                records = [r for batch in polled.values() for r in batch]
                if not records:
                    await self._delete_sealed(admin, now=True)
                    if until_idle:
                        return
                    continue
                await self._seal_batch(records, producer, dead)
                await consumer.commit()
                for r in records:
                    tp = TopicPartition(r.topic, r.partition)
                    self._sealed_to[tp] = max(self._sealed_to.get(tp, 0), r.offset + 1)
                await self._delete_sealed(admin)
        finally:
            with contextlib.suppress(Exception):
                await admin.close()
            with contextlib.suppress(Exception):
                await producer.stop()
            await consumer.stop()

    async def _delete_sealed(self, admin: AIOKafkaAdminClient, now: bool = False) -> None:
        """Delete the ingress records below the committed offsets (sealed or dead-lettered:
        their plaintext has no further use here)."""
        todo = {tp: off for tp, off in self._sealed_to.items() if off > self._deleted_to.get(tp, 0)}
        if not todo or (not now and time.monotonic() - self._deleted_at < _DELETE_EVERY_S):
            return
        self._deleted_at = time.monotonic()
        try:
            await admin.delete_records({tp: RecordsToDelete(before_offset=off) for tp, off in todo.items()})
        except KafkaError as exc:  # retried with the next batch; retention still bounds it
            log.warning("deleting sealed ingress records failed (will retry): %s", exc)
            return
        self._deleted_to.update(todo)

    async def _seal_batch(
        self, records: list[ConsumerRecord], producer: AIOKafkaProducer, dead: DeadLetterPublisher  # type: ignore[type-arg]
    ) -> None:
        sends = []
        refused: list[DeadLetter] = []
        for r in records:
            inflation = refusal(r.value, r.headers)
            if inflation is not None:
                refused.append(DeadLetter(inflation, r.topic, r.partition, r.offset, None, r.key, tuple(r.headers or ()), "seal"))
                continue
            screened = screen(r.key, r.headers)  # the headers are copied into the log: refuse hostile ones here
            if screened is not None:
                refused.append(refused_letter(screened, r.topic, r.partition, r.offset, r.key, r.value, r.headers, "seal"))
                continue
            try:
                header = ingress_header(r.value)
                if header.type in PLAIN_TYPES:
                    raise NotAnEvent(f"{header.type} is written by `memstream forget`, not through the ingress")
            except NotAnEvent as exc:
                refused.append(
                    DeadLetter(str(exc), r.topic, r.partition, r.offset, r.value, r.key, tuple(r.headers or ()), "seal")
                )
                continue
            subject = Subject(header.team_id, header.user_id)
            if r.timestamp <= self._keys.forgotten_at.get(subject, -1):
                # written before its subject was forgotten: sealing it now would bring it
                # back under the subject's next key; kept for the topic's retention only
                refused.append(
                    DeadLetter(
                        f"written before {subject} was forgotten: not sealed", r.topic, r.partition, r.offset,
                        r.value, r.key, tuple(r.headers or ()), "seal",
                    )
                )
                continue
            key = await self._keys.key_for(subject)
            sealed = seal_value(key, header, r.value)
            target = topic_for_type(header.type, self._topics)
            record_key = f"{header.team_id}/{header.user_id}".encode("utf-8")
            # only the worker signs: a producer's signature header is not carried into the log
            headers = [h for h in r.headers or () if h[0] != SIGNATURE_HEADER]
            sends.append(await producer.send(target, value=sealed, key=record_key, headers=headers))
        if sends:
            await asyncio.gather(*sends)
        if refused:
            await dead.publish_many(refused)
        self.sealed += len(sends)
        self.dead_lettered += len(refused)


class SealerService(Service):
    """The sealer inside the worker (when sealing is on): its own keyring, and a task
    that stops the worker if sealing fails (a restart resumes from the committed
    ingress offsets)."""

    logger = logging.getLogger("memstream.faust")

    def __init__(self, app: Any, streams: StreamsConfig, app_id: str, topics: Topics) -> None:
        super().__init__()
        self.app = app
        self.streams = streams
        self.app_id = app_id
        self.topics = topics
        self._keys: SubjectKeys | None = None
        self._task: asyncio.Task[None] | None = None
        self.sealer: IngressSealer | None = None

    async def on_start(self) -> None:
        self._keys = await until_started(
            lambda: SubjectKeys(self.streams, self.topics, client_id=f"{self.app_id}-sealer-keys"), "sealer keyring"
        )
        self.sealer = IngressSealer(self.streams, self.app_id, self._keys, self.topics)
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        assert self.sealer is not None
        try:
            await self.sealer.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.critical("sealer failed; stopping the worker: %s: %s", type(exc).__name__, exc)
            await self.app.crash(exc)
            raise

    async def on_stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._keys is not None:
            await self._keys.stop()


def register_sealer(app: Any, streams: StreamsConfig, app_id: str, topics: Topics) -> None:
    """Add the ingress sealer to ``app`` (only with sealing on: without it the log is
    plaintext and producers write to it directly)."""
    if streams.security.sealing:
        app.service(SealerService(app, streams, app_id, topics))
