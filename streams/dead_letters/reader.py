"""Reading the dead-letter topic for an operator: each letter with its reason opened.

With sealing on, a letter of a sealed record carries only its stage in plain; the full
reason and the original value are sealed under the subject's key
(:func:`memstream.streams.dead_letters.publisher.seal_dead_letter`). Whoever holds the master key
(the worker's host: ``MEMSTREAM_HOME/master.key`` or ``MEMSTREAM_SECURITY_MASTER_KEY``) opens
them here with the keyring; a forgotten subject's letters stay shut, and say so.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timezone

from aiokafka import AIOKafkaConsumer, TopicPartition

from memstream.sealing import Keyring, TamperedRecord, UnreadableRecord, is_sealed, open_sealed, sealed_header
from memstream.settings import BrokerSettings
from memstream.streams.admin import topic_partitions
from memstream.streams.connect import kafka_options
from memstream.streams.dead_letters.reasons import reason_code
from memstream.streams.dead_letters.publisher import HEADER_DLQ_SEALED_REASON, DeadLetter, NotADeadLetter, parse_dead_letter

__all__ = ["LetterFilter", "OpenedLetter", "open_letter", "read_letters"]

_POLL_MS = 1000


@dataclass(frozen=True)
class OpenedLetter:
    """One dead letter as an operator reads it."""

    offset: int
    timestamp_ms: int
    letter: DeadLetter
    reason: str
    """The full reason: opened when it was sealed and the key is held."""
    code: str
    team_id: str | None
    user_id: str | None
    value: bytes | None
    """The original value, opened when sealed and the key is held."""

    @property
    def when(self) -> datetime:
        return datetime.fromtimestamp(max(self.timestamp_ms, 0) / 1000, timezone.utc)

    @property
    def sealed(self) -> bool:
        return HEADER_DLQ_SEALED_REASON in dict(self.letter.original_headers)


@dataclass(frozen=True)
class LetterFilter:
    """Which letters to show; None matches anything."""

    source_topic: str | None = None
    team_id: str | None = None
    user_id: str | None = None
    stage: str | None = None
    code: str | None = None
    until_ms: int | None = None

    def __call__(self, item: OpenedLetter) -> bool:
        return (
            (self.source_topic is None or item.letter.source_topic == self.source_topic)
            and (self.team_id is None or item.team_id == self.team_id)
            and (self.user_id is None or item.user_id == self.user_id)
            and (self.stage is None or item.letter.stage == self.stage)
            and (self.code is None or item.code == self.code)
            and (self.until_ms is None or item.timestamp_ms <= self.until_ms)
        )


def _space(letter: DeadLetter) -> tuple[str | None, str | None]:
    """The memory space a letter belongs to: its sealed header, else its record key."""
    value = letter.original_value
    if is_sealed(value):
        try:
            header = sealed_header(value)  # type: ignore[arg-type]
            return header.team_id, header.user_id
        except TamperedRecord:
            pass
    team, sep, user = (letter.original_key or b"").decode("utf-8", "replace").partition("/")
    return (team, user) if sep and team else (None, None)


def _open(sealed: bytes, keyring: Keyring | None) -> tuple[bytes | None, str]:
    """The plaintext of a sealed part, or None and why it stays shut."""
    if keyring is None:
        return None, "no master key on this host"
    try:
        return open_sealed(sealed, keyring), ""
    except UnreadableRecord as exc:
        return None, "its subject was forgotten" if exc.forgotten else "its key is not in memstream.keys"
    except TamperedRecord as exc:
        return None, str(exc)


def open_letter(offset: int, timestamp_ms: int, letter: DeadLetter, keyring: Keyring | None) -> OpenedLetter:
    """``letter`` with its reason and value opened where they are sealed."""
    team, user = _space(letter)
    value = letter.original_value
    reason, code = letter.reason, None
    sealed_reason = dict(letter.original_headers).get(HEADER_DLQ_SEALED_REASON)
    if sealed_reason is not None:
        plain, why = _open(sealed_reason, keyring)
        if plain is None:
            reason, code = f"{letter.reason} (not opened: {why})", "sealed"
        else:
            reason = plain.decode("utf-8", "replace")
    if is_sealed(value):
        value, _ = _open(value, keyring)  # type: ignore[arg-type]
    return OpenedLetter(offset, timestamp_ms, letter, reason, code or reason_code(reason, letter.stage), team, user, value)


async def read_letters(
    broker: BrokerSettings, topic: str, keyring: Keyring | None, *, since_ms: int | None = None, offset: int | None = None
) -> AsyncIterator[OpenedLetter]:
    """Every dead letter of ``topic`` (from ``since_ms``, or exactly ``offset``) up to
    its end when the read began. Records that are not dead letters are skipped;
    ``LookupError`` when the topic does not exist."""
    parts = (await topic_partitions(broker, [topic], client_id="memstream-dead-letters")).get(topic)
    if not parts:
        raise LookupError(f"topic {topic} does not exist")
    consumer = AIOKafkaConsumer(
        **kafka_options(broker), client_id="memstream-dead-letters", group_id=None, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        end = await consumer.end_offsets(tps)
        begin = await consumer.beginning_offsets(tps)
        starts = dict(begin)
        if offset is not None:
            starts = {tp: max(begin[tp], min(offset, end[tp])) for tp in tps}
            end = {tp: min(end[tp], starts[tp] + 1) for tp in tps}
        elif since_ms is not None:
            found = await consumer.offsets_for_times({tp: since_ms for tp in tps})
            starts = {tp: (found[tp].offset if found.get(tp) is not None else end[tp]) for tp in tps}
        for tp in tps:
            consumer.seek(tp, starts[tp])
        todo = {tp for tp in tps if starts[tp] < end[tp]}
        while todo:
            polled = await consumer.getmany(*todo, timeout_ms=_POLL_MS)
            for tp, records in polled.items():
                for rec in records:
                    if rec.offset >= end[tp]:
                        break
                    try:
                        letter = parse_dead_letter(rec.key, rec.value, rec.headers)
                    except NotADeadLetter:
                        continue
                    yield open_letter(rec.offset, rec.timestamp, letter, keyring)
            for tp in list(todo):
                if await consumer.position(tp) >= end[tp]:
                    todo.discard(tp)
    finally:
        await consumer.stop()
