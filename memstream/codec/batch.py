"""Fast-path ``MemoryAdded`` events of one batch, column-friendly."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from memstream.codec.values import ValuesRecord

__all__ = ["PositionedMemories"]


@dataclass
class PositionedMemories:
    """Row ``i`` is the event with values ``fields[i]`` (see
    :func:`~memstream.codec.values.event_values`; a record) read at ``positions[i]`` (topic,
    partition, offset), with the finite vector ``vectors[i]`` of embedding model
    ``model``. ``unembedded`` lists the rows whose event carried no vector: their row
    of ``vectors`` is zeros until the reader embeds the content and fills it in."""

    model: str
    positions: list[tuple[str, int, int]] = field(default_factory=list)
    fields: list[ValuesRecord] = field(default_factory=list)
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    unembedded: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.positions)

    @classmethod
    def concat(cls, parts: "list[PositionedMemories]") -> "PositionedMemories | None":
        """Several batches' memories as one (``None`` when there are none)."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        if len({p.model for p in parts}) != 1:
            raise ValueError("memories of different embedding models cannot be merged")
        positions: list[tuple[str, int, int]] = []
        fields: list[ValuesRecord] = []
        unembedded: list[int] = []
        for p in parts:
            unembedded.extend(len(positions) + i for i in p.unembedded)
            positions.extend(p.positions)
            fields.extend(p.fields)
        return cls(
            model=parts[0].model,
            positions=positions,
            fields=fields,
            vectors=np.concatenate([p.vectors for p in parts]),
            unembedded=unembedded,
        )
