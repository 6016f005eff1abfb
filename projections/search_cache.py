"""What hybrid search has read of a memory space, kept while its tables stand still.

Why: memstream's conversation-aware ranking (``memstream.projections.search``) needs,
besides the two candidate lists, the candidates' sessions: every turn of each session
in log order (neighbouring turns, who spoke, which turn asks something) and every
memory drawn from them. On LoCoMo those reads and turning their rows into Python cost
more than the vector and BM25 queries together, while a conversation's questions keep
landing in the same sessions and on the same memories. Those rows change only when
their table gets a new version, so they are kept per memory space and per table
version, and a search reads only what is not here yet.

Correctness:

* an entry holds rows read at one version of ``memories`` and one of ``messages``.
  Every search first asks both tables for their current version (with LanceDB's
  ``read_consistency_interval`` a handle then checks for newer commits, as a query
  would) and :func:`space_cache` drops the half of the entry whose table moved: a new
  or changed row is never hidden by an old copy. Rows read while a write lands may be
  newer than the version they are filed under (never older: a reader only merges into
  the entry of the version it started from, see :meth:`SpaceCache.current`);
* isolation: entries are keyed by (store directory, ``team_id``, ``user_id``, the
  agent a read is pinned to: :func:`space_key`) and
  filled only from reads under the space's predicate or its scoped keys
  (``LanceStore.ids_where``), so an entry never holds another space's row, and a
  search only ever looks up its own space's entry;
* a version is the table directory's identity with LanceDB's version number
  (:func:`table_identity`): a replayed table set swapped in under a running reader
  starts its numbers again, in other directories, so the old set's entries never
  pass for it.

Memory is bounded: at most :data:`CACHE_MAX_ROWS` memory rows and turns over all
spaces; the least recently searched spaces go first. A space read under constant
writes simply reads again after each version change, as search did before it had a
cache.

Entries are shared by threads: their dictionaries are only ever added to or looked up
(never iterated while another thread may add), and a half that moved is replaced by
a fresh dictionary, never cleared in place.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memstream.domain.access import ReadScope, agent_pin
from memstream.domain.events import Scope
from memstream.domain.ranking import is_question
from memstream.projections.schema import ENTITIES, MEMORIES, MESSAGES
from memstream.projections.table_changes import Changes, TableChanges

NO_CHANGES = Changes({})

__all__ = [
    "CACHE_MAX_ROWS",
    "Version",
    "table_identity",
    "Turn",
    "Line",
    "SessionTurns",
    "SessionMemories",
    "SpaceCache",
    "space_cache",
    "space_key",
    "SpaceKey",
    "unchanged",
    "lists_need_rows",
    "add_memories",
    "add_turns",
    "clear",
    "entry_of",
    "cached_rows",
    "step",
]

SpaceKey = tuple[str, str, str, str]
"""(store directory, team, user, pinned agent or ""): what one cache entry belongs to."""

CACHE_MAX_ROWS = 30_000
"""Memory rows and turns kept over every memory space together: about 2.2 KB of Python
objects each (measured on LoCoMo), so at most about 65 MB. A LoCoMo conversation
holds about 550 of each."""

Version = tuple[int, int, int]
"""Which state of a table rows were read at: the table directory's device and inode
(:func:`table_identity`), then LanceDB's version number."""

Line = list[tuple[int, str]]
"""A session's turns on one partition in log order: ``(offset, message_id)``, sorted."""


def table_identity(root: str, table: str) -> tuple[int, int]:
    """The device and inode of ``<root>/<table>.lance``, the first two parts of a
    :data:`Version`. A replayed table set swapped in under a running reader starts its
    version numbers again, in another directory, so its versions never pass for the
    old set's. Take it before asking LanceDB for the version number (a swap in
    between then costs a read, never a stale answer)."""
    try:
        st = os.stat(os.path.join(root, f"{table}.lance"))
    except OSError:
        return (0, 0)
    return (st.st_dev, st.st_ino)


class Turn:
    """The L0 turn a memory was drawn from: who said it, where it sits in the log.
    Whether it asks something is worked out only for the turns that need it (a
    search looks at a few turns of each session it reads) and then kept."""

    __slots__ = ("message_id", "session_id", "partition", "offset", "speaker", "_content", "_question")

    def __init__(
        self, message_id: str, session_id: str | None, partition: int, offset: int, speaker: str | None, content: str
    ) -> None:
        self.message_id = message_id
        self.session_id = session_id
        self.partition = partition
        self.offset = offset
        self.speaker = speaker
        self._content = content
        self._question: bool | None = None

    @property
    def question(self) -> bool:
        if self._question is None:
            self._question = is_question(self._content)
        return self._question

    @property
    def line_key(self) -> tuple[str | None, int]:
        """The line of the log this turn is on: its session on its partition."""
        return (self.session_id, self.partition)


