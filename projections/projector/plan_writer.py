"""How a batch's plan (the rows it will write, by key) is written to the tables.

Links derive the view, nothing is deleted: ``supersedes`` and ``contradicts`` (from
the newer memory to the older) set the older memory's ``superseded_by``; ``duplicates``
(from the duplicate to the canonical memory) sets the duplicate's ``canonical_id``.
The view is derived when a batch is written, from the links table, so a link that
arrives before its memory still takes effect; the link latest in the log wins, and only
links written in the memory's own agent's scope count. A link id belongs to its agent;
the agent's later link of that id replaces the earlier one whole, so the memory the
earlier one set gets its view recomputed too (the fold's rule, ``domain/fold.py``).
Decisions combine into one ledger row whose status only moves up (pending < expired <
reflected).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from memstream.codec.batch import PositionedMemories
from memstream.domain.events import LinkRelation
from memstream.domain.log import PositionedEvent
from memstream.projections.projector.rows import arrow_table, entity_row, memories_table
from memstream.projections.schema import DECISIONS, ENTITIES, LINKS, MEMORIES, MESSAGES, REFLECTIONS, schema_for
from memstream.projections.store import LanceStore, chunked, in_list

__all__ = ["Plan", "PlanWriter", "SUPERSEDING_RELATIONS", "derive_view", "own_links", "view_target"]

SUPERSEDING_RELATIONS = frozenset({LinkRelation.supersedes.value, LinkRelation.contradicts.value})
_DUPLICATES = LinkRelation.duplicates.value
_STATUS_RANK = {"pending": 0, "expired": 1, "reflected": 2}


def derive_view(
    memory_id: str, links: Sequence[dict[str, Any]]
) -> tuple[str | None, str | None, str]:
    """``(superseded_by, canonical_id, status)`` of one memory from the links of its
    space that concern it (any order): the latest link in the log wins."""
    ordered = sorted(links, key=lambda r: (r["log_topic"], r["log_partition"], r["log_offset"], r["link_id"]))
    superseded_by: str | None = None
    canonical_id: str | None = None
    for link in ordered:
        if link["relation"] in SUPERSEDING_RELATIONS and link["to_memory_id"] == memory_id:
            superseded_by = link["from_memory_id"]
        elif link["relation"] == _DUPLICATES and link["from_memory_id"] == memory_id:
            canonical_id = link["to_memory_id"]
    status = "superseded" if superseded_by else "duplicate" if canonical_id else "active"
    return superseded_by, canonical_id, status


@dataclass
class Plan:
    """Rows to write, keyed by ``pk`` (later positions overwrite earlier ones)."""

    messages: dict[str, dict[str, Any]] = field(default_factory=dict)
    memories: dict[str, dict[str, Any]] = field(default_factory=dict)
    vectors: dict[str, np.ndarray | None] = field(default_factory=dict)
    links: dict[str, dict[str, Any]] = field(default_factory=dict)
    reflections: dict[str, dict[str, Any]] = field(default_factory=dict)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    fast: dict[str, int] = field(default_factory=dict)
    """Memories read on the fast path: pk -> row of ``fast_source``."""
    fast_source: PositionedMemories | None = None
    ahead: dict[tuple[str, int, int], np.ndarray] = field(default_factory=dict)
    """Vectors embedded ahead for this batch's general-path memories, by position."""
    owners: dict[str, str] = field(default_factory=dict)
    """pk -> the agent of the batch's first memory with that key (it owns the id)."""
    memory_events: dict[str, PositionedEvent] = field(default_factory=dict)
    """pk -> the general path's event of that memory (to dead-letter it)."""
    turn_owners: dict[str, str] = field(default_factory=dict)
    """The same for turns (message ids): pk -> the agent of the batch's first turn."""
    turn_events: dict[str, PositionedEvent] = field(default_factory=dict)


