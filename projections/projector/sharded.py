"""The projector of a sharded set: one :class:`Projector` per shard, each batch cut
by partition (event ``(topic, p, offset)`` goes to shard ``p``, see
:mod:`memstream.projections.store.shards`).

Each shard's projector stores the positions of its own partition beside its rows,
so a shard can be handed to another writer with nothing else to move.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from memstream.codec.batch import PositionedMemories
from memstream.domain.log import PositionedEvent
from memstream.projections.embedders import Embedder
from memstream.projections.projector.projector import ApplyResult, Projector
from memstream.projections.store import ShardedStore

__all__ = ["ShardedProjector", "split_memories"]


def split_memories(memories: PositionedMemories | None) -> dict[int, PositionedMemories]:
    """The fast path's columnar memories, per partition (rows keep their order)."""
    if memories is None or not len(memories):
        return {}
    rows: dict[int, list[int]] = {}
    for i, (_, partition, _) in enumerate(memories.positions):
        rows.setdefault(partition, []).append(i)
    if len(rows) == 1:
        return {next(iter(rows)): memories}
    unembedded = set(memories.unembedded)
    out: dict[int, PositionedMemories] = {}
    for partition, idx in rows.items():
        out[partition] = PositionedMemories(
            model=memories.model,
            positions=[memories.positions[i] for i in idx],
            fields=[memories.fields[i] for i in idx],
            vectors=memories.vectors[idx],
            unembedded=[j for j, i in enumerate(idx) if i in unembedded],
        )
    return out


class ShardedProjector:
    """Applies batches to the shards of a :class:`ShardedStore` (one writer thread:
    the shards are written one after the other, each with its own positions)."""

    def __init__(self, store: ShardedStore, embedder: Embedder, reuse: Mapping[int, Projector] | None = None) -> None:
        """``reuse``: projectors of shards kept from before (a worker whose shards changed)."""
        self.store = store
        self.embedder = embedder
        kept = {p: r for p, r in (reuse or {}).items() if store.shards.get(p) is r.store}
        self.projectors: dict[int, Projector] = {p: kept.get(p) or Projector(s, embedder) for p, s in store.shards.items()}

    def _projector(self, partition: int) -> Projector:
        try:
            return self.projectors[partition]
        except KeyError:
            raise ValueError(f"partition {partition} has no shard open in {self.store.root}") from None

    def positions(self) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        for projector in self.projectors.values():
            out.update(projector.positions())
        return out

    def save_positions(self, next_offsets: Mapping[tuple[str, int], int]) -> None:
        for partition, offsets in _by_partition(next_offsets).items():
            self._projector(partition).save_positions(offsets)

    def embed_ahead(self, batch: Sequence[PositionedEvent], memories: PositionedMemories | None = None) -> int:
        """Embed the fast path's rows in place in one call, and each shard's general-path
        events into that shard's projector (which keeps them until it applies them)."""
        if not self.projectors:
            return 0
        any_projector = next(iter(self.projectors.values()))
        done = any_projector.embed_ahead([], memories) if memories is not None else 0
        for partition, events in _events_by_partition(batch).items():
            done += self._projector(partition).embed_ahead(events, None)
        return done

    def finish_shredding(self) -> bool:
        """Each shard's last step of a forget (see ``Projector.finish_shredding``)."""
        return any([projector.finish_shredding() for projector in self.projectors.values()])

    def apply(self, batch: Sequence[PositionedEvent], memories: PositionedMemories | None = None) -> ApplyResult:
        events = _events_by_partition(batch)
        fast = split_memories(memories)
        total = ApplyResult()
        for partition in sorted(events.keys() | fast.keys()):
            result = self._projector(partition).apply(events.get(partition, []), fast.get(partition))
            total.applied += result.applied
            total.skipped += result.skipped
            total.failed.extend(result.failed)
        return total


def _events_by_partition(batch: Sequence[PositionedEvent]) -> dict[int, list[PositionedEvent]]:
    out: dict[int, list[PositionedEvent]] = {}
    for pe in batch:
        out.setdefault(pe.position.partition, []).append(pe)
    return out


def _by_partition(offsets: Mapping[tuple[str, int], int]) -> dict[int, dict[tuple[str, int], int]]:
    out: dict[int, dict[tuple[str, int], int]] = {}
    for (topic, partition), offset in offsets.items():
        out.setdefault(partition, {})[(topic, partition)] = offset
    return out
