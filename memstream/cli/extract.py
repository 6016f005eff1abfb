"""CLI commands of the extractor: ``memstream provenance`` and ``memstream extract``.

* ``provenance MEMORY_ID --team T [--user U]`` shows how a memory came to be, read from
  the projection: the prompt (id, version, sha256) and model that produced it, the L0
  turns it was extracted from (the evidence chain), latency, token usage, status, the
  judgment's decision, and the links from and to it. ``--json`` prints the same as one
  JSON object.
* ``extract --team T [--user U] --session S`` runs one extraction by hand over the
  session's latest turns as projected in the ``messages`` table (for trying a prompt
  override or a model before deploying it). ``--dry-run`` (the default) prints what
  would be emitted; ``--emit`` produces the events to Kafka like the worker would.
* ``extract --retry-failed [--since 24h]`` redoes, with the configured model, every
  window the extractor stored by its heuristic fallback (the model had refused it,
  or failed it past the retry budget) and that no retry redid yet; it produces the
  new memories and links, ADD-only (:mod:`memstream.services.extraction.retry`).

All read the LanceDB tables the worker writes and never write to them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from memstream.cli._common import jsonable, open_store, scope_from_options
from memstream.cli._errors import CLIError
from memstream.settings import Settings, get_settings
from memstream.streams.trust.worker_identity import worker_key

__all__ = ["register", "provenance_cmd", "extract_cmd"]

console = Console()


def provenance_cmd(
    memory_id: Annotated[str, typer.Argument(help="The memory's id (as shown by `memstream search`).")],
    team: Annotated[str, typer.Option("--team", help="Team id of the memory space (required).")] = "",
    user: Annotated[str, typer.Option("--user", help="User id of the memory space.")] = "default",
    lance_dir: Annotated[Path | None, typer.Option("--lance-dir", help="Projection directory.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Show where a memory came from: prompt, model, source turns, decisions, links."""
    settings = get_settings()
    scope = scope_from_options(team, user)
    store = open_store(settings, lance_dir, scope)
    row = store.get_memory(scope, memory_id)
    if row is None:
        raise CLIError(f"no memory {memory_id!r} in the space {scope.space}")
    row.pop("vector", None)
    if as_json:
        typer.echo(json.dumps(jsonable(row), sort_keys=True))
        return
    _print_provenance(row)


