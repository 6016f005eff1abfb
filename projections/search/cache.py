"""What hybrid search has read of a memory space, kept while its tables stand still.

Why: conversation-aware ranking needs the candidates' sessions (every turn and every
memory drawn from them), and a conversation's questions keep landing in the same
sessions. Those rows change only when their table gets a new version, so a
:class:`SearchCache` keeps them per memory space and table version, and a search reads
only what it does not hold yet. The interfaces (API, MCP, CLI) each hold one.

Correctness:

* an entry holds rows read at one version of ``memories`` and one of ``messages``;
  :meth:`SearchCache.space_cache` drops what the tables' commits since changed in the
  space (``table_changes``), or all of a half it cannot tell about. Rows read while a
  write lands may be newer than their version, never older (a reader merges into the
  entry of the version it started from, or into a later one without what the commits
  in between wrote in the space, :meth:`SearchCache.add_memories`);
* isolation: entries are keyed by store directory, team, user and pinned agent
  (:func:`space_key`) and filled only from reads under the space's predicate or its
  scoped keys;
* a version carries the table directory's identity (:func:`table_identity`): a
  replayed table set starts its numbers again in other directories.

Memory is bounded by ``max_rows`` memory rows and turns over all spaces; the least
recently searched spaces go first. Entries are shared by threads: their dictionaries
are only added to or looked up, and a half that moved is replaced, never cleared.
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from memstream.domain.access import ReadScope, agent_pin
from memstream.domain.events import Scope
from memstream.projections.schema import ENTITIES, MEMORIES, MESSAGES
from memstream.projections.search.results import READ_COLUMNS, rows_of, shared
from memstream.projections.search.turns import SessionMemories, SessionTurns, Turn
from memstream.projections.search.vectors import VECTORS_MAX_ROWS, VectorCache
from memstream.projections.search.table_changes import Changes, SpaceChanges, TableChanges

__all__ = [
    "READ_NOT_BEFORE",
    "CACHE_MAX_ROWS",
    "Version",
    "table_identity",
    "SpaceCache",
    "SearchCache",
    "space_key",
    "SpaceKey",
    "TURN_COLUMNS",
    "turns_of",
]

READ_NOT_BEFORE: contextvars.ContextVar[float] = contextvars.ContextVar("memstream_read_not_before", default=0.0)
"""For a read that waited for a log position: the monotonic time at which the view had
reached it. A cache kept by time rather than by table version answers such a read only
with what it read after then (caches kept by version are read after it anyway)."""

TURN_COLUMNS = ("message_id", "session_id", "speaker", "content", "log_partition", "log_offset")
"""What search reads of a turn (``messages`` row)."""


def turns_of(table: pa.Table) -> list[Turn]:
    """The turns of a ``TURN_COLUMNS`` read; ids, sessions and speakers shared with the
    other turns and rows holding them (:func:`shared`)."""
    columns = [table.column(c).to_pylist() for c in TURN_COLUMNS]
    return [
        Turn(
            shared(mid),
            shared(session) if session else session,
            int(partition or 0),
            int(offset or 0),
            shared(speaker) if speaker else speaker,
            content or "",
        )
        for mid, session, speaker, content, partition, offset in zip(*columns)
    ]


NO_CHANGES = Changes({})
_UNTOUCHED = SpaceChanges(frozenset(), frozenset())

SpaceKey = tuple[str, str, str, str]
"""(store directory, team, user, pinned agent or ""): what one cache entry belongs to."""

CACHE_MAX_ROWS = 30_000
"""Memory rows and turns kept over every memory space together by default (about 0.9
KB of Python objects each, turns and memories together: about 27 MB)."""

FACTS_MAX = 4096
"""Most memory spaces whose speakers and counts are kept (and entity names per space)."""

Version = tuple[int, int, int]
"""Which state of a table rows were read at: the table directory's device and inode
(:func:`table_identity`), then LanceDB's version number."""

_FEEDS_MAX = 64
_CHANGE_COLUMNS: dict[str, tuple[str, str | None, tuple[str, ...]]] = {
    MEMORIES: ("memory_id", "session_id", (*READ_COLUMNS, "vector")),
    MESSAGES: ("message_id", "session_id", (*TURN_COLUMNS, "agent_id")),
    ENTITIES: ("name_key", None, ()),
}
"""Per table: its id and session columns, and the columns of written rows kept (cached
sessions and the kept vectors are brought forward with them)."""


