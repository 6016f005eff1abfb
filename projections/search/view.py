"""One search's view of its memory space (what the cache holds plus what the search
read itself) and the successors of superseded or duplicate candidates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memstream.domain.events import Scope
from memstream.projections.schema import MEMORIES, scoped_key
from memstream.projections.search import queries as q
from memstream.projections.search.cache import SearchCache, SpaceCache, Version
from memstream.projections.search.results import READ_COLUMNS, rows_of
from memstream.projections.search.turns import SessionMemories, SessionTurns, Turn
from memstream.projections.store import LanceStore, wait

__all__ = ["Unknown", "UNKNOWN", "View", "Successors", "pull_successors", "successor_of", "SUCCESSOR_HOPS"]

SUCCESSOR_HOPS = 3


def successor_of(row: Mapping[str, Any]) -> str | None:
    return row.get("superseded_by") or row.get("canonical_id")


class Unknown:
    """The type of :data:`UNKNOWN`."""


UNKNOWN = Unknown()
"""What :class:`View` answers for an id it has no answer for (``None`` means: looked
up, not in the space)."""


class View:
    """One search's view of its memory space: the cache entry of the table versions it
    started from (:class:`SearchCache`), plus what this search read
    itself (filed in the entry too, or in the later entry it moved on to without what
    changed since, unless that cannot be told or the read was cut at ``MAX_TURNS``:
    then only here). Every row in it was read under the space's
    predicate or its scoped keys."""

    def __init__(
        self, cache: SearchCache, entry: SpaceCache, memories_version: Version, messages_version: Version
    ) -> None:
        self.cache = cache
        self.entry = entry
        self.memories_version = memories_version
        self.messages_version = messages_version
        self.memories: dict[str, dict[str, Any] | None] = {}
        self.turns: dict[str, Turn | None] = {}
        self.session_turns: dict[str, SessionTurns] = {}
        self.session_memories: dict[str, SessionMemories] = {}

    def memory(self, memory_id: str) -> dict[str, Any] | None | Unknown:
        if memory_id in self.memories:
            return self.memories[memory_id]
        return self.entry.memories.get(memory_id, UNKNOWN)

    def turn(self, message_id: str) -> Turn | None | Unknown:
        if message_id in self.turns:
            return self.turns[message_id]
        return self.entry.turns.get(message_id, UNKNOWN)

    def turns_of(self, session: str) -> SessionTurns | None:
        return self.session_turns.get(session) or self.entry.session_turns.get(session)

    def memories_of(self, session: str) -> SessionMemories | None:
        return self.session_memories.get(session) or self.entry.session_memories.get(session)

    def file_memories(
        self,
        rows: Sequence[dict[str, Any]],
        absent: Sequence[str] = (),
        sessions: Mapping[str, SessionMemories] | None = None,
        *,
        keep: bool = True,
    ) -> None:
        """Rows read at this search's version of ``memories`` (``absent``: ids an
        unfiltered lookup did not find; ``sessions``: sessions read whole); filed in
        the cache unless ``keep`` is false."""
        for row in rows:
            self.memories[row["memory_id"]] = row
        for mid in absent:
            self.memories.setdefault(mid, None)
        if sessions:
            self.session_memories.update(sessions)
        if keep:
            self.cache.add_memories(self.entry, self.memories_version, rows, absent, sessions)

    def file_turns(
        self,
        turns: Sequence[Turn],
        absent: Sequence[str] = (),
        sessions: Mapping[str, SessionTurns] | None = None,
        *,
        keep: bool = True,
    ) -> None:
        """As :meth:`file_memories`, for turns of ``messages``."""
        for t in turns:
            self.turns[t.message_id] = t
        for mid in absent:
            self.turns.setdefault(mid, None)
        if sessions:
            self.session_turns.update(sessions)
        if keep:
            self.cache.add_turns(self.entry, self.messages_version, turns, absent, sessions)


class Successors:
    """The successor rows read so far for one search: ``memory_id -> row``, ``None``
    for an id that was looked up and is not in the space or fails the filters. The
    first hop is resolved with the candidates' other reads; later hops, and the
    successors of memories that joined as neighbours, here on demand. Without filters
    (``extra``) the space's cache answers first and what is read is filed in it."""

    def __init__(self, store: LanceStore, scope: Scope, extra: Sequence[str], view: View | None = None) -> None:
        self.store = store
        self.scope = scope
        self.extra = tuple(extra)
        self.view = view
        self.found: dict[str, dict[str, Any] | None] = {}

    def wanted(self, rows: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """Ids of the successors of ``rows`` that are neither candidates nor read yet."""
        team, user = self.scope.team_id, self.scope.user_id
        out: dict[str, None] = {}
        for row in rows.values():
            nxt = successor_of(row)
            if nxt and nxt not in self.found and scoped_key(team, user, nxt) not in rows:
                out[nxt] = None
        return list(out)

    async def read(self, ids: Sequence[str]) -> None:
        cached = self.view if self.view is not None and not self.extra else None
        unread = list(ids)
        if cached is not None:
            unread = []
            for mid in ids:
                hit = cached.memory(mid)
                if isinstance(hit, Unknown):
                    unread.append(mid)
                else:
                    self.found[mid] = hit
        if not unread:
            return
        table = await q.by_ids(self.store, MEMORIES, self.scope, "memory_id", unread, READ_COLUMNS, self.extra)
        rows = rows_of(table, self.scope)
        for mid in unread:
            self.found.setdefault(mid, None)
        for row in rows:
            self.found[row["memory_id"]] = row
        if cached is not None:
            cached.file_memories(rows, [m for m in unread if self.found[m] is None])

    def rows(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        """The rows of ``ids`` that exist and pass the filters (read if not yet)."""
        unread = [m for m in dict.fromkeys(ids) if m not in self.found]
        if unread:
            wait(self.read(unread))
        return [row for row in (self.found[m] for m in ids) if row is not None]


def pull_successors(
    successors: Successors,
    rows: dict[str, dict[str, Any]],
    fused: dict[str, float],
) -> None:
    """Bring the successors of superseded / duplicate candidates into the candidate
    set (when they pass the filters), following up to ``SUCCESSOR_HOPS`` links; a
    successor inherits its predecessor's fused score when that is higher than its own."""
    s = successors.scope
    frontier = list(rows)
    for _ in range(SUCCESSOR_HOPS):
        wanted: dict[str, str] = {}  # successor pk -> predecessor pk
        ids: dict[str, str] = {}  # successor pk -> successor memory id
        for pk in frontier:
            nxt = successor_of(rows[pk])
            if nxt:
                spk = scoped_key(s.team_id, s.user_id, nxt)
                ids[spk] = nxt
                if spk not in wanted or fused.get(pk, 0.0) > fused.get(wanted[spk], 0.0):
                    wanted[spk] = pk
        if not wanted:
            return
        missing = {pk for pk in wanted if pk not in rows}
        for r in successors.rows([ids[pk] for pk in wanted if pk in missing]):
            rows[r["pk"]] = r
        frontier = []
        for spk, pred in wanted.items():
            if spk not in rows:
                continue
            inherited = fused.get(pred, 0.0)
            if inherited > fused.get(spk, 0.0):
                fused[spk] = inherited
                frontier.append(spk)
            elif spk in missing:
                frontier.append(spk)

