"""What several CLI modules need alike: the memory space from ``--team/--user/--agent``,
the projection opened read-only, and rows made printable as JSON.

Kept in one place so every command refuses a missing team, reports a malformed id and
a missing projection with the same single line.
"""

from __future__ import annotations

import math
from datetime import date, datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from memstream.cli._errors import CLIError, validation_line
from memstream.settings import Settings

if TYPE_CHECKING:  # imported where used: `memstream --help` must not load the event models
    from memstream.domain.events import Scope


__all__ = ["scope_from_options", "open_store", "jsonable"]


def scope_from_options(team: str, user: str = "default", agent: str = "default") -> Scope:
    """The memory space a command works in. ``--team`` is required: a command never
    runs over every space; an empty user or agent means "default"."""
    from memstream.domain.events import Scope

    if not team.strip():
        raise CLIError("--team is required: memory spaces are never crossed")
    try:
        return Scope(team_id=team, user_id=user or "default", agent_id=agent or "default")
    except ValidationError as exc:
        raise CLIError(validation_line(exc)) from None


def open_store(settings: Settings, lance_dir: Path | None = None, scope: Scope | None = None) -> Any:
    """The projection's store (``--lance-dir`` or ``settings.storage.root``), refusing to
    create an empty one where none exists. With ``scope``, the store holding that
    space (its shard when the set is sharded by partition)."""
    from memstream.projections.store import ShardLayoutError
    from memstream.projections.store import StoreError
    from memstream.projections.store import TableSets
    from memstream.services.shards import has_projection, open_store as open_set, store_for

    root = TableSets(lance_dir or settings.storage.root).current()  # a root follows its CURRENT set
    if not has_projection(root):
        raise CLIError(f"no projection in {root}: start `memstream worker` (or pass --lance-dir)")
    try:
        store = open_set(settings, root, create=False)
    except (StoreError, ShardLayoutError) as exc:
        raise CLIError(str(exc)) from None
    return store_for(store, scope) if scope is not None else store


def jsonable(value: Any) -> Any:
    """Rows and results as JSON values: times in UTC with ``Z``, non-finite floats as
    null, bytes as hex, dataclasses as objects."""
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return {k: jsonable(getattr(value, k)) for k in value.__dataclass_fields__}
    return value