def table_identity(root: str, table: str) -> tuple[int, int]:
    """The device and inode of ``<root>/<table>.lance``, the first two parts of a
    :data:`Version`. Take it before asking LanceDB for the version number (a swap in
    between then costs a read, never a stale answer)."""
    try:
        st = os.stat(os.path.join(root, f"{table}.lance"))
    except OSError:
        return (0, 0)
    return (st.st_dev, st.st_ino)


def space_key(root: str, scope: Scope | ReadScope) -> SpaceKey:
    """What a cache of one read scope is keyed by: a read pinned to an agent has its
    own entries, filled under its own (agent-narrowed) predicate."""
    return (root, scope.team_id, scope.user_id, agent_pin(scope) or "")


class SpaceCache:
    """One memory space's rows read so far: memories (``None`` for an id looked up
    and not in the space) and sessions' memories at ``memories_version``; turns by id
    (``None``: not in the space) and sessions' turns at ``messages_version``. Every
    search of the space shares these row dicts and turns: they are never changed."""

    def __init__(self, key: SpaceKey, memories_version: Version, messages_version: Version) -> None:
        self.key = key
        self.memories_version = memories_version
        self.messages_version = messages_version
        self.memories: dict[str, dict[str, Any] | None] = {}
        self.session_memories: dict[str, SessionMemories] = {}
        self.turns: dict[str, Turn | None] = {}
        self.session_turns: dict[str, SessionTurns] = {}
        self.memory_rows = 0
        self.turn_rows = 0
        self.row_misses = 0
        """Candidates of the space's last search whose rows were neither here nor in a
        session it read (see :func:`lists_need_rows`)."""

    @property
    def size(self) -> int:
        return self.memory_rows + self.turn_rows

    def current(self, memories_version: Version | None, messages_version: Version | None) -> bool:
        """Whether the entry is still at these versions (``None``: that table does not
        matter), so that what was read at them may be added."""
        return (memories_version is None or memories_version == self.memories_version) and (
            messages_version is None or messages_version == self.messages_version
        )

    # ---------------------------------------------------------------- adding (under the SearchCache lock)
    def _add_memories(self, rows: Iterable[dict[str, Any]], absent: Iterable[str]) -> None:
        for row in rows:
            if row["memory_id"] not in self.memories:
                self.memory_rows += 1
            self.memories[row["memory_id"]] = row
        for mid in absent:
            if mid not in self.memories:
                self.memories[mid] = None
                self.memory_rows += 1

    def _add_turns(self, turns: Iterable[Turn], absent: Iterable[str]) -> None:
        for t in turns:
            if t.message_id not in self.turns:
                self.turn_rows += 1
            self.turns[t.message_id] = t
        for mid in absent:
            if mid not in self.turns:
                self.turns[mid] = None
                self.turn_rows += 1


# Not a plain LRU (so not cachetools): entries grow in place while filed and the growing
# entry is kept while others go (tests/projections/search/test_cache.py::test_the_cache_stays_within_its_bound).
class _Registry:
    """Every space's entry, least recently searched first, and the rows they hold
    together (kept as a running total: summing over thousands of spaces at every
    filing would cost more than the filing)."""

    def __init__(self) -> None:
        self.entries: OrderedDict[SpaceKey, SpaceCache] = OrderedDict()
        self.total = 0

    def put(self, entry: SpaceCache) -> None:
        old = self.entries.get(entry.key)
        self.total += entry.size - (old.size if old is not None else 0)
        self.entries[entry.key] = entry
        self.entries.move_to_end(entry.key)

    def drop(self, key: SpaceKey) -> None:
        old = self.entries.pop(key, None)
        if old is not None:
            self.total -= old.size

    def clear(self) -> None:
        self.entries.clear()
        self.total = 0


