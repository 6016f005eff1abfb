"""Which memory spaces, rows and sessions a table's recent commits changed, read from
Lance's own record of each commit.

Why: the projector commits a few times a second under a steady stream of writes, and
each commit is a new version of the whole table. A reader's search cache
(``memstream.projections.search.cache``) that dropped everything at every version
read every space again after each commit, although a commit touches a handful of
rows in one or two spaces. This module tells, for a step from one version to a
later one, exactly what changed, so the cache drops only that.

How: per version ``v``, the fragments of ``v`` are compared with those of ``v - 1``
(fragment ids are never reused) and ``v``'s transaction is read:

* nothing added, removed or newly deleted (an index update, a reserved id, a config
  change): nothing changed;
* a ``Rewrite`` (compaction): rows moved between files, none changed (also when
  pylance cannot read its record back, see :func:`_operation`);
* an ``Append``, or an ``Update`` that rewrites rows (``merge_insert``, the
  projector's upsert): the rows of the fragments added at ``v`` are every row
  written; the rows it deleted are older copies of those same keys. Their
  ``team_id``, ``user_id``, id column and session (when the table has one) are read;
* with ``row_columns``, those columns of the written rows are kept too (for the newest
  :data:`ROWS_KEPT` steps), so a reader can update what it holds without reading
  the rows again;
* anything else (a ``Delete``, an overwrite, a restore, an unknown operation, a
  version already cleaned up): the step cannot be told, and :meth:`TableChanges.between`
  answers ``None``: the caller must drop what it holds of the table.

Steps are read once per process and kept (the last :data:`STEPS_KEPT`), so many
spaces catching up over the same versions cost one read.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import lance
import pyarrow as pa
import pyarrow.compute as pc
from cachetools import LRUCache
from lance import LanceOperation

__all__ = ["SpaceChanges", "Changes", "TableChanges", "STEPS_KEPT", "ROWS_KEPT"]

STEPS_KEPT = 4096
"""Version steps kept per table (a few bytes each when nothing changed)."""
ROWS_KEPT = 256
"""Newest steps whose written rows are kept (``row_columns``); older steps keep ids and
sessions only."""
METADATA_CACHE_BYTES = 16 << 20
"""Bound of the feed's own Lance metadata cache: each step checks out a version (its
manifest is read once; Lance's default cache, 1 GiB, kept every one of them)."""


@dataclass(frozen=True)
class SpaceChanges:
    """What changed in one memory space: the ids of the rows written (new or
    replaced) and the sessions they belong to; with ``row_columns``, the rows as
    written last (one per id; ``None`` when a step's rows are no longer kept)."""

    ids: frozenset[str]
    sessions: frozenset[str]
    rows: pa.Table | None = field(default=None, compare=False)


class Changes:
    """What changed between two versions, per memory space ``(team_id, user_id)``."""

    __slots__ = ("_spaces",)

    def __init__(self, spaces: dict[tuple[str, str], SpaceChanges]) -> None:
        self._spaces = spaces

    def of(self, team_id: str, user_id: str) -> SpaceChanges | None:
        """The space's changes, or ``None`` when the space was not touched."""
        return self._spaces.get((team_id, user_id))

    def without_rows(self) -> "Changes":
        """The same changes, their rows let go."""
        if all(sc.rows is None for sc in self._spaces.values()):
            return self
        return Changes({s: SpaceChanges(sc.ids, sc.sessions) for s, sc in self._spaces.items()})

    @classmethod
    def union(cls, steps: list["Changes"], id_column: str = "") -> "Changes":
        """The steps' changes together (in version order: a row written twice is
        kept as written last)."""
        if len(steps) == 1:
            return steps[0]
        ids: dict[tuple[str, str], set[str]] = {}
        sessions: dict[tuple[str, str], set[str]] = {}
        rows: dict[tuple[str, str], list[pa.Table] | None] = {}
        for step in steps:
            for space, sc in step._spaces.items():
                ids.setdefault(space, set()).update(sc.ids)
                sessions.setdefault(space, set()).update(sc.sessions)
                parts = rows.setdefault(space, [])
                if parts is not None and sc.rows is not None:
                    parts.append(sc.rows)
                else:
                    rows[space] = None
        return cls(
            {
                s: SpaceChanges(frozenset(ids[s]), frozenset(sessions[s]), _last_written(rows[s], id_column))
                for s in ids
            }
        )


def _last_written(parts: list[pa.Table] | None, id_column: str) -> pa.Table | None:
    """The rows of ``parts`` (in version order), the last copy of each id only."""
    if not parts:
        return None
    table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    last: dict[str, int] = {}
    for i, key in enumerate(table.column(id_column).to_pylist()):
        last[key] = i
    if len(last) == table.num_rows:
        return table
    return table.take(pa.array(sorted(last.values()), type=pa.int64()))


_NOTHING = Changes({})
_REWRITE_UNREAD = object()
"""A compaction whose record pylance could not read back (:func:`_operation`)."""


def _operation(dataset: Any, version: int) -> Any:
    """The operation of ``version``'s transaction (``None``: no record). pylance 14
    cannot build the record of a compaction that remapped indexes (its reader passes
    ``RewrittenIndex`` two of its five fields and raises ``TypeError``); only a
    ``Rewrite`` holds one, so that error names a compaction: :data:`_REWRITE_UNREAD`."""
    try:
        transaction = dataset.read_transaction(version)
    except TypeError as exc:
        if "RewrittenIndex" in str(exc):
            return _REWRITE_UNREAD
        raise
    return transaction.operation if transaction is not None else None