def step(line: Sequence[tuple[int, str]], turn: Turn, forward: bool) -> str | None:
    """The message id of the turn before (or after) ``turn`` on its ``line``, if any.
    Turns that share an offset (written without a log position) count as one place."""
    i = bisect.bisect_left(line, turn.offset, key=_offset_of)
    if forward:
        j = i + 1 if i < len(line) and line[i][0] == turn.offset else i
        return line[j][1] if j < len(line) else None
    return line[i - 1][1] if i > 0 else None


def _offset_of(entry: tuple[int, str]) -> int:
    return entry[0]


class SessionTurns:
    """Every turn of one session (``messages`` rows with that ``session_id``), by
    message id, on its lines in log order, and who spoke in it. Immutable once built."""

    __slots__ = ("turns", "lines", "speakers")

    def __init__(self, turns: Iterable[Turn]) -> None:
        self.turns: dict[str, Turn] = {t.message_id: t for t in turns}
        lines: dict[tuple[str | None, int], Line] = {}
        for t in self.turns.values():
            lines.setdefault(t.line_key, []).append((t.offset, t.message_id))
        for line in lines.values():
            line.sort()
        self.lines = lines
        self.speakers = frozenset(t.speaker for t in self.turns.values() if t.speaker)


class SessionMemories:
    """Every memory of one session (``memories`` rows with that ``session_id``, in the
    read's order), and which of them each turn was drawn into. Immutable once built."""

    __slots__ = ("memory_ids", "citing")

    def __init__(self, rows: Iterable[Mapping[str, Any]]) -> None:
        ids: list[str] = []
        citing: dict[str, list[str]] = {}
        for row in rows:
            mid = row["memory_id"]
            ids.append(mid)
            for source in dict.fromkeys(row.get("source_message_ids") or ()):
                citing.setdefault(source, []).append(mid)
        self.memory_ids: tuple[str, ...] = tuple(ids)
        self.citing: dict[str, tuple[str, ...]] = {m: tuple(v) for m, v in citing.items()}


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

    # ---------------------------------------------------------------- adding (under _LOCK)
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


_LOCK = threading.Lock()
_SPACES = _Registry()
_FEEDS: dict[tuple[str, str, tuple[int, int]], TableChanges] = {}
"""Each table's steps, per (store directory, table, table identity)."""
_FEEDS_MAX = 64
_CHANGE_COLUMNS: dict[str, tuple[str, str | None]] = {
    MEMORIES: ("memory_id", "session_id"),
    MESSAGES: ("message_id", "session_id"),
    ENTITIES: ("name_key", None),
}


def space_key(root: str, scope: Scope | ReadScope) -> SpaceKey:
    """What a cache of one read scope is keyed by: a read pinned to an agent has its
    own entries, filled under its own (agent-narrowed) predicate."""
    return (root, scope.team_id, scope.user_id, agent_pin(scope) or "")


_key = space_key


def space_cache(root: str, scope: Scope, memories_version: Version, messages_version: Version) -> SpaceCache:
    """The space's entry at these table versions: the same entry when nothing moved,
    else an entry carried forward: of a table that moved, only what its commits
    since changed in this space is dropped (:func:`_carried`); all of it when that
    cannot be told. Reads the steps it has not seen yet (see
    ``memstream.projections.table_changes``): call it off the event loop."""
    key = _key(root, scope)
    with _LOCK:
        entry = _SPACES.entries.get(key)
        if entry is not None and entry.current(memories_version, messages_version):
            _SPACES.entries.move_to_end(key)
            return entry
    memories = _changes(root, MEMORIES, entry.memories_version, memories_version) if entry else None
    messages = _changes(root, MESSAGES, entry.messages_version, messages_version) if entry else None
    with _LOCK:
        now = _SPACES.entries.get(key)
        if now is not None and now.current(memories_version, messages_version):
            _SPACES.entries.move_to_end(key)
            return now  # another search carried it meanwhile
        fresh = SpaceCache(key, memories_version, messages_version)
        if now is not None and now is entry:
            _carried(fresh, entry, scope, memories, messages)
        _SPACES.put(fresh)
        return fresh


def _changes(root: str, table: str, old: Version, new: Version) -> Changes | None:
    """What ``table``'s commits from ``old`` to ``new`` changed (``None``: cannot be
    told, or another table set: everything must be read again)."""
    if old[:2] != new[:2] or new[2] < old[2]:
        return None
    if old == new:
        return NO_CHANGES
    with _LOCK:
        feed = _FEEDS.get((root, table, old[:2]))
        if feed is None:
            id_column, session_column = _CHANGE_COLUMNS[table]
            feed = TableChanges(os.path.join(root, f"{table}.lance"), id_column, session_column)
            if len(_FEEDS) >= _FEEDS_MAX:
                _FEEDS.clear()
            _FEEDS[(root, table, old[:2])] = feed
    return feed.between(old[2], new[2])


