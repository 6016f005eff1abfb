"""The one seam where events of an older ``schema_version`` become the current version.

Readers never branch on versions: :func:`upcast` runs registered steps (type, from
version) -> dict until the event reaches the current version. Pure dict-to-dict
functions, so they also upgrade JSON written by non-Python producers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["upcast", "UPCASTERS"]

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


def _memory_added_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 ``MemoryAdded`` had no ``scene`` and called the memory type ``kind``."""
    out = dict(raw)
    if "kind" in out and "memory_type" not in out:
        out["memory_type"] = out.pop("kind")
    out.setdefault("scene", None)
    out["schema_version"] = 2
    return out


UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("MemoryAdded", 1): _memory_added_v1_to_v2,
}


def upcast(raw: dict[str, Any], current: int) -> dict[str, Any]:
    """Upgrade ``raw`` step by step to ``current``; a missing version means 1."""
    version = raw.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError(f"schema_version must be an integer, got {version!r}")
    if version > current:
        raise ValueError(
            f"schema_version {version} of {raw.get('type')} is newer than this reader ({current})"
        )
    if version < 1:
        raise ValueError(f"schema_version must be >= 1, got {version}")
    out = raw if "schema_version" in raw else {**raw, "schema_version": 1}
    while version < current:
        step = UPCASTERS.get((str(raw.get("type")), version))
        if step is None:
            out = {**out, "schema_version": version + 1}
        else:
            out = step(out)
        version += 1
    return out
