"""The LanceDB table set under one directory, as one object.

One :class:`LanceStore` owns one directory (``settings.storage.root``); a replay builds a
second store in a fresh directory and swaps it in. The projector is its only writer;
searches, the extractor's lookups and the CLI read through it. Its jobs live in their
own modules, and this class only puts them together so that every caller holds one
handle:

* ``tables``: opening and checking the tables, plain filtered reads;
* ``writes``: upserts and owner replacement;
* ``positions``: the projection's log positions;
* ``maintenance``: indexes, compaction, version cleanup, the replay digest;
* ``reads``: scoped lookups;
* ``filters``: the filter text (quoting, the isolation predicate).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memstream.projections.store.filters import (
    IN_LIST_CHUNK,
    EmbedderMismatchError,
    ScopeRequiredError,
    StoreError,
    chunked,
    in_list,
    quote,
    require_scope,
    space_where,
)
from memstream.projections.store.maintenance import COMPACT_TARGET_ROWS, SCALAR_INDEXES, VECTOR_REFINE_FACTOR, StoreMaintenance
from memstream.projections.store.reads import StoreReads
from memstream.projections.store.writes import StoreWrites

__all__ = [
    "LanceStore",
    "StoreError",
    "EmbedderMismatchError",
    "ScopeRequiredError",
    "quote",
    "space_where",
    "require_scope",
    "chunked",
    "in_list",
    "VECTOR_REFINE_FACTOR",
    "IN_LIST_CHUNK",
    "COMPACT_TARGET_ROWS",
    "SCALAR_INDEXES",
]


class LanceStore(StoreWrites, StoreMaintenance, StoreReads):
    """The projection's tables under ``root``: memories, messages, links, entities,
    reflections, decisions, positions (schemas in ``memstream.projections.schema``)."""

    def __init__(self, root: Path, **options: Any) -> None:
        """Opens (or creates) the tables as :class:`~memstream.projections.store.tables.StoreTables` does, with the same
        options; a writer's store also builds the base scalar indexes."""
        super().__init__(root, **options)
        if options.get("create", True):
            self.ensure_base_indexes()
