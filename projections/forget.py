"""Deleting a forgotten subject from the projection, down to the files on disk.

A LanceDB delete only marks rows deleted: the row bytes stay in the data files (and in
older table versions) until compaction rewrites the fragments and the old versions
are cleaned up. So forgetting deletes the subject's rows from every scoped table,
rewrites every fragment that holds a deletion, folds the change into the indexes and
removes every older version and the files only they used. A reader in another process
still on an older version must reopen (its files are gone): forgetting is rare and
must not wait for it.
"""

from __future__ import annotations

import datetime
import warnings
from typing import Any, Protocol

from memstream.projections.schema import POSITIONS, TABLE_NAMES

__all__ = ["SCOPED_TABLES", "subject_where", "delete_subject", "shred_deleted_rows"]

SCOPED_TABLES: tuple[str, ...] = tuple(name for name in TABLE_NAMES if name != POSITIONS)
"""Every table whose rows belong to one memory space (all but the positions)."""


class Tables(Protocol):
    def table(self, name: str) -> Any: ...


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def subject_where(team_id: str, user_id: str | None = None) -> str:
    """The predicate of one user's space, or of every space of a team."""
    where = f"team_id = {_quote(team_id)}"
    return where if user_id is None else f"{where} AND user_id = {_quote(user_id)}"


def delete_subject(store: Tables, team_id: str, user_id: str | None = None) -> dict[str, int]:
    """Delete the subject's rows from every scoped table; rows deleted per table."""
    where = subject_where(team_id, user_id)
    deleted: dict[str, int] = {}
    for name in SCOPED_TABLES:
        tbl = store.table(name)
        found = tbl.count_rows(where)
        if found:
            tbl.delete(where)
        deleted[name] = found
    return deleted


def shred_deleted_rows(store: Tables, tables: tuple[str, ...] = SCOPED_TABLES) -> None:
    """Rewrite the fragments holding deleted rows, refresh the indexes, and drop every
    older version with its files, so no deleted row stays in a table's files."""
    for name in tables:
        tbl = store.table(name)
        ds = tbl.to_lance()
        ds = ds.checkout_version(ds.latest_version)
        ds.optimize.compact_files(materialize_deletions=True, materialize_deletions_threshold=0.0)
        ds = ds.checkout_version(ds.latest_version)
        if ds.describe_indices():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                ds.optimize.optimize_indices()
        ds = ds.checkout_version(ds.latest_version)
        ds.cleanup_old_versions(older_than=datetime.timedelta(0), delete_unverified=True)
        tbl.checkout_latest()