class SearchCache:
    """Every memory space's entry, the tables' change feeds, and the spaces' small
    facts (speakers, sizes, entity counts): the state hybrid search keeps between
    searches. One per serving process; results are the same with a cold one."""

    def __init__(self, max_rows: int = CACHE_MAX_ROWS, max_vectors: int = VECTORS_MAX_ROWS) -> None:
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self._spaces = _Registry()
        self._feeds: dict[tuple[str, str, tuple[int, int]], TableChanges] = {}
        """Each table's steps, per (store directory, table, table identity)."""
        self._speakers: dict[SpaceKey, tuple[float, frozenset[str]]] = {}
        self._sizes: dict[SpaceKey, tuple[Version, int]] = {}
        self._frequencies: dict[SpaceKey, tuple[Version, dict[str, int], bool]] = {}
        self.vectors = VectorCache(max_vectors)
        """The spaces' vectors, for the vector leg (``vectors``)."""

    # ---------------------------------------------------------------- entries
    def space_cache(self, root: str, scope: Scope, memories_version: Version, messages_version: Version) -> SpaceCache:
        """The space's entry at these table versions: the same entry when nothing moved,
        else an entry carried forward without what the tables' commits since changed in
        the space (:func:`_carried`). Reads the steps it has not seen yet: call it off
        the event loop."""
        key = space_key(root, scope)
        with self._lock:
            entry = self._spaces.entries.get(key)
            if entry is not None and entry.current(memories_version, messages_version):
                self._spaces.entries.move_to_end(key)
                return entry
        memories = self._changes(root, MEMORIES, entry.memories_version, memories_version) if entry else None
        messages = self._changes(root, MESSAGES, entry.messages_version, messages_version) if entry else None
        with self._lock:
            now = self._spaces.entries.get(key)
            if now is not None and now.current(memories_version, messages_version):
                self._spaces.entries.move_to_end(key)
                return now  # another search carried it meanwhile
            fresh = SpaceCache(key, memories_version, messages_version)
            if now is not None and now is entry:
                _carried(fresh, entry, scope, memories, messages)
            self._spaces.put(fresh)
            return fresh

    def changes(self, root: str, table: str, old: Version, new: Version) -> Changes | None:
        """What ``table``'s commits from ``old`` to ``new`` changed (``None``: cannot be
        told, or another table set: everything must be read again). Reads the steps
        it has not seen yet: call it off the event loop."""
        return self._changes(root, table, old, new)

    def _changes(self, root: str, table: str, old: Version, new: Version, *, read: bool = True) -> Changes | None:
        if old[:2] != new[:2] or new[2] < old[2]:
            return None
        if old == new:
            return NO_CHANGES
        with self._lock:
            feed = self._feeds.get((root, table, old[:2]))
            if feed is None:
                id_column, session_column, row_columns = _CHANGE_COLUMNS[table]
                feed = TableChanges(os.path.join(root, f"{table}.lance"), id_column, session_column, row_columns)
                if len(self._feeds) >= _FEEDS_MAX:
                    self._feeds.clear()
                self._feeds[(root, table, old[:2])] = feed
        return feed.between(old[2], new[2], read=read)

    def unchanged(self, root: str, table: str, scope: Scope, old: Version, new: Version) -> bool:
        """Whether no commit of ``table`` from ``old`` to ``new`` touched the space (what
        was counted in it at ``old`` still holds at ``new``)."""
        changes = self._changes(root, table, old, new)
        return changes is not None and changes.of(scope.team_id, scope.user_id) is None

    def lists_need_rows(self, root: str, scope: Scope) -> bool:
        """Whether a search in this space should read whole rows with its candidate
        lists: when the space has no entry yet, or its last search had candidates that
        were neither cached nor in a session it read (a guess either way: the results
        do not depend on it)."""
        with self._lock:
            entry = self._spaces.entries.get(space_key(root, scope))
            return entry is None or entry.row_misses > 0

    def add_memories(
        self,
        entry: SpaceCache,
        version: Version,
        rows: Sequence[dict[str, Any]] = (),
        absent: Iterable[str] = (),
        sessions: Mapping[str, SessionMemories] | None = None,
    ) -> None:
        """File memory rows (and ids found absent by an unfiltered lookup, and fully read
        sessions) read at ``version`` of ``memories``. When the space's entry moved on
        meanwhile (a search slower than the commits beside it), what the commits since
        wrote in the space is left out and the rest filed in the newer entry; ignored
        when that cannot be told without reading a step."""
        target, changed = self._filing_target(entry.key, MEMORIES, version)
        if target is None:
            return
        if changed is not None:
            rows = [r for r in rows if r["memory_id"] not in changed.ids]
            absent = [m for m in absent if m not in changed.ids]
            sessions = {
                s: sm for s, sm in (sessions or {}).items()
                if s not in changed.sessions and changed.ids.isdisjoint(sm.memory_ids)
            }
        with self._lock:
            if self._spaces.entries.get(target.key) is not target:
                return
            before = target.size
            target._add_memories(rows, absent)
            if sessions:
                target.session_memories.update(sessions)
            self._spaces.total += target.size - before
            self._evict(target)

    def add_turns(
        self,
        entry: SpaceCache,
        version: Version,
        turns: Sequence[Turn] = (),
        absent: Iterable[str] = (),
        sessions: Mapping[str, SessionTurns] | None = None,
    ) -> None:
        """File turns (and ids found absent, and fully read sessions) read at ``version``
        of ``messages``; into a newer entry as :meth:`add_memories` does."""
        target, changed = self._filing_target(entry.key, MESSAGES, version)
        if target is None:
            return
        if changed is not None:
            turns = [t for t in turns if t.message_id not in changed.ids]
            absent = [m for m in absent if m not in changed.ids]
            sessions = {
                s: st for s, st in (sessions or {}).items()
                if s not in changed.sessions and changed.ids.isdisjoint(st.turns)
            }
        with self._lock:
            if self._spaces.entries.get(target.key) is not target:
                return
            before = target.size
            target._add_turns(turns, absent)
            for session, read in (sessions or {}).items():
                if session not in target.session_turns:
                    target.turn_rows += len(read.turns)
                target.session_turns[session] = read
            self._spaces.total += target.size - before
            self._evict(target)

    def _filing_target(self, key: SpaceKey, table: str, version: Version) -> tuple[SpaceCache | None, SpaceChanges | None]:
        """The entry rows of ``table`` read at ``version`` may be filed in: the space's
        entry if it is at that version (no changes to leave out), or a later one with
        what the commits in between changed in the space (steps already read only:
        this runs on the event loop of a search's reads). ``None``: file nothing."""
        with self._lock:
            now = self._spaces.entries.get(key)
        if now is None:
            return None, None
        held = now.memories_version if table == MEMORIES else now.messages_version
        if held == version:
            return now, None
        if held[:2] != version[:2] or held[2] < version[2]:
            return None, None
        changes = self._changes(key[0], table, version, held, read=False)
        if changes is None:
            return None, None
        return now, changes.of(key[1], key[2]) or _UNTOUCHED

    def _evict(self, keep: SpaceCache) -> None:
        """Drop the least recently searched spaces until the rows fit; a space that alone
        exceeds the bound starts over."""
        if keep.size > self.max_rows:
            self._spaces.drop(keep.key)
        while self._spaces.total > self.max_rows:
            oldest = next((k for k in self._spaces.entries if k != keep.key), None)
            if oldest is None:
                break
            self._spaces.drop(oldest)

    def entry_of(self, root: str, scope: Scope) -> SpaceCache | None:
        """The space's current entry, if any (for tests and diagnostics)."""
        with self._lock:
            return self._spaces.entries.get(space_key(root, scope))

    def cached_rows(self) -> int:
        """Memory rows and turns held over every space (for tests and diagnostics)."""
        with self._lock:
            return self._spaces.total

    def stats(self) -> dict[str, int]:
        """What the cache holds now and its bounds (for the serving process's metrics):
        spaces and rows of the row cache, the tables' steps kept to carry it; spaces,
        memories and bytes of the kept vectors and text indexes."""
        with self._lock:
            spaces, rows = len(self._spaces.entries), self._spaces.total
            feeds = list(self._feeds.values())
        kept_spaces, kept_memories, kept_bytes = self.vectors.held()
        return {
            "spaces": spaces,
            "rows": rows,
            "rows_max": self.max_rows,
            "change_steps": sum(f.kept_steps() for f in feeds),
            "kept_spaces": kept_spaces,
            "kept_memories": kept_memories,
            "kept_memories_max": self.vectors.max_rows,
            "kept_bytes": kept_bytes,
        }

    def clear(self) -> None:
        """Forget everything (a process that wants its memory back)."""
        with self._lock:
            self._spaces.clear()
            self._feeds.clear()
            self._speakers.clear()
            self._sizes.clear()
            self._frequencies.clear()
        self.vectors.clear()

    # ---------------------------------------------------------------- space facts
    def speakers(self, key: SpaceKey, now: float) -> frozenset[str] | None:
        """The space's speakers kept until a time after ``now``, if any."""
        with self._lock:
            hit = self._speakers.get(key)
        return hit[1] if hit is not None and hit[0] > now else None

    def keep_speakers(self, key: SpaceKey, until: float, speakers: frozenset[str]) -> None:
        with self._lock:
            if len(self._speakers) >= FACTS_MAX:
                self._speakers.clear()
            self._speakers[key] = (until, speakers)

    def size(self, key: SpaceKey) -> tuple[Version, int] | None:
        """The space's memory count and the version of ``memories`` it was counted at."""
        with self._lock:
            return self._sizes.get(key)

    def keep_size(self, key: SpaceKey, version: Version, total: int) -> None:
        with self._lock:
            if len(self._sizes) >= FACTS_MAX:
                self._sizes.clear()
            self._sizes[key] = (version, total)

    def frequencies(self, key: SpaceKey) -> tuple[Version, dict[str, int], bool] | None:
        """The space's entity counts, the version of ``entities`` they were read at, and
        whether they hold every name of the space (a name not there counts 0)."""
        with self._lock:
            return self._frequencies.get(key)

    def keep_frequencies(self, key: SpaceKey, version: Version, counts: dict[str, int], complete: bool = False) -> None:
        with self._lock:
            if len(self._frequencies) >= FACTS_MAX:
                self._frequencies.clear()
            self._frequencies[key] = (version, counts, complete)


