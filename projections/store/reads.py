"""Scoped lookups: exact dedup by content hash, memories and turns by id, a memory with
its links, history and evidence, entities, reflections and decisions. Every read is
confined to one memory space (and to one agent for a pinned read scope)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memstream.domain.access import ReadScope, read_scope_of
from memstream.domain.content import normalize_content
from memstream.domain.events import Scope
from memstream.projections.store.lance_async import async_table, wait
from memstream.projections.schema import DECISIONS, ENTITIES, LINKS, MEMORIES, MESSAGES, REFLECTIONS, schema_for
from memstream.projections.store.filters import (
    ScopeRequiredError,
    chunked,
    ids_where,
    in_list,
    quote,
    require_scope,
    space_where,
)
from memstream.projections.store.snapshot import StoreSnapshots
from memstream.projections.store.tables import json_or_none

__all__ = ["StoreReads"]

_SPACES_PER_QUERY = 100
"""Memory spaces named in one query's filter (an OR of their team/user pairs)."""


class StoreReads(StoreSnapshots):
    """Lookups within one memory space."""

    def find_hashes(self, scope: Scope | ReadScope, hashes: Iterable[str]) -> dict[str, str]:
        """``content_hash -> memory_id`` for the hashes already stored in the scope's
        memory space (team + user, and only the agent's rows for a pinned
        :class:`ReadScope`), exact across it. When several memories share a hash, the
        current one written first wins (status "active" before superseded or duplicate
        ones, then the lowest log offset)."""
        s = read_scope_of(require_scope(scope))
        return self.find_hashes_in_spaces({s: hashes}).get(s, {})

    def find_hashes_in_spaces(
        self, wanted: Mapping[ReadScope, Iterable[str]]
    ) -> dict[ReadScope, dict[str, str]]:
        """:meth:`find_hashes` for several read scopes at once, in one query per chunk
        instead of one per space (a query's fixed cost dominates an extraction batch's
        exact dedup).

        Isolation: each row counts only for the scopes that cover it, by its own
        ``team_id``, ``user_id`` and ``agent_id`` columns, and only for the hashes that
        scope asked about; the filter names the scopes exactly, so no other space's
        (or pinned agent's) row is even read."""
        asked: dict[ReadScope, set[str]] = {}
        for scope, hashes in wanted.items():
            if not scope.team_id or not scope.user_id:
                raise ScopeRequiredError("a memory space needs a non-empty team_id and user_id")
            found = {h for h in hashes if h}
            if found:
                asked.setdefault(scope, set()).update(found)
        best: dict[ReadScope, dict[str, tuple[tuple[Any, ...], str]]] = {}
        scopes = sorted(asked, key=lambda r: (r.team_id, r.user_id, r.agent_id or ""))
        for scope_chunk in chunked(scopes, _SPACES_PER_QUERY):
            pairs = " OR ".join(f"({space_where(sc)})" for sc in scope_chunk)
            hashes_all = sorted(set().union(*(asked[sc] for sc in scope_chunk)))
            for chunk in chunked(hashes_all):
                tbl = self.rows(
                    MEMORIES,
                    f"({pairs}) AND {in_list('content_hash', chunk)}",
                    ["team_id", "user_id", "agent_id", "memory_id", "content_hash", "status", "log_offset"],
                )
                for team, user, agent, mid, h, status, off in zip(
                    tbl.column("team_id").to_pylist(),
                    tbl.column("user_id").to_pylist(),
                    tbl.column("agent_id").to_pylist(),
                    tbl.column("memory_id").to_pylist(),
                    tbl.column("content_hash").to_pylist(),
                    tbl.column("status").to_pylist(),
                    tbl.column("log_offset").to_pylist(),
                ):
                    rank = (status != "active", off if off is not None else -1, mid)
                    for sc in (ReadScope(team, user, agent), ReadScope(team, user, None)):
                        if h not in asked.get(sc, ()):
                            continue  # another scope's question (or not asked at all)
                        mine = best.setdefault(sc, {})
                        if h not in mine or rank < mine[h][0]:
                            mine[h] = (rank, mid)
        return {sc: {h: mid for h, (_, mid) in found.items()} for sc, found in best.items()}

    @staticmethod
    def ids_where(scope: Scope | ReadScope, id_column: str, ids: Sequence[str]) -> str:
        """See :func:`memstream.projections.store.filters.ids_where`."""
        return ids_where(scope, id_column, ids)

    def get_memories(
        self, scope: Scope | ReadScope, memory_ids: Sequence[str], *, with_vector: bool = False
    ) -> list[dict[str, Any]]:
        """The rows of these memories within the scope's space (others are ignored),
        JSON fields parsed, in the order asked."""
        ids = list(dict.fromkeys(memory_ids))
        columns = None
        if not with_vector:
            columns = [f.name for f in schema_for(MEMORIES, self.embedding_dim) if f.name != "vector"]
        by_id: dict[str, dict[str, Any]] = {}
        for chunk in chunked(ids):
            for r in self.rows(MEMORIES, self.ids_where(scope, "memory_id", chunk), columns).to_pylist():
                by_id[r["memory_id"]] = _memory_dict(r)
        return [by_id[m] for m in ids if m in by_id]

    def memory_owner(self, scope: Scope | ReadScope, memory_id: str) -> str | None:
        """The agent whose memory ``memory_id`` is in the scope's space, if stored: one
        column of one row (every client write with its own id asks this), through the
        table's asynchronous handle (no query builder's schema read: half the CPU)."""
        query = async_table(self.table(MEMORIES)).query().where(self.ids_where(scope, "memory_id", [memory_id]))
        found = wait(query.select(["agent_id"]).limit(1).to_arrow())
        return str(found.column("agent_id")[0].as_py()) if found.num_rows else None

    def get_messages(self, scope: Scope | ReadScope, message_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The L0 turns with these ids in the scope's space, in the order asked."""
        ids = list(dict.fromkeys(message_ids))
        by_id: dict[str, dict[str, Any]] = {}
        for chunk in chunked(ids):
            for r in self.rows(MESSAGES, self.ids_where(scope, "message_id", chunk)).to_pylist():
                r["metadata"] = json_or_none(r.get("metadata"))
                by_id[r["message_id"]] = r
        return [by_id[m] for m in ids if m in by_id]

    def links_of(self, scope: Scope | ReadScope, memory_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(outgoing, incoming) links of a memory in the scope's space, oldest first."""
        base = space_where(scope)
        tbl = self.rows(
            LINKS,
            f"{base} AND (from_memory_id = {quote(memory_id)} OR to_memory_id = {quote(memory_id)})",
        )
        rows = sorted(tbl.to_pylist(), key=_log_order)
        for r in rows:
            r["provenance"] = json_or_none(r.get("provenance"))
        out = [r for r in rows if r["from_memory_id"] == memory_id]
        inc = [r for r in rows if r["to_memory_id"] == memory_id]
        return out, inc

    def get_memory(self, scope: Scope | ReadScope, memory_id: str) -> dict[str, Any] | None:
        """One memory with everything known about it: the row (JSON parsed, no vector),
        ``links_out`` / ``links_in``, ``history`` (``predecessors``: the memories it
        superseded or contradicted, transitively, newest first; ``successors``: the
        chain of ``superseded_by`` up to the current memory), ``source_messages`` (the
        L0 turns it came from, the evidence chain) and ``provenance``. ``None`` when
        the memory is not in the scope's space. Every table is read as of one
        projected position (:meth:`StoreSnapshots.at_published`): the row's view and
        its links always agree."""
        return self.at_published((MEMORIES, LINKS, MESSAGES), lambda at: at._memory_with_links(scope, memory_id))

    def _memory_with_links(self, scope: Scope | ReadScope, memory_id: str) -> dict[str, Any] | None:
        found = self.get_memories(scope, [memory_id])
        if not found:
            return None
        row = found[0]
        links_out, links_in = self.links_of(scope, memory_id)
        row["links_out"] = links_out
        row["links_in"] = links_in
        row["history"] = {
            "predecessors": self._predecessors(scope, memory_id),
            "successors": self._successors(scope, row),
        }
        # The evidence of a memory is its own agent's turns: a memory citing another
        # agent's message id must not read that agent's text (whoever asks).
        owner = ReadScope(row["team_id"], row["user_id"], row["agent_id"])
        row["source_messages"] = self.get_messages(owner, row.get("source_message_ids") or [])
        return row

    def _successors(self, scope: Scope | ReadScope, row: Mapping[str, Any], limit: int = 64) -> list[str]:
        chain: list[str] = []
        seen = {row["memory_id"]}
        nxt = row.get("superseded_by")
        while nxt and nxt not in seen and len(chain) < limit:
            chain.append(nxt)
            seen.add(nxt)
            rows = self.get_memories(scope, [nxt])
            nxt = rows[0].get("superseded_by") if rows else None
        return chain

    def _predecessors(self, scope: Scope | ReadScope, memory_id: str, limit: int = 64) -> list[str]:
        base = space_where(scope)
        found: list[str] = []
        seen = {memory_id}
        frontier = [memory_id]
        while frontier and len(found) < limit:
            tbl = self.rows(
                LINKS,
                f"{base} AND relation IN ('supersedes', 'contradicts') AND {in_list('from_memory_id', frontier)}",
                ["to_memory_id", "log_topic", "log_partition", "log_offset"],
            )
            rows = sorted(tbl.to_pylist(), key=_log_order, reverse=True)
            frontier = []
            for r in rows:
                if r["to_memory_id"] not in seen:
                    seen.add(r["to_memory_id"])
                    found.append(r["to_memory_id"])
                    frontier.append(r["to_memory_id"])
        if not found:
            return found
        # a link may name an id the read cannot see (another agent's): not history here
        visible = {r["memory_id"] for r in self.get_memories(scope, found[:limit])}
        return [m for m in found[:limit] if m in visible]

    def memories_for_entity(self, scope: Scope | ReadScope, name: str) -> list[str]:
        """Ids of the memories of the scope's space that name this entity (normalised
        name, so "ALICE" finds "Alice"), oldest first."""
        key = normalize_content(name)
        if not key:
            return []
        tbl = self.rows(
            ENTITIES,
            f"{space_where(scope)} AND name_key = {quote(key)}",
            ["memory_id", "log_topic", "log_partition", "log_offset"],
        )
        return [r["memory_id"] for r in sorted(tbl.to_pylist(), key=_log_order)]

    def entity_frequencies(self, scope: Scope | ReadScope, names: Iterable[str]) -> dict[str, int]:
        """How many memories of the space name each entity (by normalised name)."""
        keys = sorted({normalize_content(n) for n in names if normalize_content(n)})
        out = {k: 0 for k in keys}
        base = space_where(scope)
        for chunk in chunked(keys):
            tbl = self.rows(ENTITIES, f"{base} AND {in_list('name_key', chunk)}", ["name_key"])
            for k in tbl.column("name_key").to_pylist():
                out[k] = out.get(k, 0) + 1
        return out

    def count_memories(self, scope: Scope | ReadScope) -> int:
        return self.count(MEMORIES, space_where(scope))

    def reflections_for(
        self, scope: Scope | ReadScope, *, subject: str | None = None, limit: int = 10
    ) -> list[dict[str, Any]]:
        """The newest reflections of the space (optionally about one subject)."""
        where = space_where(scope)
        if subject is not None:
            where += f" AND subject = {quote(subject)}"
        rows = self.rows(REFLECTIONS, where).to_pylist()
        rows.sort(key=lambda r: (r["occurred_at"], r["reflection_id"]), reverse=True)
        for r in rows:
            r["provenance"] = json_or_none(r.get("provenance"))
        return rows[:limit]

    def decisions_for(self, scope: Scope | ReadScope, *, status: str | None = None) -> list[dict[str, Any]]:
        """The decision ledger of the space (``pending``, ``expired``, ``reflected``)."""
        where = space_where(scope)
        if status is not None:
            where += f" AND status = {quote(status)}"
        return self.rows(DECISIONS, where).to_pylist()


def _log_order(row: Mapping[str, Any]) -> tuple[str, int, int]:
    return (row.get("log_topic") or "", row.get("log_partition") or 0, row.get("log_offset") or 0)


def _memory_dict(row: dict[str, Any]) -> dict[str, Any]:
    row["metadata"] = json_or_none(row.get("metadata")) or {}
    row["provenance"] = json_or_none(row.get("provenance"))
    row["source_message_ids"] = list(row.get("source_message_ids") or [])
    row["entities"] = list(row.get("entities") or [])
    return row
