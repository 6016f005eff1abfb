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
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

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
from memstream.settings import Settings
from memstream.streams.topics import Topics
from memstream.streams.connect import kafka_options

__all__ = ["SubjectKeys", "LazyKeys", "master_key_path", "MasterKeyError", "forgotten_keys"]

log = logging.getLogger(__name__)

_POLL_MS = 200
_FORGOTTEN_TYPE = b"SubjectForgotten"


def forgotten_keys(value: bytes) -> tuple[Subject, list[bytes]] | None:
    """The subject and key ids a ``SubjectForgotten`` record names (None if unreadable:
    the decoder dead-letters it with the reason)."""
    try:
        body = json.loads(value)
        scope = body["scope"]
        return Subject(scope["team_id"], scope.get("user_id", "default")), [bytes.fromhex(k) for k in body.get("key_ids", ())]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def tombstoned_subject(key: bytes | None) -> Subject | None:
    """The subject a key-topic tombstone drops a key of (None for anything else)."""
    try:
        team, user, _ = json.loads(key or b"")
    except (ValueError, TypeError):
        return None
    return Subject(team, user) if isinstance(team, str) and isinstance(user, str) else None


def master_key_path(settings: Settings) -> Path:
    return settings.master_key_file or (settings.home / "master.key")


def _master_key(settings: Settings, keys_exist: bool) -> bytes:
    if settings.master_key is not None:
        return decode_master_key(settings.master_key.get_secret_value(), source="MEMSTREAM_MASTER_KEY")
    path = master_key_path(settings)
    found = read_master_key_file(path)
    if found is not None:
        return found
    if keys_exist:
        raise MasterKeyError(
            f"master key lost: {path} does not exist and MEMSTREAM_MASTER_KEY is unset, but "
            "memstream.keys holds wrapped data keys; restore the master key (refusing to start)"
        )
    return write_master_key_file(path, new_master_key())


class SubjectKeys:
    """This node's keyring, following the key topic; creates and forgets keys."""

    def __init__(self, settings: Settings, topics: Topics | None = None, *, client_id: str = "memstream-keys") -> None:
        self._settings = settings
        self._topics = topics or Topics.from_settings(settings)
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
                log.exception("forget callback for %s failed", subject)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> "SubjectKeys":
        consumer = AIOKafkaConsumer(
            **kafka_options(self._settings),
            client_id=self._client_id,
            enable_auto_commit=False,
            group_id=None,
        )
        producer = AIOKafkaProducer(
            **kafka_options(self._settings),
            client_id=self._client_id,
            enable_idempotence=True,
            acks="all",
        )
        await consumer.start()
        try:
            await producer.start()
        except BaseException:
            await consumer.stop()
            raise
        self._consumer, self._producer = consumer, producer
        try:
            consumer.assign([self._tp])
            await consumer.seek_to_beginning(self._tp)
            backlog = await self._read_to_end()
            exist = any(key != ROLL_KEY and value is not None for key, value in backlog)
            self.keyring = Keyring(AesGcmKeyWrapper(_master_key(self._settings, exist)))
            for key, value in backlog:
                self.keyring.apply(key, value)
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

    async def __aenter__(self) -> "SubjectKeys":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ reading
    async def _read_to_end(self) -> list[tuple[bytes | None, bytes | None]]:
        assert self._consumer is not None
        end = (await self._consumer.end_offsets([self._tp]))[self._tp]
        records: list[tuple[bytes | None, bytes | None]] = []
        while await self._consumer.position(self._tp) < end:
            polled = await self._consumer.getmany(self._tp, timeout_ms=_POLL_MS)
            for r in polled.get(self._tp, ()):
                records.append((r.key, r.value))
                self._note_tombstone(r.key, r.value, r.timestamp)
        return records

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
                try:
                    self.keyring.apply(record.key, record.value)
                except Exception:
                    log.exception("key record at offset %d not applied", record.offset)
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
            if value is None or is_sealed(value):
                continue
            if not any(k == "memstream-type" and v == _FORGOTTEN_TYPE for k, v in headers or ()):
                continue
            forgotten = forgotten_keys(value)
            if forgotten is not None:
                ring.forget_kids(*forgotten)
                self._dropped(forgotten[0])

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
        assert self._producer is not None
        await (await self._producer.send(self._tp.topic, value=value, key=key, partition=0))

    def _schedule_roll(self) -> None:
        """Append a keep-alive record once the segment holding a tombstone is old enough
        to roll: only rolled segments are compacted (docs/security.md)."""
        if self._roll is None or self._roll.done():
            self._roll = asyncio.create_task(self._roll_later(), name="memstream-keys-roll")

    async def _roll_later(self) -> None:
        await asyncio.sleep(self._settings.keys_segment_ms / 1000 + 1)
        try:
            await self._send(ROLL_KEY, b"{}")
        except Exception:
            log.warning("could not append the key topic's roll record", exc_info=True)


class LazyKeys:
    """A keyring started on first use (for code that has no start hook of its own, such
    as Faust agents); None when sealing is off."""

    def __init__(self, settings: Settings, topics: Topics, *, client_id: str) -> None:
        self._settings = settings
        self._topics = topics
        self._client_id = client_id
        self._keys: SubjectKeys | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> SubjectKeys | None:
        if self._keys is None and self._settings.sealing:
            async with self._lock:
                if self._keys is None:
                    self._keys = await SubjectKeys(self._settings, self._topics, client_id=self._client_id).start()
        return self._keys

    async def stop(self) -> None:
        keys, self._keys = self._keys, None
        if keys is not None:
            await keys.stop()
