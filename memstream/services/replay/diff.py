"""Where a replayed set and the live set differ, memory space by memory space.

Both sets are folds of the same log; compared at the same positions they must be
equal, so every difference found there is one the log does not explain (a projector
bug, a lost write, a forget applied out of order). The replay reports them per space
(team, user) and table, and swaps nothing in unless told to (``--force``)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from memstream.projections.schema import DIGEST_COLUMNS, POSITIONS, TABLE_NAMES

__all__ = ["SpaceDiff", "space_digests", "space_differences"]

SpaceDigest = dict[tuple[str, str, str], tuple[int, str]]
"""(table, team, user) -> (rows, SHA-256 of the rows' digest columns, by pk)."""


@dataclass(frozen=True)
class SpaceDiff:
    table: str
    team_id: str
    user_id: str
    live_rows: int
    replay_rows: int

    def __str__(self) -> str:
        what = "rows differ" if self.live_rows == self.replay_rows else f"{self.live_rows}->{self.replay_rows}"
        return f"{self.team_id}/{self.user_id} {self.table} {what}"


def _rows(store: Any, name: str, cols: list[str]) -> pa.Table:
    shards = getattr(store, "shards", None)
    parts = shards.values() if shards is not None else (store,)
    return pa.concat_tables([s.table(name).to_lance().to_table(columns=cols) for s in parts])


def space_digests(store: Any) -> SpaceDigest:
    """Per table and memory space: row count and a hash of the digest columns."""
    out: SpaceDigest = {}
    for name in TABLE_NAMES:
        if name == POSITIONS:
            continue
        cols = list(DIGEST_COLUMNS[name])
        tbl = _rows(store, name, list(dict.fromkeys([*cols, "team_id", "user_id"]))).sort_by([("pk", "ascending")])
        if not tbl.num_rows:
            continue
        texts = [pc.fill_null(pc.cast(tbl.column(c), pa.string()), "\u2205") for c in cols]
        joined = pc.binary_join_element_wise(*texts, "\x1f").to_pylist()
        hashes: dict[tuple[str, str, str], Any] = {}
        counts: dict[tuple[str, str, str], int] = {}
        for team, user, line in zip(tbl.column("team_id").to_pylist(), tbl.column("user_id").to_pylist(), joined):
            key = (name, team, user)
            hashes.setdefault(key, hashlib.sha256()).update(line.encode("utf-8") + b"\n")
            counts[key] = counts.get(key, 0) + 1
        out.update({k: (counts[k], h.hexdigest()) for k, h in hashes.items()})
    return out


def space_differences(live: Mapping[tuple[str, str, str], tuple[int, str]], replay: Mapping[tuple[str, str, str], tuple[int, str]]) -> list[SpaceDiff]:
    """The (table, space) pairs whose rows differ, sorted by space then table."""
    diffs = [
        SpaceDiff(k[0], k[1], k[2], live.get(k, (0, ""))[0], replay.get(k, (0, ""))[0])
        for k in set(live) | set(replay)
        if live.get(k) != replay.get(k)
    ]
    return sorted(diffs, key=lambda d: (d.team_id, d.user_id, d.table))