def _print_provenance(row: dict[str, Any]) -> None:
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column()
    head.add_row("memory", escape(row["memory_id"]))
    head.add_row("content", escape(row["content"]))
    head.add_row(
        "type / priority / status",
        f"{row.get('memory_type')} / {row.get('priority')} / {row.get('status', 'active')}",
    )
    if row.get("superseded_by"):
        head.add_row("superseded by", escape(str(row["superseded_by"])))
    if row.get("canonical_id"):
        head.add_row("duplicate of", escape(str(row["canonical_id"])))
    if row.get("scene"):
        head.add_row("scene", escape(str(row["scene"])))
    entities = row.get("entities") or []
    if entities:
        head.add_row("entities", escape(", ".join(f"{e['name']} ({e['kind']})" for e in entities)))
    p = row.get("provenance") or {}
    head.add_row("method", str(p.get("method", "unknown")))
    if p.get("prompt_id"):
        head.add_row(
            "prompt",
            f"{p['prompt_id']} v{p.get('prompt_version')} sha256:{p.get('prompt_sha256')}",
        )
    if p.get("model"):
        head.add_row("model", escape(str(p["model"])))
    head.add_row("status", escape(str(p.get("status", "ok"))))
    if p.get("latency_ms") is not None:
        head.add_row("latency", f"{float(p['latency_ms']):.0f} ms")
    usage = p.get("token_usage") or {}
    if usage:
        head.add_row("tokens", ", ".join(f"{k} {v}" for k, v in sorted(usage.items())))
    if p.get("input_refs"):
        head.add_row("input turns", escape(", ".join(p["input_refs"])))
    if p.get("output_refs"):
        head.add_row("same run made", escape(", ".join(p["output_refs"])))
    if p.get("note"):
        head.add_row("note", escape(str(p["note"])))
    console.print(head)

    sources = row.get("source_messages") or []
    turns = Table(title="source turns (L0 evidence)", show_lines=False)
    for col in ("message", "when", "who", "content"):
        turns.add_column(col)
    found = {m["message_id"] for m in sources}
    for m in sources:
        who = m.get("role", "")
        if m.get("speaker"):
            who += f" {m['speaker']}"
        when = m.get("occurred_at")
        turns.add_row(
            escape(m["message_id"]),
            when.strftime("%Y-%m-%d %H:%M") if hasattr(when, "strftime") else str(when or ""),
            escape(who),
            escape(" ".join(str(m.get("content", "")).split())[:300]),
        )
    for missing in row.get("source_message_ids") or []:
        if missing not in found:
            turns.add_row(escape(missing), "", "", "[dim](turn not projected)[/dim]")
    console.print(turns)

    decisions = p.get("decisions") or []
    if decisions:
        table = Table(title="decisions of the run")
        table.add_column("what")
        table.add_column("detail")
        for d in decisions:
            what = d.get("action") or d.get("issue") or (f"gate: {d['gate']}" if "gate" in d else "?")
            detail = {k: v for k, v in d.items() if k not in ("action", "issue", "gate")}
            table.add_row(escape(str(what)), escape(json.dumps(jsonable(detail), sort_keys=True)[:400]))
        console.print(table)

    links = [("out", link) for link in row.get("links_out") or []] + [("in", link) for link in row.get("links_in") or []]
    if links:
        table = Table(title="links")
        for col in ("dir", "relation", "other memory", "by", "reason"):
            table.add_column(col)
        for direction, link in links:
            other = link["to_memory_id"] if direction == "out" else link["from_memory_id"]
            table.add_row(
                direction,
                escape(str(link["relation"])),
                escape(other),
                escape(str(link.get("decided_by", ""))),
                escape(str(link.get("reason") or "")[:200]),
            )
        console.print(table)


