"""Kafka records to decoded batches: the projector's read side, before anything is
written (decoding, dead letters for what is not a valid event, misrouted records set
apart)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from memstream.codec.batch import PositionedMemories
from memstream.domain.access import memory_content_problem
from memstream.domain.log import PositionedEvent
from memstream.streams.records.codec import decode_or_dead_letter, refused_letter, screen
from memstream.streams.dead_letters.publisher import DeadLetter
from memstream.streams.trust.legacy_trust import LegacyTrust
from memstream.streams.rerouting import home_partition, is_misrouted
from memstream.codec.wire import header_value
from memstream.streams.trust.worker_identity import HEADER as WORKER_HEADER, verifier

if TYPE_CHECKING:
    from memstream.codec.fast_decode import FastMemoryDecoder

__all__ = ["RawRecord", "DecodedBatch", "decode_batch", "project_dead_letters"]


class RawRecord(NamedTuple):
    """A record as read from Kafka, before decoding (the same for Faust and aiokafka).
    A named tuple: one is built per record read, and a tuple builds fastest."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    refused: str | None = None
    """Set by the reader before decoding: why the record is refused (a dead letter),
    or empty for a record sealed under a forgotten key (skipped)."""


@dataclass(frozen=True)
class DecodedBatch:
    """One batch after decoding: the events (read order), the dead letters, and the
    ``MemoryAdded`` events the fast read path decoded (columnar, apart)."""

    events: list[PositionedEvent]
    dead: list[DeadLetter]
    next_offsets: dict[tuple[str, int], int]
    """Per partition, the offset after the batch's last record (dead letters included)."""
    memories: PositionedMemories | None = None
    misrouted: list[tuple[RawRecord, int]] = field(default_factory=list)
    """Records on another partition than their key's, with that partition: not
    decoded here, re-published there (:mod:`memstream.streams.rerouting`)."""

    def covered(self) -> dict[tuple[str, int], int]:
        """Per partition, the offset after the last *event* (fast or not)."""
        out: dict[tuple[str, int], int] = {}
        for item in self.events:
            key = (item.position.topic, item.position.partition)
            out[key] = max(out.get(key, 0), item.position.offset + 1)
        for topic, partition, offset in self.memories.positions if self.memories else ():
            key = (topic, partition)
            out[key] = max(out.get(key, 0), offset + 1)
        return out


def decode_batch(
    records: Sequence[RawRecord],
    fast: "FastMemoryDecoder | None" = None,
    partition_counts: Mapping[str, int] | None = None,
    worker_key: bytes | None = None,
    legacy_trust: LegacyTrust | None = None,
    screened: bool = False,
) -> DecodedBatch:
    """Decode records (pure CPU work: call it off the event loop for big batches).

    With ``fast``, canonical ``MemoryAdded`` records carrying a vector of its model, or
    none, take the fast read path (:mod:`memstream.codec.fast_decode`) and come out
    columnar in ``memories``; every other record, and any the fast path is unsure
    of, takes the general path (which dead-letters what is invalid). With
    ``partition_counts`` (topic -> partitions), a keyed record on another partition
    than its key's is set apart in ``misrouted``, not decoded. With
    ``worker_key``, a system event whose record does not carry the worker's signature
    is a dead letter (:mod:`memstream.streams.trust.worker_identity`; a key, not a closure,
    so that a decoder process can receive it). A record the reader refused (``refused``:
    empty for one sealed under a forgotten key, which is passed) is a dead letter; any
    other is screened first (:func:`memstream.streams.records.codec.screen`) unless
    ``screened`` (the feed screened the raw records before opening them). ``legacy_trust``: where the unsigned system
    events the operator trusts end (:mod:`memstream.streams.trust.legacy_trust`)."""
    trusted = verifier(worker_key) if worker_key is not None else None
    events: list[PositionedEvent] = []
    dead: list[DeadLetter] = []
    next_offsets: dict[tuple[str, int], int] = {}
    quick: list[RawRecord] = []
    quick_fields = []
    general: list[RawRecord] = []
    misrouted: list[tuple[RawRecord, int]] = []
    for rec in records:
        if partition_counts is not None and is_misrouted(rec.key, rec.partition, partition_counts.get(rec.topic)):
            assert rec.key is not None
            misrouted.append((rec, home_partition(rec.key, partition_counts[rec.topic])))
            key = (rec.topic, rec.partition)
            next_offsets[key] = max(next_offsets.get(key, 0), rec.offset + 1)
            continue
        refused = rec.refused if screened or rec.refused is not None else screen(rec.key, rec.headers)
        if refused is not None:
            key = (rec.topic, rec.partition)
            next_offsets[key] = max(next_offsets.get(key, 0), rec.offset + 1)
            if refused:
                dead.append(refused_letter(refused, rec.topic, rec.partition, rec.offset, rec.key, rec.value, rec.headers))
            continue
        signed = trusted is not None and header_value(rec.headers, WORKER_HEADER) is not None and trusted(rec.value, rec.headers)
        got = fast.decode(rec.value, rec.headers, trusted=signed or trusted is None) if fast is not None else None
        if got is not None and not signed and trusted is not None and memory_content_problem(got.values.content, got.values.scene, got.values.metadata) is not None:
            got = None  # the general path dead-letters it, with the reason
        if got is None:
            general.append(rec)
        else:
            quick.append(rec)
            quick_fields.append(got)
        key = (rec.topic, rec.partition)
        next_offsets[key] = max(next_offsets.get(key, 0), rec.offset + 1)
    memories: PositionedMemories | None = None
    if fast is not None and quick:
        vectors, finite = fast.vectors(quick_fields)
        if not finite.all():  # the model refuses these: let the general path say why
            general.extend(rec for rec, ok in zip(quick, finite) if not ok)
            keep = [i for i, ok in enumerate(finite) if ok]
            quick = [quick[i] for i in keep]
            quick_fields = [quick_fields[i] for i in keep]
            vectors = vectors[finite]
        if quick:
            memories = PositionedMemories(
                model=fast.model,
                positions=[(r.topic, r.partition, r.offset) for r in quick],
                fields=[f.values for f in quick_fields],
                vectors=vectors,
                unembedded=[i for i, f in enumerate(quick_fields) if not f.vector],
            )
    for rec in general:
        item = decode_or_dead_letter(
            rec.topic, rec.partition, rec.offset, rec.key, rec.value, rec.headers, trusted=trusted,
            legacy_trust=legacy_trust,
        )
        if isinstance(item, DeadLetter):
            dead.append(item)
        else:
            events.append(item)
    return DecodedBatch(events=events, dead=dead, next_offsets=next_offsets, memories=memories, misrouted=misrouted)


def project_dead_letters(
    failed: Sequence[tuple[PositionedEvent, str]], records: Sequence[RawRecord]
) -> list[DeadLetter]:
    """Dead letters (stage ``project``) for events the projector refused, carrying the
    original record bytes."""
    if not failed:
        return []
    by_position = {(r.topic, r.partition, r.offset): r for r in records}
    out: list[DeadLetter] = []
    for item, reason in failed:
        pos = item.position
        rec = by_position.get((pos.topic, pos.partition, pos.offset))
        out.append(
            DeadLetter(
                reason=reason,
                source_topic=pos.topic,
                source_partition=pos.partition,
                source_offset=pos.offset,
                original_value=rec.value if rec else None,
                original_key=rec.key if rec else None,
                original_headers=tuple((k, v if v is not None else b"") for k, v in rec.headers) if rec else (),
                stage="project",
            )
        )
    return out
