"""The LanceDB table set under one directory, opened and checked: the base every part
of :class:`memstream.projections.store.lance_store.LanceStore` builds on (its writes,
maintenance and lookups), with the plain filtered reads they share.

LanceDB's synchronous API runs on LanceDB's own background event loop, so callers on
an asyncio loop run these in an executor thread.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Self

import lancedb
import pyarrow as pa

from memstream.projections.store.key_filter import KeyFilter
from memstream.projections.store.object_paths import RootPath, as_path, lance_options
from memstream.projections.schema import MEMORIES, TABLE_NAMES, schema_for
from memstream.projections.store.filters import EmbedderMismatchError, StoreError, chunked, in_list
from memstream.projections.store.table_sets import TableSets
from memstream.settings import READER_GRACE_S, StorageSettings

__all__ = ["LANCE_INDEX_CACHE_MB", "LANCE_METADATA_CACHE_MB", "StoreTables", "json_or_none"]

LANCE_METADATA_CACHE_MB = 16
"""LanceDB's metadata cache per open table set, reader or writer: both read at the newest
version, so old versions' manifests in a larger cache are only memory (the growth it
stopped is in docs/benchmarks-history.md)."""
LANCE_INDEX_CACHE_MB = 16
"""LanceDB's index cache per open table set: 64 MB searched no faster on 100,000
memories and kept growing (docs/benchmarks-history.md)."""


def json_or_none(text: str | None) -> Any:
    if text is None or text == "":
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


class StoreTables:
    """The projection's tables under ``root``: memories, messages, links, entities,
    reflections, decisions, positions (schemas in ``memstream.projections.schema``)."""

    _published: dict[str, int] | None
    _pinned: OrderedDict[tuple[str, int], Any]

    def __init__(
        self,
        root: RootPath,
        *,
        embedding_dim: int,
        read_consistency_interval: timedelta | None = None,
        vector_index_threshold: int = 100_000,
        reader_grace: timedelta = timedelta(seconds=READER_GRACE_S),
        create: bool = True,
        metadata_cache_bytes: int = LANCE_METADATA_CACHE_MB << 20,
        index_cache_bytes: int = LANCE_INDEX_CACHE_MB << 20,
    ) -> None:
        """``create=False`` opens an existing table set for reading only: nothing is
        created (no directory, table or index), and :class:`StoreError` is raised when
        a table is missing. A reader in the writer's process uses it to open the
        tables beside the writer without racing it to create them. ``reader_grace``:
        how long a replaced table version stays for readers (``storage.reader_grace_s``);
        ``metadata_cache_bytes`` / ``index_cache_bytes``: the bounds of LanceDB's
        metadata and index caches for these tables."""
        self.root: RootPath = as_path(root)
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        elif not self.root.is_dir():
            raise StoreError(f"{self.root} has no table set yet")
        self.embedding_dim = int(embedding_dim)
        self.vector_index_threshold = int(vector_index_threshold)
        self.reader_grace = reader_grace
        self._session = lancedb.Session(
            metadata_cache_size_bytes=metadata_cache_bytes, index_cache_size_bytes=index_cache_bytes
        )
        self._db = lancedb.connect(
            str(self.root),
            read_consistency_interval=read_consistency_interval,
            storage_options=lance_options(self.root),
            session=self._session,
        )
        existing = set(self._table_names())
        self._tables: dict[str, Any] = {}
        for name in TABLE_NAMES:
            schema = schema_for(name, self.embedding_dim)
            tbl = self._open(name) if name in existing else None
            if tbl is not None:
                self._check_schema(name, tbl.schema, schema)
            elif not create:
                raise StoreError(f"{self.root} has no table {name} yet")
            else:
                tbl = self._db.create_table(name, schema=schema, exist_ok=True)
            self._tables[name] = tbl
        self._vector_model: str | None = None
        self._vector_index_checked = float("-inf")
        self._vector_index = False
        # Built on first write per table (this store is the directory's only writer).
        self._key_filters: dict[str, KeyFilter] = {}
        # The table versions this writer last published with its positions (read on
        # its first save), and a reader's handles checked out at published versions.
        self._published = None
        self._pinned = OrderedDict()
        self._pinned_lock = threading.Lock()

    def cache_bytes(self) -> int:
        """What LanceDB's caches of these tables hold now (diagnostics and tests)."""
        return int(self._session.size_bytes)

    @classmethod
    def from_settings(
        cls,
        storage: StorageSettings,
        embedding_dim: int,
        root: RootPath | None = None,
        *,
        read_consistency_interval: timedelta | None = None,
        create: bool = True,
    ) -> Self:
        """The tables of ``root`` (default: the current set under ``storage.root``),
        bounded and maintained as ``storage`` says, with vectors ``embedding_dim`` wide."""
        return cls(
            root if root is not None else TableSets(storage.root).current(),
            embedding_dim=embedding_dim,
            read_consistency_interval=read_consistency_interval,
            vector_index_threshold=storage.vector_index_threshold,
            reader_grace=timedelta(seconds=storage.reader_grace_s),
            create=create,
        )

    def _open(self, name: str) -> Any | None:
        """The listed table ``name``, or None while its writer is still creating it:
        LanceDB lists a table's directory before its first version is written."""
        try:
            return self._db.open_table(name)
        except ValueError as exc:
            if "was not found" not in str(exc):
                raise
            return None

    def _table_names(self) -> list[str]:
        names: list[str] = []
        token: str | None = None
        while True:
            resp = self._db.list_tables(page_token=token)
            names.extend(resp.tables)
            token = resp.page_token
            if not token:
                return names

    def _check_schema(self, name: str, actual: pa.Schema, expected: pa.Schema) -> None:
        if name == MEMORIES:
            vec = actual.field("vector").type
            width = getattr(vec, "list_size", None)
            if width != self.embedding_dim:
                raise StoreError(
                    f"{self.root}/memories holds {width}-dimension vectors but the embedder "
                    f"makes {self.embedding_dim}: use another lance_dir or replay into a fresh one"
                )
        missing = [f.name for f in expected if f.name not in actual.names]
        if missing:
            raise StoreError(
                f"{self.root}/{name} lacks columns {missing}: it was written by another "
                "memstream version; replay into a fresh directory"
            )

    def table(self, name: str) -> Any:
        """The LanceDB table handle (``lancedb.table.LanceTable``)."""
        try:
            return self._tables[name]
        except KeyError:
            raise ValueError(f"unknown table {name!r} (tables: {', '.join(TABLE_NAMES)})") from None

    @property
    def table_names(self) -> tuple[str, ...]:
        return TABLE_NAMES

    def vector_model(self) -> str | None:
        """The embedding model of the memories table's vectors (None while it is
        empty). Remembered once known: only a replay into a fresh directory changes it."""
        if self._vector_model is None:
            rows = self.table(MEMORIES).search().select(["embedding_model"]).limit(1).to_arrow()
            if rows.num_rows:
                self._vector_model = str(rows.column("embedding_model")[0].as_py())
        return self._vector_model

    def check_vector_model(self, model_id: str) -> None:
        """Raise :class:`EmbedderMismatchError` when the memories table holds vectors
        of another model than ``model_id``."""
        stored = self.vector_model()
        if stored is not None and stored != model_id:
            raise EmbedderMismatchError(
                f"{self.root}/memories holds vectors of embedding model {stored!r} but the "
                f"configured embedder is {model_id!r}: switch back (MEMSTREAM_EMBEDDINGS_PROVIDER), or "
                "replay the log into a fresh directory with the new embedder (memstream replay)"
            )

    def count(self, name: str, where: str | None = None) -> int:
        return int(self.table(name).count_rows(where))

    def _has_index(self, name: str, column: str, index_type: str | None = None) -> bool:
        for idx in self.table(name).list_indices():
            if column in idx.columns and (index_type is None or str(idx.index_type) == index_type):
                return True
        return False

    def rows(
        self,
        name: str,
        where: str | None,
        columns: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> pa.Table:
        """A filtered scan (all matches unless ``limit``)."""
        q = self.table(name).search()
        if where:
            q = q.where(where)
        if columns is not None:
            q = q.select(list(columns))
        q = q.limit(limit)
        return q.to_arrow()

    def rows_by_keys(self, name: str, keys: Sequence[str], columns: Sequence[str] | None = None) -> pa.Table:
        """Rows whose ``pk`` is in ``keys`` (any order; missing keys are simply absent)."""
        parts = [self.rows(name, in_list("pk", chunk), columns) for chunk in chunked(list(dict.fromkeys(keys)))]
        if not parts:
            schema = schema_for(name, self.embedding_dim)
            if columns is not None:
                schema = pa.schema([schema.field(c) for c in columns])
            return schema.empty_table()
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]
