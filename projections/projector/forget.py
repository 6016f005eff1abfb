"""Deleting a forgotten subject from the projection, down to the files on disk.

A LanceDB delete only marks rows deleted: the row bytes stay in the data files (and in
older table versions) until compaction rewrites the fragments and the old versions
are cleaned up. So forgetting deletes the subject's rows from every scoped table,
rewrites every fragment that holds a deletion, folds the change into the indexes and
removes the older versions and the files only they used. Versions younger than the
store's ``reader_grace`` (``storage.reader_grace_s``) stay for readers in other
processes that may still be on them (a search must not fail because its files
vanished); :func:`drop_old_versions` removes them once the grace has passed (the
projector calls it from its maintenance).
"""

from __future__ import annotations

import datetime
from typing import Any, Protocol

from memstream.projections.schema import POSITIONS, TABLE_NAMES
from memstream.projections.store import compact_and_reindex

__all__ = ["SCOPED_TABLES", "subject_where", "before_where", "delete_subject", "shred_deleted_rows", "drop_old_versions"]

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


def before_where(topic: str, partition: int, offset: int) -> str:
    """The rows last written from ``topic``'s ``partition`` below ``offset``: what a
    forget at that position covers. A forget is written to every topic the projector
    folds (the space's partition of each), so each marker covers its own topic's rows
    and a write after it, in any topic, is never covered."""
    return f"log_topic = {_quote(topic)} AND log_partition = {int(partition)} AND log_offset < {int(offset)}"


def delete_subject(
    store: Tables, team_id: str, user_id: str | None = None, before: tuple[str, int, int] | None = None
) -> dict[str, int]:
    """Delete the subject's rows from every scoped table (with ``before``, a forget's
    (topic, partition, offset): only the rows it covers); rows deleted per table."""
    where = subject_where(team_id, user_id)
    if before is not None:
        where = f"{where} AND {before_where(*before)}"
    deleted: dict[str, int] = {}
    for name in SCOPED_TABLES:
        tbl = store.table(name)
        found = tbl.count_rows(where)
        if found:
            tbl.delete(where)
        deleted[name] = found
    return deleted


def shred_deleted_rows(store: Tables, grace: datetime.timedelta, tables: tuple[str, ...] = SCOPED_TABLES) -> None:
    """Rewrite the fragments holding deleted rows, refresh the indexes, and drop the
    versions older than ``grace`` with their files; after :func:`drop_old_versions`
    (``grace`` later) no deleted row stays in a table's files."""
    for name in tables:
        compact_and_reindex(store.table(name), materialize_deletions=True, materialize_deletions_threshold=0.0)
    drop_old_versions(store, grace, tables)


def drop_old_versions(store: Tables, older_than: datetime.timedelta, tables: tuple[str, ...] = SCOPED_TABLES) -> None:
    """Remove the versions older than ``older_than`` and the files only they use."""
    for name in tables:
        ds = store.table(name).to_lance()
        ds = ds.checkout_version(ds.latest_version)
        ds.cleanup_old_versions(older_than=older_than, delete_unverified=True)
