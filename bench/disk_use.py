"""Disk use of a table set, per shard: what a worker's maintenance leaves behind, to
set against a replayed (compacted) set of the same log."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import lance

from memstream.projections.store import is_sharded, shard_count, shard_dir

__all__ = ["dir_bytes", "set_bytes", "disk_ratios", "drop_replaced_versions"]


def dir_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (0 when it does not exist)."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def set_bytes(set_dir: Path) -> dict[str, int]:
    """Bytes per shard (``"0"``, ``"1"``...) of a sharded set, or ``{"set": n}``."""
    if not is_sharded(set_dir):
        return {"set": dir_bytes(set_dir)}
    return {str(p): dir_bytes(shard_dir(set_dir, p)) for p in range(shard_count(set_dir))}


def drop_replaced_versions(set_dir: Path) -> None:
    """Drop every version but the newest of every table of a set nobody reads yet (a
    replay's built set before its swap): what the set is once its readers' grace has
    passed, the smallest a replayed set gets."""
    for table in Path(set_dir).rglob("*.lance"):
        if (table / "_versions").is_dir():
            lance.dataset(str(table)).cleanup_old_versions(older_than=timedelta(0))


def disk_ratios(live: dict[str, int], replayed: dict[str, int]) -> dict[str, Any]:
    """Live over replayed bytes, per shard and in all (None where the replay is empty)."""
    per = {k: (round(live[k] / replayed[k], 2) if replayed.get(k) else None) for k in live}
    total_replayed = sum(replayed.values())
    return {
        "per_shard": per,
        "total": round(sum(live.values()) / total_replayed, 2) if total_replayed else None,
        "worst": max((r for r in per.values() if r is not None), default=None),
    }