class _DryRunSink:
    """Collects events instead of producing them (``extract --dry-run``)."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    async def send_many(self, events: Sequence[Any]) -> list[Any]:
        self.events.extend(events)
        return []


def extract_cmd(
    team: Annotated[str, typer.Option("--team", help="Team id of the memory space (required).")] = "",
    user: Annotated[str, typer.Option("--user", help="User id of the memory space.")] = "default",
    session: Annotated[str, typer.Option("--session", help="The session whose turns to extract (required).")] = "",
    last: Annotated[int, typer.Option("--last", min=0, help="How many of the latest turns are new (0: extract_max_new_turns).")] = 0,
    emit: Annotated[bool, typer.Option("--emit/--dry-run", help="Produce the events, or only show them (default).")] = False,
    lance_dir: Annotated[Path | None, typer.Option("--lance-dir", help="Projection directory.")] = None,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="Redo the windows stored by the fallback (and produce the result).")
    ] = False,
    since: Annotated[
        str, typer.Option("--since", help="With --retry-failed: only windows recorded since (ISO time, or 24h, 7d).")
    ] = "",
) -> None:
    """Run one extraction by hand over a session's latest projected turns, or redo the
    windows the extractor stored by its fallback (--retry-failed)."""
    settings = get_settings()
    if retry_failed:
        _retry_failed(settings, lance_dir, since)
        return
    if since:
        raise CLIError("--since only goes with --retry-failed")
    if not session:
        raise CLIError("--session is required")
    from memstream.projections.reads.session_turns import session_turns

    scope = scope_from_options(team, user)
    store = open_store(settings, lance_dir, scope)
    turns = session_turns(store, scope, session)
    if not turns:
        raise CLIError(f"no projected turns for session {session!r} in the space {scope.space}")
    count = last or settings.extraction.max_new_turns
    new, background = turns[-count:], turns[:-count][-settings.extraction.background_turns :]
    outcome, events = asyncio.run(_extract(settings, store, new, background, emit))
    table = Table(title=f"extraction {outcome.correlation_id} ({outcome.method}): {outcome.status}")
    for col in ("event", "memory / link", "content / relation"):
        table.add_column(col)
    for e in events:
        if e.type == "MemoryAdded":
            table.add_row("MemoryAdded", escape(e.memory_id), escape(e.content[:200]))
        else:
            table.add_row(e.type, escape(f"{e.from_memory_id} -> {e.to_memory_id}"), e.relation.value)
    console.print(table)
    for item in outcome.record:
        console.print(escape(json.dumps(jsonable(dict(item)), sort_keys=True)), highlight=False)
    if outcome.status == "failed":
        raise CLIError(f"extraction failed, nothing emitted: {outcome.failure}")
    console.print(
        f"{len(new)} turns, {outcome.llm_calls} LLM call(s), {len(events)} event(s) "
        + ("produced" if emit else "not produced (dry run; pass --emit to produce)"),
        highlight=False,
    )


async def _extract(settings: Settings, store: Any, new: list[Any], background: list[Any], emit: bool) -> tuple[Any, list[Any]]:
    from memstream.llm import build_llm
    from memstream.projections.embedders import build_embedder
    from memstream.services.extraction import Extractor
    from memstream.streams.producers.producer import MemstreamProducer

    llm = build_llm(settings)
    embedder = build_embedder(settings.embeddings)
    # the operator runs the worker's extractor: its events are signed as the worker's
    producer: Any = (
        MemstreamProducer(settings.streams, client_id="memstream-extract-cli", signing_key=worker_key(settings.resolved_worker_key_file))
        if emit
        else _DryRunSink()
    )
    try:
        if emit:
            await producer.start()
        scope = new[-1].scope
        outcome = await Extractor(settings, llm, embedder, store, producer).run_window(
            scope, new[-1].session_id, new, background
        )
    finally:
        if emit:
            await producer.stop()
        if llm is not None:
            await llm.close()
    return outcome, list(outcome.events)


def _retry_failed(settings: Settings, lance_dir: Path | None, since: str) -> None:
    from memstream.services.extraction import find_windows, parse_since

    try:
        after = parse_since(since) if since else None
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    store = open_store(settings, lance_dir)
    windows = find_windows(store, after)
    if not windows:
        console.print("no fallback window to retry", highlight=False)
        return
    report = asyncio.run(_retry(settings, store, windows))
    console.print(
        f"{report.windows} fallback window(s): {report.redone} redone, {report.memories} memories and "
        f"{report.links} links produced, {len(report.still_failing)} still failing, "
        f"{len(report.missing_turns)} without projected turns",
        highlight=False,
    )
    for run_id, why in report.still_failing.items():
        console.print(escape(f"  {run_id}: {why}"), highlight=False)
    if report.still_failing:
        raise CLIError(f"{len(report.still_failing)} window(s) still fail; they stay stored by the fallback")


async def _retry(settings: Settings, store: Any, windows: list[Any]) -> Any:
    from rich.progress import Progress

    from memstream.services.extraction import retry_windows
    from memstream.llm import build_llm
    from memstream.projections.embedders import build_embedder
    from memstream.streams.producers.producer import MemstreamProducer

    llm = build_llm(settings)
    if llm is None:
        raise CLIError("no LLM configured (MEMSTREAM_EXTRACTION_LLM_BASE_URL): nothing to retry the windows with")
    producer = MemstreamProducer(settings.streams, client_id="memstream-extract-retry", signing_key=worker_key(settings.resolved_worker_key_file))
    await producer.start()
    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("retrying fallback windows", total=len(windows))
            return await retry_windows(
                settings,
                store,
                windows,
                llm=llm,
                embedder=build_embedder(settings.embeddings),
                producer=producer,
                progress=lambda: progress.advance(task),
            )
    finally:
        await producer.stop()
        await llm.close()


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
    app.command("provenance")(provenance_cmd)
    app.command("extract")(extract_cmd)
