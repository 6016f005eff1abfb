"""The one seam where events of an older ``schema_version`` become the current version.

The log is kept forever, so a reader meets every version ever written. Readers never
branch on versions: :func:`upcast` runs registered steps, one per (type, from version),
until the event reaches the current version, and only then is it validated. Steps are
pure dict-to-dict functions, so they also upgrade JSON written by non-Python producers.

Rules:

* a missing ``schema_version`` means 1 (the first producers did not send one);
* every version bump of a type registers its step here; a gap is a programming error
  and is reported as such rather than skipped;
* an event *newer* than this reader is refused with a clear reason (upgrade the
  reader), never guessed at: a dropped field would be lost from the view silently.

Registered steps:

* ``MemoryAdded`` v1 -> v2: v1 called the memory type ``kind`` and had no ``scene``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Upcaster", "UpcastError", "UPCASTERS", "upcast"]

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


class UpcastError(ValueError):
    """An event whose ``schema_version`` this reader cannot bring to the current one."""


def _memory_added_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 ``MemoryAdded`` had no ``scene`` and called the memory type ``kind``
    (legacy names such as ``preference`` are mapped later, by validation)."""
    out = dict(raw)
    if "kind" in out:
        if "memory_type" in out:
            raise UpcastError("MemoryAdded v1 carries both kind and memory_type (v1 has only kind)")
        out["memory_type"] = out.pop("kind")
    out.setdefault("scene", None)
    out["schema_version"] = 2
    return out


UPCASTERS: Mapping[tuple[str, int], Upcaster] = {
    ("MemoryAdded", 1): _memory_added_v1_to_v2,
}


def upcast(
    raw: dict[str, Any],
    current: int,
    steps: Mapping[tuple[str, int], Upcaster] = UPCASTERS,
) -> dict[str, Any]:
    """Upgrade ``raw`` step by step to version ``current`` of its type.

    Returns ``raw`` itself when it already is current (with ``schema_version`` filled
    in when it was missing), otherwise a new dict; ``raw`` is never mutated. Raises
    :class:`UpcastError` for a version that is not a positive integer, newer than
    ``current``, or without a registered step.
    """
    etype = raw.get("type")
    version = raw.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise UpcastError(f"schema_version must be an integer, got {type(version).__name__}")
    if version < 1:
        raise UpcastError(f"schema_version must be >= 1, got {version}")
    if version > current:
        shown = str(version) if version < 10**9 else "a much larger number"
        raise UpcastError(
            f"schema_version {shown} of {etype} is newer than this reader's ({current}); "
            "upgrade memstream to read it"
        )
    out = raw if "schema_version" in raw else {**raw, "schema_version": 1}
    while version < current:
        step = steps.get((str(etype), version))
        if step is None:
            raise UpcastError(f"no upcaster registered for {etype} v{version} -> v{version + 1}")
        out = step(out)
        version += 1
    return out