def _only_moved(before: dict[int, Any], now: dict[int, Any]) -> bool:
    """Whether a step from fragments ``before`` to ``now`` only moved rows: fragments
    replaced by others holding as many rows, no other fragment's deletions changed
    (what a compaction does; the check backs up :func:`_operation`'s reading)."""
    removed, added = before.keys() - now.keys(), now.keys() - before.keys()
    kept_same = all(before[i].deletion_file == now[i].deletion_file for i in before.keys() & now.keys())
    rows = sum(before[i].num_rows for i in removed) == sum(now[i].num_rows for i in added)
    return bool(removed) and kept_same and rows


class TableChanges:
    """The steps of one table (``<root>/<table>.lance``), read on demand and kept.
    Thread-safe: one thread reads a step, the others wait for it."""

    def __init__(
        self,
        path: str,
        id_column: str,
        session_column: str | None,
        row_columns: Sequence[str] = (),
        *,
        metadata_cache_bytes: int = METADATA_CACHE_BYTES,
    ) -> None:
        self.path = path
        self.metadata_cache_bytes = metadata_cache_bytes
        self.id_column = id_column
        self.columns = ["team_id", "user_id", id_column, *([session_column] if session_column else [])]
        self.row_columns = [c for c in row_columns if c not in self.columns]
        self._steps: LRUCache[int, Changes | None] = LRUCache(STEPS_KEPT)
        self._lock = threading.Lock()
        self._dataset: Any = None
        self._last: tuple[int, dict[int, Any]] | None = None
        """The fragments of the last version read (the next step starts from them)."""

    def kept_steps(self) -> int:
        """The steps kept (at most :data:`STEPS_KEPT`)."""
        return len(self._steps)

    def between(self, begin: int, end: int, *, read: bool = True) -> Changes | None:
        """What versions ``begin + 1`` .. ``end`` changed (``None``: cannot be told;
        without ``read``, also when a step has not been read yet or another thread is
        reading one: never waits on a read)."""
        if end < begin:
            return None
        if end == begin:
            return _NOTHING
        if not self._lock.acquire(blocking=read):  # another thread is reading a step
            return None
        try:
            steps: list[Changes] = []
            for version in range(begin + 1, end + 1):
                if not read and version not in self._steps:
                    return None
                step = self._step(version)
                if step is None:
                    return None
                if step is not _NOTHING:
                    steps.append(step)
            return Changes.union(steps, self.id_column) if steps else _NOTHING
        finally:
            self._lock.release()

    def cache_bytes(self) -> int:
        """What the feed's Lance caches hold now (diagnostics and tests)."""
        with self._lock:
            return int(self._dataset.session().size_bytes()) if self._dataset is not None else 0

    def _step(self, version: int) -> Changes | None:
        if version in self._steps:
            return self._steps[version]
        try:
            step = self._read_step(version)
        except Exception:  # noqa: BLE001 - a version cleaned up, a file gone: cannot be told
            step = None
        self._steps[version] = step
        stale = self._steps.get(version - ROWS_KEPT)
        if stale is not None and self.row_columns:
            self._steps[version - ROWS_KEPT] = stale.without_rows()
        return step

    def _at(self, version: int) -> Any:
        if self._dataset is None:
            self._dataset = lance.dataset(
                self.path, metadata_cache_size_bytes=self.metadata_cache_bytes, index_cache_size_bytes=1 << 20
            )
        return self._dataset.checkout_version(version)

    def _read_step(self, version: int) -> Changes | None:
        after = self._at(version)
        if self._last is not None and self._last[0] == version - 1:
            before = self._last[1]
        else:
            before = {f.fragment_id: f.metadata for f in self._at(version - 1).get_fragments()}
        now = {f.fragment_id: f.metadata for f in after.get_fragments()}
        self._last = (version, now)
        added = sorted(now.keys() - before.keys())
        moved = bool(added) or bool(before.keys() - now.keys()) or any(
            before[i].deletion_file != now[i].deletion_file for i in before.keys() & now.keys()
        )
        if not moved:
            return _NOTHING
        op = _operation(after, version)
        if op is _REWRITE_UNREAD:
            return _NOTHING if _only_moved(before, now) else None
        if isinstance(op, LanceOperation.Rewrite):
            return _NOTHING
        rewrites_rows = isinstance(op, LanceOperation.Update) and op.update_mode != "rewrite_columns"
        if not (isinstance(op, LanceOperation.Append) or rewrites_rows):
            return None
        ids: dict[tuple[str, str], set[str]] = {}
        sessions: dict[tuple[str, str], set[str]] = {}
        read = [*self.columns, *self.row_columns]
        table = after.scanner(columns=read, fragments=[after.get_fragment(i) for i in added]).to_table()
        columns = [table.column(c).to_pylist() for c in self.columns]
        for team, user, key, *session in zip(*columns):
            ids.setdefault((team, user), set()).add(key)
            if session and session[0]:
                sessions.setdefault((team, user), set()).add(session[0])
        return Changes(
            {
                space: SpaceChanges(
                    frozenset(keys), frozenset(sessions.get(space, ())), self._rows_of(table, space)
                )
                for space, keys in ids.items()
            }
        )

    def _rows_of(self, table: pa.Table, space: tuple[str, str]) -> pa.Table | None:
        """The written rows of one space (``None`` without ``row_columns``)."""
        if not self.row_columns:
            return None
        team, user = space
        mask = pc.and_(pc.equal(table.column("team_id"), team), pc.equal(table.column("user_id"), user))
        return table.filter(mask)
