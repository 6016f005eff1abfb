"""The shared keyring on Kafka: every worker and API node follows ``memstream.keys``.

A node reads the compacted key topic from the beginning at start (so it knows every
subject's key), then follows it live: a key another node creates arrives within a
poll, a tombstone drops the key at once. The master key is resolved here, after the
topic was read: a missing master key file is created only when no wrapped key exists
yet, so a lost master key is a one-line error at start, never a second master key
(whose data would be readable while the old subjects' would not) and never plaintext.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from memstream.streams.log_ids import log_id
from memstream.sealing import (
    AesGcmKeyWrapper,
    DataKey,
    Keyring,
    MasterKeyError,
    Subject,
    decode_master_key,
    is_sealed,
    new_master_key,
    read_master_key_file,
    sealed_kid,
    write_master_key_file,
)
from memstream.sealing.keyring import ROLL_KEY
from memstream.settings import StreamsConfig
from memstream.streams.sealing.key_records import forget_order, forgotten_keys, key_record_signed_or_trusted, refuse_key_record
from memstream.streams.trust.legacy_trust import LegacyTrustError, load_legacy_trust, trusted_before
from memstream.streams.topics import Topics
from memstream.streams.trust.worker_identity import HEADER as SIGNATURE_HEADER, key_record_signature, worker_key
from memstream.streams.connect import kafka_options
from memstream.streams.lifecycle import StartStop

__all__ = ["SubjectKeys", "LazyKeys", "MasterKeyError", "forgotten_keys"]

log = logging.getLogger(__name__)

_POLL_MS = 200


def tombstoned_subject(key: bytes | None) -> Subject | None:
    """The subject a key-topic tombstone drops a key of (None for anything else)."""
    try:
        team, user, _ = json.loads(key or b"")
    except (ValueError, TypeError):
        return None
    return Subject(team, user) if isinstance(team, str) and isinstance(user, str) else None


def _master_key(streams: StreamsConfig, keys_exist: bool) -> bytes:
    if streams.security.master_key is not None:
        return decode_master_key(streams.security.master_key.get_secret_value(), source="MEMSTREAM_SECURITY_MASTER_KEY")
    path = streams.master_key_file
    found = read_master_key_file(path)
    if found is not None:
        return found
    if keys_exist:
        raise MasterKeyError(
            f"master key lost: {path} does not exist and MEMSTREAM_SECURITY_MASTER_KEY is unset, but "
            "memstream.keys holds wrapped data keys; restore the master key (refusing to start)"
        )
    return write_master_key_file(path, new_master_key())


class SubjectKeys(StartStop):
    """This node's keyring, following the key topic; creates and forgets keys."""

    def __init__(
        self, streams: StreamsConfig, topics: Topics | None = None, *, client_id: str = "memstream-keys", signing_key: bytes | None = None
    ) -> None:
        self._streams = streams
        self._signing_key = signing_key
        """The worker key: signs the key records this node writes, and is what a key
        record, a tombstone or a ``SubjectForgotten`` must be signed with to act."""
        self._trust: dict[tuple[str, int], int] = {}
        self._unsigned: set[bytes] = set()
        self._signed_keys: set[bytes] = set()
        """Record keys of key records taken in unsigned (they unwrapped: written before
        signatures, or by a master-key holder without the worker key)."""
        self._topics = topics or Topics.from_settings(streams.broker)
        self._tp = TopicPartition(self._topics.keys, 0)
        self._client_id = client_id
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._follow: asyncio.Task[None] | None = None
        self._roll: asyncio.Task[None] | None = None
        self._create_lock = asyncio.Lock()
        self.keyring: Keyring | None = None
        self._on_forget: list[Callable[[Subject], None]] = []
        self.forgotten_at: dict[Subject, int] = {}
        """When (the tombstone's Kafka timestamp, ms) each subject was last forgotten,
        as far as this node read the tombstones (they are compacted away after
        ``delete.retention.ms``)."""

    def on_forget(self, callback: Callable[[Subject], None]) -> None:
        """Call ``callback(subject)`` whenever this node drops a subject's last key (a
        tombstone read live, or a ``SubjectForgotten`` met in :meth:`prepare`): holders
        of the subject's plaintext drop it then."""
        self._on_forget.append(callback)

    def _dropped(self, subject: Subject) -> None:
        if self.keyring is not None and self.keyring.key_for(subject) is not None:
            return  # another key of the subject is still held
        for callback in self._on_forget:
            try:
                callback(subject)
            except Exception:
                log.exception("forget callback for %s failed", log_id(subject))

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> "SubjectKeys":
        consumer = AIOKafkaConsumer(
            **kafka_options(self._streams.broker),
            client_id=self._client_id,
            enable_auto_commit=False,
            group_id=None,
        )
        producer = AIOKafkaProducer(
            **kafka_options(self._streams.broker),
            client_id=self._client_id,
            enable_idempotence=True,
            acks="all",
        )
        if self._signing_key is None:
            self._signing_key = worker_key(self._streams.worker_key_file)
        try:
            self._trust = load_legacy_trust(self._streams.worker_key_file)
        except LegacyTrustError as exc:
            log.warning("key topic: no legacy trust (%s)", exc)
        try:
            await consumer.start()
            await producer.start()
        except BaseException:  # neither is left unclosed (aiokafka would complain at exit)
            await consumer.stop()
            await producer.stop()
            raise
        self._consumer, self._producer = consumer, producer
        try:
            consumer.assign([self._tp])
            await consumer.seek_to_beginning(self._tp)
            backlog = await self._read_to_end()
            exist = any(signed and key != ROLL_KEY and value is not None for key, value, signed, _ in backlog)
            self.keyring = Keyring(AesGcmKeyWrapper(_master_key(self._streams, exist)))
            for key, value, signed, timestamp in backlog:
                if self._apply(key, value, signed, at_start=True):
                    self._note_tombstone(key, value, timestamp)
        except BaseException:
            await self.stop()
            raise
        self._follow = asyncio.create_task(self._follow_live(), name="memstream-keys-follow")
        return self

    async def stop(self) -> None:
        for task in (self._follow, self._roll):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._follow = self._roll = None
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()
        self._consumer = self._producer = None


    # ------------------------------------------------------------------ reading
    async def _read_to_end(self) -> list[tuple[bytes | None, bytes | None, bool, int]]:
        """The key topic's records: key, value, whether signed (or trusted), timestamp."""
        assert self._consumer is not None
        end = (await self._consumer.end_offsets([self._tp]))[self._tp]
        records: list[tuple[bytes | None, bytes | None, bool, int]] = []
        while await self._consumer.position(self._tp) < end:
            polled = await self._consumer.getmany(self._tp, timeout_ms=_POLL_MS)
            records += [(r.key, r.value, self._signed(r), r.timestamp) for r in polled.get(self._tp, ())]
        return records

    def _signed(self, record: ConsumerRecord) -> bool:  # type: ignore[type-arg]
        trusted = trusted_before(self._trust, record.topic, record.partition, record.offset)
        return key_record_signed_or_trusted(self._signing_key, record.key, record.value, record.headers, trusted=trusted)

    def _apply(self, key: bytes | None, value: bytes | None, signed: bool, *, at_start: bool = False) -> bool:
        """Apply one key-topic record; False when it took no effect. Only a signed
        record wrapped by another master key stops a start (a real misconfiguration)."""
        assert self.keyring is not None
        if value is None and not signed and key not in self._unsigned:
            # an unsigned key record's own unsigned tombstone (a log from before
            # signatures) still forgets it: a signed key is never shredded so
            refuse_key_record(key, value, "an unsigned tombstone")
            return False
        try:
            self.keyring.apply(key, value)
        except MasterKeyError:
            if signed and at_start:
                raise
            refuse_key_record(key, value, "it does not unwrap under this node's master key")
            return False
        except Exception as exc:  # noqa: BLE001 - hostile bytes never stop a node
            if signed:
                log.error("a signed key record was not applied: %s", exc)
            else:
                refuse_key_record(key, value, f"not a key record ({type(exc).__name__})")
            return False
        if value is not None and key is not None:
            if signed:
                self._signed_keys.add(key)
                self._unsigned.discard(key)
            elif key not in self._signed_keys:  # an unsigned copy of a signed record stays signed
                self._unsigned.add(key)
        return True

    def _note_tombstone(self, key: bytes | None, value: bytes | None, timestamp: int) -> Subject | None:
        subject = tombstoned_subject(key) if value is None else None
        if subject is not None:
            self.forgotten_at[subject] = max(timestamp, self.forgotten_at.get(subject, timestamp))
        return subject

    async def _follow_live(self) -> None:
        assert self._consumer is not None and self.keyring is not None
        while True:
            polled = await self._consumer.getmany(self._tp, timeout_ms=_POLL_MS)
            for record in polled.get(self._tp, ()):
                if not self._apply(record.key, record.value, self._signed(record)):
                    continue
                if record.value is None:
                    self._schedule_roll()
                    subject = self._note_tombstone(record.key, record.value, record.timestamp)
                    if subject is not None:
                        self._dropped(subject)

    async def sync(self) -> None:
        """Return once every key record written before this call is in the keyring."""
        assert self._consumer is not None
        end = (await self._consumer.end_offsets([self._tp]))[self._tp]
        while await self._consumer.position(self._tp) < end:
            await asyncio.sleep(0.005)

    async def ensure_readable(self, values: Iterable[bytes | None]) -> None:
        """Catch up with the key topic when a sealed value names a key this node has
        not seen yet (created by another node a moment ago): after it, a key still
        missing is a forgotten one."""
        ring = self._ring()
        for value in values:
            if is_sealed(value):
                kid = sealed_kid(value)  # type: ignore[arg-type]
                if ring.by_kid(kid) is None and not ring.was_forgotten(kid):
                    await self.sync()
                    return

    async def prepare(self, records: Iterable[tuple[bytes | None, Sequence[tuple[str, bytes | None]] | None]]) -> None:
        """Make the keyring right for decoding ``records`` (value, headers) in one go:
        catch up on keys made elsewhere, and drop at once the keys a
        ``SubjectForgotten`` among them names, so that no record after it in the batch
        opens under a forgotten key even if the tombstones are still on their way."""
        records = list(records)
        await self.ensure_readable(value for value, _ in records)
        ring = self._ring()
        for value, headers in records:
            order = forget_order(value, headers, self._signing_key)  # verified first: nothing acts on a forgery
            if order is not None:
                subject, kids = order
                ring.forget_kids(subject, [kid for kid in kids if ring.subject_of(kid) in (None, subject)])
                self._dropped(subject)

    def _ring(self) -> Keyring:
        if self.keyring is None:
            raise RuntimeError("SubjectKeys used before start()")
        return self.keyring

    # ------------------------------------------------------------------ writing
    async def key_for(self, subject: Subject) -> DataKey:
        """The subject's data key, created and published (acknowledged by the broker
        before it is returned, so no event is ever sealed under an unpublished key)."""
        ring = self._ring()
        found = ring.key_for(subject)
        if found is not None:
            return found
        async with self._create_lock:
            found = ring.key_for(subject)
            if found is not None:
                return found
            data_key, key, value = ring.new_key(subject)
            try:
                await self._send(key, value)
            except BaseException:
                ring.forget_locally(subject)
                raise
            return data_key

    async def forget(self, team_id: str, user_id: str | None = None) -> list[Subject]:
        """Tombstone every key of one user's space, or of every user of a team; the
        subjects forgotten (none: nothing was known). Catches up first, so keys made
        elsewhere are forgotten too."""
        await self.sync()
        ring = self._ring()
        subjects = ring.subjects(team_id, user_id)
        for subject in subjects:
            for key in ring.record_keys(subject):
                await self._send(key, None)
            ring.forget_locally(subject)
            self._dropped(subject)
        if subjects:
            self._schedule_roll()
        return subjects

    async def _send(self, key: bytes, value: bytes | None) -> None:
        assert self._producer is not None and self._signing_key is not None
        headers = [(SIGNATURE_HEADER, key_record_signature(self._signing_key, key, value))]
        await (await self._producer.send(self._tp.topic, value=value, key=key, partition=0, headers=headers))

    def _schedule_roll(self) -> None:
        """Append a keep-alive record once the segment holding a tombstone is old enough
        to roll: only rolled segments are compacted (docs/security.md)."""
        if self._roll is None or self._roll.done():
            self._roll = asyncio.create_task(self._roll_later(), name="memstream-keys-roll")

    async def _roll_later(self) -> None:
        await asyncio.sleep(self._topics.keys_segment_ms / 1000 + 1)
        try:
            await self._send(ROLL_KEY, b"{}")
        except Exception:
            log.warning("could not append the key topic's roll record", exc_info=True)


class LazyKeys:
    """A keyring started on first use (for code that has no start hook of its own, such
    as Faust agents); None when sealing is off."""

    def __init__(self, streams: StreamsConfig, topics: Topics, *, client_id: str) -> None:
        self._streams = streams
        self._topics = topics
        self._client_id = client_id
        self._keys: SubjectKeys | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> SubjectKeys | None:
        if self._keys is None and self._streams.security.sealing:
            async with self._lock:
                if self._keys is None:
                    self._keys = await SubjectKeys(self._streams, self._topics, client_id=self._client_id).start()
        return self._keys

    async def stop(self) -> None:
        keys, self._keys = self._keys, None
        if keys is not None:
            await keys.stop()