def unchanged(root: str, table: str, scope: Scope, old: Version, new: Version) -> bool:
    """Whether no commit of ``table`` from ``old`` to ``new`` touched the space (what
    was counted in it at ``old`` still holds at ``new``)."""
    changes = _changes(root, table, old, new)
    return changes is not None and changes.of(scope.team_id, scope.user_id) is None


def _carried(
    fresh: SpaceCache, entry: SpaceCache, scope: Scope, memories: Changes | None, messages: Changes | None
) -> None:
    """Fill ``fresh`` with what of ``entry`` still holds at ``fresh``'s versions: a half
    whose table did not move, or moved without touching the space, as it is; else
    without the rows written since and the sessions they are in (new dictionaries:
    other searches may still read the old ones)."""
    team, user = scope.team_id, scope.user_id
    if messages is not None:
        changed = messages.of(team, user)
        if changed is None:
            fresh.turns, fresh.session_turns, fresh.turn_rows = entry.turns, entry.session_turns, entry.turn_rows
        else:
            stale = set(changed.sessions)
            stale.update(t.session_id or "" for m in changed.ids if isinstance(t := entry.turns.get(m), Turn))
            fresh.turns = {m: t for m, t in entry.turns.items() if m not in changed.ids}
            fresh.session_turns = {s: st for s, st in entry.session_turns.items() if s not in stale}
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
            fresh.memory_rows = len(fresh.memories)


def lists_need_rows(root: str, scope: Scope) -> bool:
    """Whether a search in this space should read whole rows with its candidate lists:
    when the space has no entry yet, or its last search had candidates that were
    neither cached nor in a session it read. Their rows are then read anyway, and
    with the lists that costs less than by id afterwards; once the cache holds what the
    space's searches bring back, the lists read only ids (a guess either way: the
    results do not depend on it)."""
    with _LOCK:
        entry = _SPACES.entries.get(_key(root, scope))
        return entry is None or entry.row_misses > 0


def add_memories(
    entry: SpaceCache,
    version: Version,
    rows: Sequence[dict[str, Any]] = (),
    absent: Iterable[str] = (),
    sessions: Mapping[str, SessionMemories] | None = None,
) -> None:
    """File memory rows (and ids found absent by an unfiltered lookup, and fully read
    sessions) read at ``version`` of ``memories``; ignored when the entry moved on."""
    with _LOCK:
        if _SPACES.entries.get(entry.key) is not entry or not entry.current(version, None):
            return
        before = entry.size
        entry._add_memories(rows, absent)
        if sessions:
            entry.session_memories.update(sessions)
        _SPACES.total += entry.size - before
        _evict(entry)


def add_turns(
    entry: SpaceCache,
    version: Version,
    turns: Sequence[Turn] = (),
    absent: Iterable[str] = (),
    sessions: Mapping[str, SessionTurns] | None = None,
) -> None:
    """File turns (and ids found absent, and fully read sessions) read at ``version``
    of ``messages``; ignored when the entry moved on."""
    with _LOCK:
        if _SPACES.entries.get(entry.key) is not entry or not entry.current(None, version):
            return
        before = entry.size
        entry._add_turns(turns, absent)
        for session, read in (sessions or {}).items():
            if session not in entry.session_turns:
                entry.turn_rows += len(read.turns)
            entry.session_turns[session] = read
        _SPACES.total += entry.size - before
        _evict(entry)


def _evict(keep: SpaceCache) -> None:
    """Drop the least recently searched spaces until the rows fit; a space that alone
    exceeds the bound starts over."""
    if keep.size > CACHE_MAX_ROWS:
        _SPACES.drop(keep.key)
    while _SPACES.total > CACHE_MAX_ROWS:
        oldest = next((k for k in _SPACES.entries if k != keep.key), None)
        if oldest is None:
            break
        _SPACES.drop(oldest)


def entry_of(root: str, scope: Scope) -> SpaceCache | None:
    """The space's current entry, if any (for tests and diagnostics)."""
    with _LOCK:
        return _SPACES.entries.get(_key(root, scope))


def cached_rows() -> int:
    """Memory rows and turns held over every space (for tests and diagnostics)."""
    with _LOCK:
        return _SPACES.total


def clear() -> None:
    """Forget every entry (tests; a process that wants its memory back)."""
    with _LOCK:
        _SPACES.clear()
        _FEEDS.clear()
