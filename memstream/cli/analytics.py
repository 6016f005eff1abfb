"""CLI commands over the projection: ``memstream search``, ``memstream sql`` and
``memstream export``.

They read the LanceDB tables the worker writes (``MEMSTREAM_STORAGE_ROOT``, or
``--lance-dir``) and never write to them, so they are safe while the worker runs.

* ``search`` is the hybrid search of ``memstream.projections.search`` inside one
  memory space (``--team`` is required, ``--user`` defaults to "default"); ``--explain``
  shows every score part. With an empty text and ``--entity NAME`` it lists what is
  known about that entity.
* ``sql`` runs DuckDB over every table's Lance dataset, registered under the table's
  name (``memories``, ``messages``, ``links``, ``entities``, ``reflections``,
  ``decisions``, ``positions``); DuckDB scans the datasets directly (no copy to Arrow
  first), which is what makes analytics over a million rows take well under a second.
  ``positions`` is the view (the furthest row per partition), in ``export`` too.
* ``export`` writes every table (or ``--table``) as Parquet or JSON lines, streamed in
  record batches so memory stays flat.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from memstream.cli._common import jsonable, open_store, scope_from_options
from memstream.cli._errors import CLIError
from memstream.settings import get_settings

__all__ = ["register", "search_cmd", "sql_cmd", "export_cmd", "parse_time", "open_store"]

console = Console()

_CONTENT_WIDTH = 400


def parse_time(text: str, *, end_of_day: bool = False) -> datetime:
    """An ISO date or date-time for ``--since`` / ``--until``. A bare date means the
    start of that day (or its end, for ``--until``); a time without offset is UTC."""
    value = text.strip()
    try:
        if len(value) == 10:
            d = date.fromisoformat(value)
            if end_of_day:
                return datetime(d.year, d.month, d.day, 23, 59, 59, 999_999, tzinfo=timezone.utc)
            return datetime(d.year, d.month, d.day, tzinfo=timezone.utc)
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise CLIError(f"not an ISO date or time: {text!r} (e.g. 2025-01-31 or 2025-01-31T09:30:00Z)") from None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def _fmt_time(value: datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M")


def _fmt_num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _shorten(text: str, width: int = _CONTENT_WIDTH) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def search_cmd(
    text: Annotated[str, typer.Argument(help="What to look for (empty with --entity: list the entity).")] = "",
    team: Annotated[str, typer.Option("--team", help="Team id (required: searches never cross spaces).")] = "",
    user: Annotated[str, typer.Option("--user", help="User id of the memory space.")] = "default",
    agent: Annotated[str | None, typer.Option("--agent", help="Only memories written by this agent.")] = None,
    session: Annotated[str | None, typer.Option("--session", help="Only memories of this session.")] = None,
    k: Annotated[int, typer.Option("--k", min=1, max=1000, help="How many results.")] = 10,
    types: Annotated[list[str] | None, typer.Option("--type", help="Memory type (repeatable).")] = None,
    since: Annotated[str | None, typer.Option("--since", help="From this date/time (ISO, UTC).")] = None,
    until: Annotated[str | None, typer.Option("--until", help="Until this date/time (ISO, UTC).")] = None,
    entity: Annotated[str | None, typer.Option("--entity", help="Only memories naming this entity.")] = None,
    include_superseded: Annotated[
        bool,
        typer.Option(
            "--include-superseded/--current-only",
            help="Keep superseded and duplicate memories (ranked below their successors) or drop them.",
        ),
    ] = True,
    explain: Annotated[bool, typer.Option("--explain", help="Show every score part.")] = False,
    rerank: Annotated[
        bool, typer.Option("--rerank", help="Let the cross-encoder at MEMSTREAM_EMBEDDINGS_RERANK_URL order the top results.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per result.")] = False,
    lance_dir: Annotated[Path | None, typer.Option("--lance-dir", help="Projection directory.")] = None,
) -> None:
    """Hybrid search (vector + BM25, recency, supersession) inside one memory space."""
    from memstream.domain.events import MemoryType
    from memstream.projections.embedders import EmbedderError, build_embedder
    from memstream.projections.search import build_reranker
    from memstream.projections.search import SearchFilters, search

    scope = scope_from_options(team, user)
    if not text.strip() and not entity:
        raise CLIError("give a text to search for, or --entity NAME to list an entity")
    try:
        filters = SearchFilters(
            memory_types=tuple(MemoryType.parse(t) for t in (types or [])),
            time_from=parse_time(since) if since else None,
            time_to=parse_time(until, end_of_day=True) if until else None,
            session_id=session,
            agent_id=agent,
            include_superseded=include_superseded,
            entity=entity,
        )
    except ValueError as exc:
        raise CLIError(str(exc).splitlines()[0]) from None
    settings = get_settings()
    reranker = build_reranker(settings.embeddings) if rerank else None
    if rerank and reranker is None:
        raise CLIError("--rerank needs a reranker: set MEMSTREAM_EMBEDDINGS_RERANK_URL to a /rerank endpoint")
    store = open_store(settings, lance_dir, scope)
    try:
        embedder = build_embedder(settings.embeddings)
        results = search(store, embedder, scope, text, k, filters, reranker=reranker)
    except EmbedderError as exc:
        raise CLIError(str(exc)) from None
    finally:
        if reranker is not None:
            reranker.close()

    if as_json:
        for r in results:
            payload = jsonable(r)
            if not explain:
                payload.pop("parts", None)
            typer.echo(json.dumps(payload, ensure_ascii=False))
        return
    if not results:
        console.print(f"[dim]nothing found in {escape(team)}/{escape(user)}[/dim]")
        return
    table = Table(title=escape(f"{len(results)} result(s) in {team}/{user}"), show_lines=True)
    table.add_column("#", justify="right", style="dim", no_wrap=True)
    table.add_column("score", justify="right", no_wrap=True)
    table.add_column("memory", overflow="fold", ratio=1)
    # An id is copied whole into other commands: never wrapped, the text column gives way.
    table.add_column("id", style="cyan", no_wrap=True, min_width=max(len(r.memory_id) for r in results))
    for i, r in enumerate(results, 1):
        status = r.status
        if r.superseded_by:
            status = f"[yellow]superseded by {r.superseded_by}[/yellow]"
        elif r.canonical_id:
            status = f"[yellow]duplicate of {r.canonical_id}[/yellow]"
        when = r.timestamp or r.timestamp_start or r.created_at
        cell = escape(_shorten(r.content)) + f"\n[dim]{r.memory_type} \u00b7 {_fmt_time(when)}[/dim] \u00b7 {status}"
        if explain:
            p = r.parts
            cell += (
                f"\n[dim]vector {_fmt_num(p.vector)} \u00b7 bm25 {_fmt_num(p.text)} \u00b7 "
                f"fused {_fmt_num(p.fused)} \u00b7 recency {_fmt_num(p.recency)} \u00b7 "
                f"supersession {_fmt_num(p.supersession)} \u00b7 entity {_fmt_num(p.entity)} \u00b7 "
                f"priority {r.priority} x{p.priority:.3f}"
                + (f" \u00b7 rerank {p.rerank:.4f}" if p.rerank is not None else "")
                + "[/dim]"
            )
        table.add_row(str(i), f"{r.score:.4f}", cell, escape(r.memory_id))
    console.print(table)


_LOCKED_DOWN = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
}
"""DuckDB without the file system, ATTACH, INSTALL or LOAD: the query reads the
registered tables only (``memstream sql --allow-files`` turns this off)."""


def _connect_duckdb(store: Any, *, allow_files: bool = False) -> Any:
    import duckdb

    con = duckdb.connect(config={} if allow_files else dict(_LOCKED_DOWN))
    for name in store.table_names:
        con.register(name, _table_source(store, name))
    if not allow_files:
        con.execute("SET lock_configuration = true")  # the query cannot turn access back on
    return con


def _table_source(store: Any, name: str) -> Any:
    """What a table is read from: its Lance dataset (scanned in place), except
    ``positions``, which is the view of the furthest row per partition (the table
    holds appended rows until the worker prunes them; a handful of rows either way)."""
    from memstream.projections.schema import POSITIONS
    from memstream.projections.store import ShardedStore

    if isinstance(store, ShardedStore):  # every shard's rows (sql and export see the whole set)
        return store.table_source(name)
    if name == POSITIONS:
        return store.positions_table()
    return store.table(name).to_lance()


def _cell(value: Any) -> str:
    if value is None:
        return "[dim]null[/dim]"
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list) and len(value) > 8 and all(isinstance(v, (int, float)) for v in value):
        head = ", ".join(f"{v:.3g}" for v in value[:4])
        return escape(f"[{head}, \u2026 ({len(value)} values)]")
    return escape(str(value))


def sql_cmd(
    query: Annotated[str, typer.Argument(help="A DuckDB SELECT over the tables, e.g. SELECT memory_type, count(*) FROM memories GROUP BY 1")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per row.")] = False,
    max_rows: Annotated[int, typer.Option("--max-rows", min=1, help="Rows to print in the table view.")] = 1000,
    lance_dir: Annotated[Path | None, typer.Option("--lance-dir", help="Projection directory.")] = None,
    allow_files: Annotated[
        bool, typer.Option("--allow-files", help="Let the query read and write files, ATTACH, INSTALL and LOAD.")
    ] = False,
) -> None:
    """SQL (DuckDB) over the projection's tables. External access (files, ATTACH,
    INSTALL, LOAD) is off unless --allow-files."""
    import duckdb

    store = open_store(get_settings(), lance_dir)
    con = _connect_duckdb(store, allow_files=allow_files)
    try:
        rel = con.sql(query)
        if rel is None:
            console.print("[dim]ok[/dim]")
            return
        columns = list(rel.columns)
        rows = rel.fetchall()
    except duckdb.Error as exc:
        raise CLIError(f"SQL: {str(exc).splitlines()[0]}") from None
    if as_json:
        for row in rows:
            typer.echo(json.dumps(jsonable(dict(zip(columns, row))), ensure_ascii=False))
        return
    table = Table(title=f"{len(rows)} row(s)")
    for c in columns:
        table.add_column(c, overflow="fold")
    for row in rows[:max_rows]:
        table.add_row(*(_cell(v) for v in row))
    console.print(table)
    if len(rows) > max_rows:
        console.print(f"[dim]{len(rows) - max_rows} more row(s) not shown (--max-rows, or --json)[/dim]")


def export_cmd(
    directory: Annotated[Path, typer.Argument(help="Where to write one file per table.")],
    fmt: Annotated[str, typer.Option("--format", help="parquet or jsonl.")] = "parquet",
    tables: Annotated[list[str] | None, typer.Option("--table", help="Only this table (repeatable).")] = None,
    lance_dir: Annotated[Path | None, typer.Option("--lance-dir", help="Projection directory.")] = None,
) -> None:
    """Write the projection's tables as Parquet or JSON lines."""
    import pyarrow.parquet as pq

    fmt = fmt.strip().lower()
    if fmt not in ("parquet", "jsonl"):
        raise CLIError("--format must be parquet or jsonl")
    store = open_store(get_settings(), lance_dir)
    names = list(tables or store.table_names)
    unknown = [n for n in names if n not in store.table_names]
    if unknown:
        raise CLIError(f"unknown table(s) {', '.join(unknown)} (tables: {', '.join(store.table_names)})")
    directory.mkdir(parents=True, exist_ok=True)
    summary = Table(title=f"exported to {directory}")
    summary.add_column("table")
    summary.add_column("rows", justify="right")
    summary.add_column("file")
    for name in names:
        dataset = _table_source(store, name)
        path = directory / f"{name}.{fmt}"
        count = 0
        if fmt == "parquet":
            with pq.ParquetWriter(path, dataset.schema) as writer:
                for batch in dataset.to_batches():
                    writer.write_batch(batch)
                    count += batch.num_rows
        else:
            with path.open("w", encoding="utf-8") as fh:
                for batch in dataset.to_batches():
                    for row in batch.to_pylist():
                        fh.write(json.dumps(jsonable(row), ensure_ascii=False) + "\n")
                    count += batch.num_rows
        summary.add_row(name, str(count), str(path))
    console.print(summary)


def register(app: typer.Typer) -> None:
    """Add ``search``, ``sql`` and ``export`` to the main app."""
    app.command("search")(search_cmd)
    app.command("sql")(sql_cmd)
    app.command("export")(export_cmd)
