"""Which agent owns each memory id of a space, kept for the write path's owner check.

Why: every client memory write that names its own id must be refused when another
agent of the space owns that id (the API's 409), and asking the table for every write
costs a query (5-8 ms of CPU) on the process that also serves searches. The space's
ids and their agents are read once, then brought to each new version of ``memories``
with the rows its commits wrote (``table_changes``, as the kept vectors are): a
projector commit touches a handful of rows. A step that cannot be told (a delete, a
replayed table set, rows no longer kept) reads the space again.

Correctness: :meth:`MemoryOwners.owner` answers as a query of the table at the
version it reads first (the map is that version's, or a newer one when another check
moved it on meanwhile: newer, never older). Entries are keyed by store directory,
team and user (the whole space: an owner check sees every agent's ids) and filled
only from reads under the space's predicate or from rows of that space.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from cachetools import LRUCache

from memstream.domain.access import ReadScope, read_scope_of
from memstream.domain.events import Scope
from memstream.projections.schema import MEMORIES
from memstream.projections.search import queries as q
from memstream.projections.search.cache import SearchCache, SpaceKey, Version, space_key, table_identity
from memstream.projections.store import LanceStore, space_where, wait

__all__ = ["MemoryOwners", "OWNERS_MAX_IDS"]

OWNERS_MAX_IDS = 500_000
"""Ids kept over every space together (about 150 bytes each); a space larger than a
tenth of it is asked per check instead."""

_LARGE_MAX = 4096
"""Most spaces remembered as too large to keep."""


@dataclass
class _Space:
    version: Version
    agents: dict[str, str]


class MemoryOwners:
    """The spaces' id -> agent maps, least recently checked first. Carries them with
    ``cache``'s change feeds (one read of each commit serves searches and checks)."""

    def __init__(self, cache: SearchCache, max_ids: int = OWNERS_MAX_IDS) -> None:
        self.cache = cache
        self.max_ids = max_ids
        self._lock = threading.Lock()
        self._spaces: LRUCache[SpaceKey, _Space] = LRUCache(max_ids, getsizeof=lambda space: len(space.agents))
        self._large: set[SpaceKey] = set()

    def owner(self, store: LanceStore, scope: Scope | ReadScope, memory_id: str) -> str | None:
        """The agent whose memory ``memory_id`` is in the scope's space (every agent's),
        if stored. Blocking (reads the table's version, and what changed): call it off
        the event loop."""
        space = read_scope_of(scope)
        space = ReadScope(space.team_id, space.user_id, None)
        root = str(store.root)
        identity = table_identity(root, MEMORIES)
        version: Version = (*identity, int(wait(q.native(store, MEMORIES).version())))
        agents = self._agents(store, root, space, version)
        if agents is None:  # a space too large to keep
            return store.memory_owner(space, memory_id)
        return agents.get(memory_id)

    def _agents(self, store: LanceStore, root: str, scope: ReadScope, version: Version) -> dict[str, str] | None:
        key = space_key(root, scope)
        with self._lock:
            if key in self._large:
                return None
            held = self._spaces.get(key)
        if held is not None and held.version[:2] == version[:2] and held.version[2] >= version[2]:
            return held.agents
        written = self._written(root, scope, held, version) if held is not None else None
        if held is not None and written is not None:
            with self._lock:
                if self._spaces.get(key) is held:
                    held.agents.update(written)  # in place: a check holding the map sees newer, never older
                    if held.version[2] < version[2]:
                        held.version = version
                    self._keep(key, held)  # weighed again
                    return held.agents
        agents = self._read(store, scope)
        with self._lock:
            self._keep(key, _Space(version, agents) if agents is not None else None)
        return agents

    def _written(self, root: str, scope: ReadScope, held: _Space, version: Version) -> dict[str, str] | None:
        """The owners the commits from ``held``'s version to ``version`` wrote in the
        space (``None``: cannot be told, read the space again)."""
        changes = self.cache.changes(root, MEMORIES, held.version, version)
        if changes is None:
            return None
        changed = changes.of(scope.team_id, scope.user_id)
        if changed is None:
            return {}
        if changed.rows is None:
            return None
        ids = changed.rows.column("memory_id").to_pylist()
        return dict(zip(ids, changed.rows.column("agent_id").to_pylist()))

    def _read(self, store: LanceStore, scope: ReadScope) -> dict[str, str] | None:
        """Every id of the space and its agent (``None``: more than a space may keep)."""
        limit = self.max_ids // 10
        read = wait(q.scan(q.native(store, MEMORIES), space_where(scope), ("memory_id", "agent_id"), limit + 1))
        if read.num_rows > limit:
            return None
        return dict(zip(read.column("memory_id").to_pylist(), read.column("agent_id").to_pylist()))

    def _keep(self, key: SpaceKey, entry: _Space | None) -> None:
        """File a space's map (``None``: too large, asked per check from now on); the
        least recently checked spaces go until the ids fit (under the lock)."""
        self._spaces.pop(key, None)
        if entry is None:
            if len(self._large) >= _LARGE_MAX:
                self._large.clear()
            self._large.add(key)
        elif len(entry.agents) <= self.max_ids:
            self._spaces[key] = entry