class PlanWriter:
    """Writes plans to one :class:`LanceStore` (the projector's)."""

    def __init__(self, store: LanceStore) -> None:
        self.store = store

    def write(self, plan: Plan) -> None:
        dim = self.store.embedding_dim
        if plan.messages:
            self.store.upsert(MESSAGES, arrow_table(MESSAGES, dim, list(plan.messages.values())))
        replaced: set[str] = set()
        if plan.links:
            replaced = self._replaced_ends(list(plan.links))
            self.store.upsert(LINKS, arrow_table(LINKS, dim, list(plan.links.values())))
        if plan.reflections:
            self.store.upsert(REFLECTIONS, arrow_table(REFLECTIONS, dim, list(plan.reflections.values())))
        if plan.decisions:
            self._write_decisions(plan.decisions)
        if plan.memories or plan.links or plan.fast:
            self._write_memories(plan, replaced)

    def _write_decisions(self, updates: list[dict[str, Any]]) -> None:
        """Combine decision updates with the stored ledger rows: a later event fills
        the fields it knows, status only moves up (pending < expired < reflected)."""
        keys = list(dict.fromkeys(u["pk"] for u in updates))
        current = {r["pk"]: r for r in self.store.rows_by_keys(DECISIONS, keys).to_pylist()}
        names = schema_for(DECISIONS, self.store.embedding_dim).names
        for u in updates:
            row = current.get(u["pk"]) or {n: None for n in names}
            merged = dict(row)
            for k, v in u.items():
                if k == "status":
                    continue
                if v is not None:
                    merged[k] = v
            old_status = row.get("status")
            if old_status is None or _STATUS_RANK[u["status"]] >= _STATUS_RANK.get(old_status, -1):
                merged["status"] = u["status"]
            current[u["pk"]] = merged
        self.store.upsert(DECISIONS, arrow_table(DECISIONS, self.store.embedding_dim, [current[k] for k in keys]))

    def _replaced_ends(self, pks: Sequence[str]) -> set[str]:
        """The memories whose view the stored links these keys replace had set (read
        before the batch's links overwrite them)."""
        stored = self.store.rows_by_keys(LINKS, pks, ["relation", "from_pk", "to_pk"]).to_pylist()
        return {t for t in map(view_target, stored) if t is not None}

    def _links_concerning(self, pks: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """Links (stored, this batch's included) that decide the view of these memories."""
        out: dict[str, list[dict[str, Any]]] = {}
        if not pks or self.store.count(LINKS) == 0:
            return out
        cols = ["link_id", "agent_id", "from_memory_id", "to_memory_id", "from_pk", "to_pk", "relation",
                "log_topic", "log_partition", "log_offset"]
        for chunk in chunked(list(pks)):
            where = (
                f"(relation IN ('supersedes', 'contradicts') AND {in_list('to_pk', chunk)}) "
                f"OR (relation = 'duplicates' AND {in_list('from_pk', chunk)})"
            )
            for r in self.store.rows(LINKS, where, cols).to_pylist():
                out.setdefault(view_target(r) or "", []).append(r)
        return out

    def _write_memories(self, plan: Plan, replaced: set[str]) -> None:
        dim = self.store.embedding_dim
        rows, vectors, existing = self._memories_to_view(plan, replaced)
        fast = plan.fast
        links = self._links_concerning(sorted(rows.keys() | fast.keys()))
        changed = _set_views(rows, links, existing)
        if not changed and not fast:
            return
        parts: list[pa.Table] = []
        if changed:
            matrix = np.stack([vectors[pk] for pk in changed]).astype(np.float32, copy=False)
            parts.append(arrow_table(MEMORIES, dim, [rows[pk] for pk in changed], matrix))
        fast_entities: pa.Table | None = None
        if fast:
            assert plan.fast_source is not None
            fields = plan.fast_source.fields
            views = {
                pk: derive_view(fields[i].memory_id, own_links(links[pk], fields[i].agent_id))
                for pk, i in fast.items()
                if pk in links
            }
            fast_rows, fast_entities = memories_table(plan.fast_source, fast, views, dim=dim)
            parts.append(fast_rows)
        _, updated = self.store.upsert(MEMORIES, parts[0] if len(parts) == 1 else pa.concat_tables(parts))
        # Memories re-added under an existing id may leave entity rows that their new
        # version no longer names; when every memory of the batch was an insert there
        # can be none (entity rows are only written after their memory row).
        readded = updated > sum(1 for pk in changed if pk in existing)
        self._write_entities(plan, [pk for pk in changed if pk in plan.memories], fast_entities, readded)

    def _memories_to_view(
        self, plan: Plan, replaced: set[str]
    ) -> tuple[dict[str, dict[str, Any]], dict[str, np.ndarray], set[str]]:
        """The batch's general-path memory rows and vectors, plus the stored memories
        whose view a link of this batch (or a link it replaced) may change
        (``existing``: their keys)."""
        rows: dict[str, dict[str, Any]] = dict(plan.memories)
        vectors: dict[str, np.ndarray] = {pk: v for pk, v in plan.vectors.items() if v is not None}
        touched = {t for t in map(view_target, plan.links.values()) if t is not None} | replaced
        stored_keys = sorted(touched - rows.keys() - plan.fast.keys())
        existing: set[str] = set()
        if stored_keys:
            for r in self.store.rows_by_keys(MEMORIES, stored_keys).to_pylist():
                vectors[r["pk"]] = np.asarray(r.pop("vector"), dtype=np.float32)
                rows[r["pk"]] = r
                existing.add(r["pk"])
        return rows, vectors, existing

    def _write_entities(self, plan: Plan, new: list[str], fast_entities: pa.Table | None, readded: bool) -> None:
        if not new and not plan.fast:
            return
        ent_rows: list[dict[str, Any]] = []
        for pk in new:
            m = plan.memories[pk]
            ent_rows.extend(entity_row(pk, key, ent, m) for ent, key in zip(m["entities"], m["entity_keys"]))
        ents = arrow_table(ENTITIES, self.store.embedding_dim, ent_rows)
        if fast_entities is not None:
            ents = pa.concat_tables([ents, fast_entities]) if ents.num_rows else fast_entities
        if readded:
            self.store.replace_rows(ENTITIES, ents, "memory_pk", new + list(plan.fast))
        elif ents.num_rows:
            self.store.upsert(ENTITIES, ents)


def _set_views(rows: dict[str, dict[str, Any]], links: dict[str, list[dict[str, Any]]], existing: set[str]) -> list[str]:
    """Set each row's derived view; the keys of rows that are new or whose view changed."""
    changed: list[str] = []
    for pk, row in rows.items():
        view = derive_view(row["memory_id"], own_links(links.get(pk, []), row["agent_id"]))
        old = (row["superseded_by"], row["canonical_id"], row["status"])
        row["superseded_by"], row["canonical_id"], row["status"] = view
        if pk not in existing or view != old:
            changed.append(pk)
    return changed


def view_target(link: dict[str, Any]) -> str | None:
    """The key of the memory whose view a link sets: the older memory of a
    ``supersedes``/``contradicts`` link, the duplicate of a ``duplicates`` link, none
    for the others."""
    if link["relation"] in SUPERSEDING_RELATIONS:
        return str(link["to_pk"])
    return str(link["from_pk"]) if link["relation"] == _DUPLICATES else None


def own_links(links: list[dict[str, Any]], agent_id: str) -> list[dict[str, Any]]:
    """The links that may change a memory's view: those written in its own agent's
    scope. Another agent's link (even one naming a predicted id) never supersedes or
    merges a memory (``memstream.domain.access``; docs/security.md)."""
    return [link for link in links if link.get("agent_id") == agent_id]


