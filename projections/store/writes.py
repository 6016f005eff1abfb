"""The projector's writes: upserts by key (appends when the key is certainly new) and
replacing an owner's rows."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memstream.projections.store.key_filter import KeyFilter
from memstream.projections.schema import ENTITIES, MEMORIES, MESSAGES
from memstream.projections.store.filters import chunked, in_list
from memstream.projections.store.tables import StoreTables

__all__ = ["StoreWrites", "APPEND_WHEN_NEW"]

APPEND_WHEN_NEW = frozenset({MEMORIES, MESSAGES, ENTITIES})
"""Tables written at the rate of the log: new keys are appended, not merged."""


class StoreWrites(StoreTables):
    """Upserts and owner replacement (the projector is the only writer)."""

    def upsert(self, name: str, rows: pa.Table) -> tuple[int, int]:
        """Insert or replace whole rows by ``pk``. The rows must have unique keys
        (LanceDB rejects "ambiguous merge inserts"); callers dedupe first. Returns
        (rows inserted, rows updated).

        Rows whose key the table certainly lacks (:class:`KeyFilter`) are appended;
        the others go through ``merge_insert``, whose cost grows with the table. Two
        commits then, not one: a crash between them leaves some rows of the batch
        written and its positions unsaved, and applying the batch again changes
        nothing, as after any crash before the positions are saved."""
        if rows.num_rows == 0:
            return 0, 0
        keys = rows.column("pk")
        if pc.count_distinct(keys).as_py() != rows.num_rows:
            raise ValueError(f"upsert into {name}: duplicate keys in one batch")
        if name not in APPEND_WHEN_NEW:
            return self._merge(name, rows)
        pks = keys.to_pylist()
        known = self._key_filter(name)
        absent = known.absent(pks)
        n_new = sum(absent)
        try:
            if n_new == rows.num_rows:
                self.table(name).add(rows)
                inserted, updated = n_new, 0
            else:
                mask = pa.array(absent, type=pa.bool_())
                if n_new:
                    self.table(name).add(rows.filter(mask))
                inserted, updated = self._merge(name, rows.filter(pc.invert(mask)))
                inserted += n_new
        except BaseException:
            self._key_filters.pop(name, None)  # unsure what committed: reload next time
            raise
        known.add(pks)
        return inserted, updated

    def _merge(self, name: str, rows: pa.Table) -> tuple[int, int]:
        result = (
            self.table(name)
            .merge_insert("pk")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute(rows)
        )
        return int(result.num_inserted_rows), int(result.num_updated_rows)

    def prepare_writes(self) -> None:
        """Load what the first write would otherwise load on its way: the key filters of
        the tables written at the rate of the log (their stored keys) and the Lance
        modules behind them. A writer calls this when it starts, so the first batch
        it projects pays none of it."""
        for name in sorted(APPEND_WHEN_NEW):
            self._key_filter(name)
        # Arrow's first conversion of a NumPy array (the vector column) imports NumPy's
        # masked arrays, once: in the middle of the first batch otherwise.
        pa.array(np.zeros(1, dtype=np.float32))

    def key_absent(self, name: str, pks: Sequence[str]) -> list[bool]:
        """Per key: True when the table certainly lacks it (its key filter; tables
        without one answer False, "maybe stored")."""
        if name not in APPEND_WHEN_NEW:
            return [False] * len(pks)
        return self._key_filter(name).absent(list(pks))

    def _key_filter(self, name: str) -> KeyFilter:
        """The table's key filter, (re)built from its stored keys when missing or full."""
        found = self._key_filters.get(name)
        if found is None or found.full:
            found = KeyFilter(self._stored_keys(name), self.count(name))
            self._key_filters[name] = found
        return found

    def _stored_keys(self, name: str) -> Iterator[str]:
        for batch in self.table(name).to_lance().to_batches(columns=["pk"], batch_size=65_536):
            yield from batch.column(0).to_pylist()

    def replace_rows(self, name: str, rows: pa.Table, owner_column: str, owners: Sequence[str]) -> None:
        """Upsert ``rows`` and delete the rows of the same ``owners`` that ``rows`` no
        longer contains, in one commit (merge insert with "not matched by source
        delete" limited to the owners). Used for the entity rows of re-added memories."""
        if not owners:
            return
        tbl = self.table(name)
        condition = " OR ".join(f"({in_list(owner_column, c)})" for c in chunked(list(owners)))
        if rows.num_rows == 0:
            tbl.delete(condition)
            return
        if pc.count_distinct(rows.column("pk")).as_py() != rows.num_rows:
            raise ValueError(f"upsert into {name}: duplicate keys in one batch")
        try:
            (
                tbl.merge_insert("pk")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .when_not_matched_by_source_delete(condition)
                .execute(rows)
            )
        except BaseException:
            self._key_filters.pop(name, None)
            raise
        if name in self._key_filters:  # deleted keys stay in it: a false positive, harmless
            self._key_filters[name].add(rows.column("pk").to_pylist())
