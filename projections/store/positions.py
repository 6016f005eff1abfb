"""The projection's log positions: the next offset to read per (topic, partition),
appended as they move forward and read back as the furthest per partition.

With each save the writer also publishes the version of every other table as it
left it (rows under a ``lance:<table>`` topic, a name no Kafka topic can have, since
Kafka forbids ``:``), in the same commit: a reader that pins those versions reads every
table as of one projected position, never one table before a batch and another
after it (:meth:`StorePositions.published_versions`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone

import pyarrow as pa

from memstream.projections.schema import POSITIONS, TABLE_NAMES, schema_for
from memstream.projections.store.filters import quote
from memstream.projections.store.tables import StoreTables

__all__ = ["StorePositions", "VERSION_TOPIC"]

VERSION_TOPIC = "lance:"
"""The topic prefix of the rows that publish a table's version with the positions."""
_PUBLISHED = tuple(name for name in TABLE_NAMES if name != POSITIONS)


def _furthest_rows(tbl: pa.Table) -> dict[tuple[str, int], tuple[int, int]]:
    """Per (topic, partition) of a ``positions`` read: the furthest next offset and the
    index of the row holding it (positions are appended and only move forward)."""
    furthest: dict[tuple[str, int], tuple[int, int]] = {}
    for i, (t, p, o) in enumerate(
        zip(tbl.column("topic").to_pylist(), tbl.column("partition").to_pylist(), tbl.column("next_offset").to_pylist())
    ):
        key = (t, int(p))
        if key not in furthest or int(o) > furthest[key][0]:
            furthest[key] = (int(o), i)
    return furthest


class StorePositions(StoreTables):
    """Reading, saving and pruning the ``positions`` table."""

    def positions(self) -> dict[tuple[str, int], int]:
        """The next offset to read per (topic, partition): the furthest one written
        (the table is append-only, see :meth:`save_positions`)."""
        return _split(self._positions_and_rows()[0])[0]

    def published_versions(self) -> dict[str, int]:
        """The version of each table as the writer left it at its latest saved
        position (empty for a set written before versions were published), read in
        one read of the positions table."""
        return _split(self._positions_and_rows()[0])[1]

    def positions_table(self) -> pa.Table:
        """The ``positions`` view as rows, every column: the furthest row of each
        (topic, partition), which is what a reader of the table means by it (the
        table itself also holds the rows appended before, until they are pruned)."""
        tbl = self.rows(POSITIONS, None)
        furthest = _furthest_rows(tbl)
        keys = [k for k in sorted(furthest) if not k[0].startswith(VERSION_TOPIC)]
        return tbl.take(pa.array([furthest[k][1] for k in keys], type=pa.int64()))

    def _positions_and_rows(self) -> tuple[dict[tuple[str, int], int], int]:
        """The positions (the published versions' rows included) and how many rows
        hold them, from one read."""
        tbl = self.rows(POSITIONS, None, ["topic", "partition", "next_offset"])
        return {k: offset for k, (offset, _) in _furthest_rows(tbl).items()}, tbl.num_rows

    def save_positions(self, next_offsets: Mapping[tuple[str, int], int], *, now: datetime | None = None) -> None:
        """Record positions. Positions only move forward (the projector takes the max
        of the stored and the new offset), so they are *appended* and read back as the
        maximum per partition: an append costs a fraction of an upsert (LanceDB's
        merge), once per batch. :meth:`prune_positions` drops the passed
        rows now and then. Call it from the tables' writer only, after the batch's
        writes: the versions its handles are on are published with the positions."""
        if not next_offsets:
            return
        stamp = now or datetime.now(timezone.utc)
        known: dict[str, int] | None = self._published  # type: ignore[has-type]  # (an import cycle hides it)
        published = self.published_versions() if known is None else known
        versions = {name: int(self.table(name).version) for name in _PUBLISHED}
        moved = {(VERSION_TOPIC + n, 0): v for n, v in versions.items() if v != published.get(n)}
        items = sorted(next_offsets.items()) + sorted(moved.items())
        rows = pa.Table.from_pydict(
            {
                "pk": [f"{t}|{p}" for (t, p), _ in items],
                "topic": [t for (t, _), _ in items],
                "partition": [p for (_, p), _ in items],
                "next_offset": [o for _, o in items],
                "updated_at": [stamp] * len(items),
            },
            schema=schema_for(POSITIONS, self.embedding_dim),
        )
        self.table(POSITIONS).add(rows)
        self._published = {**published, **versions}

    def prune_positions(self) -> int:
        """Delete position rows behind the furthest one of their partition; returns
        how many there were. The view never changes (it is the maximum)."""
        tbl = self.table(POSITIONS)
        # one read for both: beside the writer, a second read could see newer rows
        current, rows = self._positions_and_rows()  # versions only grow too: pruned alike
        stale = rows - len(current)
        if stale > 0 and current:
            tbl.delete(
                " OR ".join(
                    f"(topic = {quote(t)} AND partition = {p} AND next_offset < {o})"
                    for (t, p), o in sorted(current.items())
                )
            )
        return max(stale, 0)


def _split(furthest: dict[tuple[str, int], int]) -> tuple[dict[tuple[str, int], int], dict[str, int]]:
    """(the log positions, the published table versions) of a positions read."""
    positions = {k: v for k, v in furthest.items() if not k[0].startswith(VERSION_TOPIC)}
    versions = {k[0][len(VERSION_TOPIC):]: v for k, v in furthest.items() if k[0].startswith(VERSION_TOPIC)}
    return positions, versions