def _carried(
    fresh: SpaceCache, entry: SpaceCache, scope: Scope, memories: Changes | None, messages: Changes | None
) -> None:
    """Fill ``fresh`` with what of ``entry`` still holds at ``fresh``'s versions: a half
    whose table did not move, or moved without touching the space, as it is; else with
    the rows written since in the space brought in (the sessions they are in with
    them), or without those rows and sessions when the step kept no rows (new
    dictionaries: other searches may still read the old ones)."""
    team, user = scope.team_id, scope.user_id
    pin = agent_pin(scope)
    if messages is not None:
        changed = messages.of(team, user)
        if changed is None:
            fresh.turns, fresh.session_turns, fresh.turn_rows = entry.turns, entry.session_turns, entry.turn_rows
        else:
            stale = set(changed.sessions)
            stale.update(t.session_id or "" for m in changed.ids if isinstance(t := entry.turns.get(m), Turn))
            fresh.turns = {m: t for m, t in entry.turns.items() if m not in changed.ids}
            fresh.session_turns = {s: st for s, st in entry.session_turns.items() if s not in stale}
            if changed.rows is not None:
                written = turns_of(_pinned(changed.rows, pin))
                fresh.turns.update((t.message_id, t) for t in written)
                for s in stale & entry.session_turns.keys():
                    kept = [t for m, t in entry.session_turns[s].turns.items() if m not in changed.ids]
                    fresh.session_turns[s] = SessionTurns([*kept, *(t for t in written if t.session_id == s)])
            fresh.turn_rows = len(fresh.turns) + sum(len(st.turns) for st in fresh.session_turns.values())
    if memories is not None:
        changed = memories.of(team, user)
        if changed is None:
            fresh.memories, fresh.session_memories = entry.memories, entry.session_memories
            fresh.memory_rows = entry.memory_rows
        else:
            stale = set(changed.sessions)
            stale.update(
                row.get("session_id") or "" for m in changed.ids if isinstance(row := entry.memories.get(m), dict)
            )
            fresh.memories = {m: r for m, r in entry.memories.items() if m not in changed.ids}
            fresh.session_memories = {s: sm for s, sm in entry.session_memories.items() if s not in stale}
            if changed.rows is not None:
                rows = rows_of(_pinned(changed.rows, pin).select(list(READ_COLUMNS)), scope)
                fresh.memories.update((r["memory_id"], r) for r in rows)
                for s in stale & entry.session_memories.keys():
                    kept = [fresh.memories.get(m) for m in entry.session_memories[s].memory_ids if m not in changed.ids]
                    if all(isinstance(r, dict) for r in kept):  # always: a cached session's rows are cached
                        added = [r for r in rows if r.get("session_id") == s]
                        fresh.session_memories[s] = SessionMemories([*kept, *added])  # type: ignore[list-item]
            fresh.memory_rows = len(fresh.memories)


def _pinned(rows: pa.Table, pin: str | None) -> pa.Table:
    """The rows a read pinned to agent ``pin`` sees (all without a pin)."""
    return rows.filter(pc.equal(rows.column("agent_id"), pin)) if pin else rows
