"""Which memory spaces, rows and sessions a table's recent commits changed, read from
Lance's own record of each commit.

Why: the projector commits a few times a second under a steady stream of writes, and
each commit is a new version of the whole table. A reader's search cache
(``memstream.projections.search_cache``) that dropped everything at every version
read every space again after each commit, although a commit touches a handful of
rows in one or two spaces. This module tells, for a step from one version to a
later one, exactly what changed, so the cache drops only that.

How: per version ``v``, the fragments of ``v`` are compared with those of ``v - 1``
(fragment ids are never reused) and ``v``'s transaction is read:

* nothing added, removed or newly deleted (an index update, a reserved id, a config
  change): nothing changed;
* a ``Rewrite`` (compaction): rows moved between files, none changed;
* an ``Append``, or an ``Update`` that rewrites rows (``merge_insert``, the
  projector's upsert): the rows of the fragments added at ``v`` are every row
  written; the rows it deleted are older copies of those same keys. Their
  ``team_id``, ``user_id``, id column and session (when the table has one) are read;
* anything else (a ``Delete``, an overwrite, a restore, an unknown operation, a
  version already cleaned up): the step cannot be told, and :meth:`TableChanges.between`
  answers ``None``: the caller must drop what it holds of the table.

Steps are read once per process and kept (the last :data:`STEPS_KEPT`), so many
spaces catching up over the same versions cost one read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import lance
from lance import LanceOperation

__all__ = ["SpaceChanges", "Changes", "TableChanges", "STEPS_KEPT"]

STEPS_KEPT = 4096
"""Version steps kept per table (a few bytes each when nothing changed)."""


@dataclass(frozen=True)
class SpaceChanges:
    """What changed in one memory space: the ids of the rows written (new or
    replaced) and the sessions they belong to."""

    ids: frozenset[str]
    sessions: frozenset[str]


class Changes:
    """What changed between two versions, per memory space ``(team_id, user_id)``."""

    __slots__ = ("_spaces",)

    def __init__(self, spaces: dict[tuple[str, str], SpaceChanges]) -> None:
        self._spaces = spaces

    def of(self, team_id: str, user_id: str) -> SpaceChanges | None:
        """The space's changes, or ``None`` when the space was not touched."""
        return self._spaces.get((team_id, user_id))

    @classmethod
    def union(cls, steps: list["Changes"]) -> "Changes":
        if len(steps) == 1:
            return steps[0]
        ids: dict[tuple[str, str], set[str]] = {}
        sessions: dict[tuple[str, str], set[str]] = {}
        for step in steps:
            for space, sc in step._spaces.items():
                ids.setdefault(space, set()).update(sc.ids)
                sessions.setdefault(space, set()).update(sc.sessions)
        return cls({s: SpaceChanges(frozenset(ids[s]), frozenset(sessions[s])) for s in ids})


_NOTHING = Changes({})


class TableChanges:
    """The steps of one table (``<root>/<table>.lance``), read on demand and kept.
    Thread-safe: one thread reads a step, the others wait for it."""

    def __init__(self, path: str, id_column: str, session_column: str | None) -> None:
        self.path = path
        self.columns = ["team_id", "user_id", id_column, *([session_column] if session_column else [])]
        self._steps: OrderedDict[int, Changes | None] = OrderedDict()
        self._lock = threading.Lock()
        self._dataset: Any = None
        self._last: tuple[int, dict[int, Any]] | None = None
        """The fragments of the last version read (the next step starts from them)."""

    def between(self, begin: int, end: int) -> Changes | None:
        """What versions ``begin + 1`` .. ``end`` changed (``None``: cannot be told)."""
        if end < begin:
            return None
        if end == begin:
            return _NOTHING
        with self._lock:
            steps: list[Changes] = []
            for version in range(begin + 1, end + 1):
                step = self._step(version)
                if step is None:
                    return None
                if step is not _NOTHING:
                    steps.append(step)
            return Changes.union(steps) if steps else _NOTHING

    def _step(self, version: int) -> Changes | None:
        if version in self._steps:
            self._steps.move_to_end(version)
            return self._steps[version]
        try:
            step = self._read_step(version)
        except Exception:  # noqa: BLE001 - a version cleaned up, a file gone: cannot be told
            step = None
        self._steps[version] = step
        while len(self._steps) > STEPS_KEPT:
            self._steps.popitem(last=False)
        return step

    def _at(self, version: int) -> Any:
        if self._dataset is None:
            self._dataset = lance.dataset(self.path)
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
        transaction = after.read_transaction(version)
        op = transaction.operation if transaction is not None else None
        if isinstance(op, LanceOperation.Rewrite):
            return _NOTHING
        rewrites_rows = isinstance(op, LanceOperation.Update) and op.update_mode != "rewrite_columns"
        if not (isinstance(op, LanceOperation.Append) or rewrites_rows):
            return None
        ids: dict[tuple[str, str], set[str]] = {}
        sessions: dict[tuple[str, str], set[str]] = {}
        table = after.scanner(columns=self.columns, fragments=[after.get_fragment(i) for i in added]).to_table()
        columns = [table.column(c).to_pylist() for c in self.columns]
        for team, user, key, *session in zip(*columns):
            ids.setdefault((team, user), set()).add(key)
            if session and session[0]:
                sessions.setdefault((team, user), set()).add(session[0])
        return Changes(
            {space: SpaceChanges(frozenset(keys), frozenset(sessions.get(space, ()))) for space, keys in ids.items()}
        )
