"""The projector: turns a batch of positioned events into LanceDB rows, idempotently.

The worker's projector service reads ``memstream.events`` and ``memstream.messages`` in
batches and hands each batch to :meth:`Projector.apply` from an executor thread. What
``apply`` guarantees:

* **Resume exactly**: records below the stored position of their (topic, partition)
  are skipped; after the rows are written, the positions move to one past the
  highest offset seen (never backwards), in the same call. A crash between the two
  leaves rows whose positions were not saved: they are applied again on restart, and
  applying again changes nothing (next point).
* **Idempotent**: every table is upserted by a scoped key (``team|user|id``) with
  ``merge_insert``; each batch is deduplicated first (last write by log position wins),
  since LanceDB rejects two source rows with one key.
* **Links derive the view, nothing is deleted**: ``supersedes`` and ``contradicts``
  (from the newer memory to the older) set the *older* (``to_memory_id``) memory's
  ``superseded_by`` to the newer id; ``duplicates`` (from the duplicate to the
  canonical memory) sets the *from* memory's ``canonical_id`` to the canonical id. The
  view is derived at apply time from the links table, so a link that arrives before its
  memory still takes effect when the memory arrives. With several such links, the one
  latest in the log wins. Only links written in the memory's own agent's scope count:
  another agent's link never changes a memory's view. ``status`` is ``superseded`` if ``superseded_by`` is set,
  else ``duplicate`` if ``canonical_id`` is set, else ``active``.
* **Embeddings**: a ``MemoryAdded`` carrying an embedding of the configured model
  (``model == embedder.model_id``) is stored as carried; all others are embedded in one
  ``embed`` call per batch. A carried embedding of the configured model but the wrong
  dimension cannot be projected: that event fails (see below). A reader can embed a
  batch ahead (:meth:`Projector.embed_ahead`, in its own thread, while the previous
  batch is written), so a neural model's time hides behind the writes.
* **Bad events do not stop the batch**: an event that cannot be projected (its
  handler refuses or fails on it) lands in ``ApplyResult.failed`` with a one-line
  reason (the worker dead-letters it) and its position is still passed; the rest of
  the batch applies. Infrastructure errors (LanceDB, the embedding provider) raise
  instead: no position of the batch was saved, and the worker retries the whole
  batch, which is safe because applying again changes nothing.

Tables written per event type: ``MessageObserved`` -> messages; ``MemoryAdded`` ->
memories + entities; ``MemoryLinked`` -> links (+ the derived view on memories);
``MemoryReflected`` -> reflections + decisions (``reflected``); ``DecisionRecorded``
-> decisions (``pending``); ``DecisionExpired`` -> decisions (``expired``: no outcome by
the deadline, kept as a row rather than deleted); ``OutcomeObserved`` has no view here
(the reflector consumes it) and counts as applied.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, cast

import numpy as np
import pyarrow as pa

from memstream.domain.content import content_hash
from memstream.domain.events import (
    DecisionExpired,
    DecisionRecorded,
    EventBase,
    LinkRelation,
    MemoryAdded,
    MemoryLinked,
    MemoryReflected,
    MessageObserved,
    OutcomeObserved,
    Scope,
)
from memstream.domain.log import LogPosition, PositionedEvent, PositionedMemories
from memstream.projections.embedder import Embedder, embed_array
from memstream.projections.memory_rows import canonical_json, entity_row, memories_table, unique_entities
from memstream.projections.schema import (
    DECISIONS,
    ENTITIES,
    LINKS,
    MEMORIES,
    MESSAGES,
    REFLECTIONS,
    schema_for,
    scoped_key,
)
from memstream.projections.store import LanceStore, chunked, in_list

__all__ = ["ApplyResult", "Projector", "ProjectionError", "SUPERSEDING_RELATIONS", "derive_view"]

log = logging.getLogger("memstream.projections")

SUPERSEDING_RELATIONS = frozenset({LinkRelation.supersedes.value, LinkRelation.contradicts.value})
_DUPLICATES = LinkRelation.duplicates.value
_STATUS_RANK = {"pending": 0, "expired": 1, "reflected": 2}


class ProjectionError(ValueError):
    """This event cannot be projected; the message is the dead-letter reason."""


@dataclass
class ApplyResult:
    """What one :meth:`Projector.apply` did. ``applied`` counts events at or past the
    stored position that were projected (types without a view included), ``skipped``
    those below it, ``failed`` the events to dead-letter with their reasons."""

    applied: int = 0
    skipped: int = 0
    failed: list[tuple[PositionedEvent, str]] = field(default_factory=list)


def _pos_key(pe: PositionedEvent) -> tuple[str, int, int]:
    p = pe.position
    return (p.topic, p.partition, p.offset)


def _provenance(model: Any) -> str | None:
    return None if model is None else canonical_json(model.model_dump(mode="json"))


def _utc(dt: datetime | None) -> datetime | None:
    return None if dt is None else dt.astimezone(timezone.utc)


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


def _log_fields(pe: PositionedEvent) -> dict[str, Any]:
    p = pe.position
    return {
        "log_topic": p.topic,
        "log_partition": p.partition,
        "log_offset": p.offset,
        "event_id": str(pe.event.event_id),
    }


def _decision_update(
    pe: PositionedEvent,
    e: DecisionRecorded | DecisionExpired | MemoryReflected,
    *,
    status: str,
    **fields: Any,
) -> dict[str, Any]:
    """One event's update of a decision's ledger row: the key and identity every
    decision event carries, plus the ``fields`` this event type knows (merged into the
    stored row by :meth:`Projector._write_decisions`)."""
    team, user = e.scope.team_id, e.scope.user_id
    return {
        "pk": scoped_key(team, user, e.decision_id),
        "decision_id": e.decision_id,
        "team_id": team,
        "user_id": user,
        "agent_id": e.scope.agent_id,
        "subject": e.subject,
        **fields,
        "status": status,
        **_log_fields(pe),
    }


@dataclass
class _Plan:
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


class Projector:
    """Applies batches of positioned events to a :class:`LanceStore` (see the module
    docstring for the guarantees). Not thread-safe: one projector per store, called
    from one thread at a time."""

    def __init__(self, store: LanceStore, embedder: Embedder) -> None:
        if embedder.dim != store.embedding_dim:
            raise ValueError(
                f"the embedder makes {embedder.dim}-dimension vectors but the store holds "
                f"{store.embedding_dim}"
            )
        store.check_vector_model(embedder.model_id)
        self.store = store
        self.embedder = embedder
        store.prepare_writes()
        # Vectors made by :meth:`embed_ahead` for general-path events, by position,
        # until the batch holding them is applied.
        self._ahead: dict[tuple[str, int, int], np.ndarray] = {}
        self._ahead_lock = threading.Lock()
        # The stored positions, read once: the projector is the table set's only
        # writer (one worker per directory), so after the first read it knows them
        # without a LanceDB query per batch.
        self._positions: dict[tuple[str, int], int] | None = None
        self._handlers: dict[type[EventBase], Callable[[PositionedEvent, _Plan], None]] = {
            MessageObserved: self._on_message,
            MemoryAdded: self._on_memory,
            MemoryLinked: self._on_link,
            MemoryReflected: self._on_reflection,
            DecisionRecorded: self._on_decision,
            DecisionExpired: self._on_expired,
            OutcomeObserved: lambda pe, plan: None,
        }

    # ------------------------------------------------------------------ positions
    def positions(self) -> dict[tuple[str, int], int]:
        """The next offset per (topic, partition) as stored (cached after the first read)."""
        if self._positions is None:
            self._positions = dict(self.store.positions())
        return dict(self._positions)

    def save_positions(self, next_offsets: dict[tuple[str, int], int]) -> None:
        """Store positions (never backwards) and remember them once they are written."""
        current = self.positions()
        forward = {k: v for k, v in next_offsets.items() if v > current.get(k, 0)}
        if not forward:
            return
        self.store.save_positions(forward)
        assert self._positions is not None
        self._positions.update(forward)

    # ------------------------------------------------------------------ apply
    def apply(
        self, batch: Sequence[PositionedEvent], memories: PositionedMemories | None = None
    ) -> ApplyResult:
        """Apply events, and ``memories`` the fast read path decoded (columnar, with
        vectors of this projector's model), as one batch in log order."""
        result = ApplyResult()
        if memories is not None and len(memories):
            self._check_fast(memories)
        elif not batch:
            return result
        stored = self.positions()
        fresh: dict[tuple[str, int, int], PositionedEvent | int] = {}
        for pe in batch:
            p = pe.position
            if p.offset < stored.get((p.topic, p.partition), 0):
                result.skipped += 1
            else:
                fresh[_pos_key(pe)] = pe  # one record read twice counts once
        for i, key in enumerate(memories.positions if memories is not None else ()):
            if key[2] < stored.get((key[0], key[1]), 0):
                result.skipped += 1
            else:
                fresh[key] = i
        if not fresh:
            return result

        plan = _Plan(fast_source=memories)
        with self._ahead_lock:
            plan.ahead = {k: v for k in fresh if (v := self._ahead.pop(k, None)) is not None}
            for pe in batch:  # skipped ones too: nothing of this batch stays behind
                self._ahead.pop(_pos_key(pe), None)
        for key in sorted(fresh):
            item = fresh[key]
            if isinstance(item, int):
                refused = self._on_fast_memory(item, plan)
                if refused is not None:
                    result.failed.append(refused)
                continue
            pe = item
            handler = self._handlers.get(type(pe.event))
            try:
                if handler is None:
                    raise ProjectionError(f"no projection for event type {pe.event.type!r}")
                handler(pe, plan)
            except ProjectionError as exc:
                result.failed.append((pe, str(exc)))
            except Exception as exc:  # noqa: BLE001 - one event must not block the log
                # Handlers only reshape an already validated event; anything else they
                # raise is about this event, and retrying the batch would never end.
                log.warning("cannot project %s", pe.position, exc_info=True)
                result.failed.append((pe, f"cannot project: {type(exc).__name__}: {exc}"))
        result.failed.extend(self._refuse_taken_ids(plan))
        result.applied = len(fresh) - len(result.failed)

        self._embed_missing(plan)
        self._write(plan)

        next_offsets: dict[tuple[str, int], int] = {}
        for topic, partition, offset in fresh:
            key = (topic, partition)
            next_offsets[key] = max(next_offsets.get(key, 0), offset + 1, stored.get(key, 0))
        self.save_positions(next_offsets)
        log.debug(
            "applied %d, skipped %d, failed %d; positions %s",
            result.applied, result.skipped, len(result.failed), next_offsets,
        )
        return result

    # ------------------------------------------------------------------ handlers
    def _on_message(self, pe: PositionedEvent, plan: _Plan) -> None:
        e = pe.event
        assert isinstance(e, MessageObserved)
        pk = scoped_key(e.scope.team_id, e.scope.user_id, e.message_id)
        if plan.turn_owners.setdefault(pk, e.scope.agent_id) != e.scope.agent_id:
            raise ProjectionError(_taken(e.message_id, plan.turn_owners[pk], "turn"))
        plan.turn_events[pk] = pe
        plan.messages[pk] = {
            "pk": pk,
            "message_id": e.message_id,
            "team_id": e.scope.team_id,
            "user_id": e.scope.user_id,
            "agent_id": e.scope.agent_id,
            "session_id": e.session_id,
            "role": e.role,
            "speaker": e.speaker,
            "content": e.content,
            "content_hash": content_hash(e.content),
            "metadata": canonical_json(e.metadata),
            "occurred_at": _utc(e.occurred_at),
            "recorded_at": _utc(e.recorded_at),
            **_log_fields(pe),
        }

    def _check_fast(self, memories: PositionedMemories) -> None:
        dim = self.store.embedding_dim
        if memories.model != self.embedder.model_id or memories.vectors.shape != (len(memories), dim):
            raise ValueError(
                f"fast-path memories carry {memories.vectors.shape} vectors of {memories.model!r}; "
                f"this projector stores {dim}-dimension vectors of {self.embedder.model_id!r}"
            )

    def _on_fast_memory(self, i: int, plan: _Plan) -> tuple[PositionedEvent, str] | None:
        """File a fast-path memory; the memory as an event to dead-letter when its id
        belongs to another agent of the batch."""
        assert plan.fast_source is not None
        f = plan.fast_source.fields[i]
        pk = scoped_key(f.team_id, f.user_id, f.memory_id)
        if plan.owners.setdefault(pk, f.agent_id) != f.agent_id:
            return _fast_event(plan.fast_source, i), _taken(f.memory_id, plan.owners[pk])
        plan.memories.pop(pk, None)  # a later position wins
        plan.vectors.pop(pk, None)
        plan.fast.pop(pk, None)
        plan.fast[pk] = i
        return None

    def _on_memory(self, pe: PositionedEvent, plan: _Plan) -> None:
        e = pe.event
        assert isinstance(e, MemoryAdded)
        vector: np.ndarray | None = None
        emb = e.embedding
        if emb is not None and emb.model == self.embedder.model_id:
            if emb.dim != self.store.embedding_dim:
                raise ProjectionError(
                    f"embedding of model {emb.model!r} has dimension {emb.dim}; "
                    f"the memories table holds {self.store.embedding_dim}"
                )
            vector = emb.to_array()
        else:
            vector = plan.ahead.get(_pos_key(pe))
        team, user = e.scope.team_id, e.scope.user_id
        pk = scoped_key(team, user, e.memory_id)
        if plan.owners.setdefault(pk, e.scope.agent_id) != e.scope.agent_id:
            raise ProjectionError(_taken(e.memory_id, plan.owners[pk]))
        plan.memory_events[pk] = pe
        entities, entity_keys = unique_entities((ent.name, ent.kind.value) for ent in e.entities)
        plan.fast.pop(pk, None)  # a later position wins
        plan.memories[pk] = {
            "pk": pk,
            "memory_id": e.memory_id,
            "team_id": team,
            "user_id": user,
            "agent_id": e.scope.agent_id,
            "session_id": e.session_id,
            "content": e.content,
            "content_hash": e.content_hash,
            "memory_type": e.memory_type.value,
            "priority": e.priority,
            "scene": e.scene,
            "timestamp": _utc(e.timestamp),
            "timestamp_start": _utc(e.timestamp_start),
            "timestamp_end": _utc(e.timestamp_end),
            "source_message_ids": list(e.source_message_ids),
            "entities": entities,
            "entity_keys": entity_keys,
            "metadata": canonical_json(e.metadata),
            "provenance": _provenance(e.provenance),
            "embedding_model": self.embedder.model_id,
            "created_at": _utc(e.occurred_at),
            "recorded_at": _utc(e.recorded_at),
            "superseded_by": None,
            "canonical_id": None,
            "status": "active",
            **_log_fields(pe),
        }
        plan.vectors[pk] = vector

    def _on_link(self, pe: PositionedEvent, plan: _Plan) -> None:
        e = pe.event
        assert isinstance(e, MemoryLinked)
        team, user = e.scope.team_id, e.scope.user_id
        pk = scoped_key(team, user, e.link_id)
        plan.links[pk] = {
            "pk": pk,
            "link_id": e.link_id,
            "team_id": team,
            "user_id": user,
            "agent_id": e.scope.agent_id,
            "from_memory_id": e.from_memory_id,
            "to_memory_id": e.to_memory_id,
            "from_pk": scoped_key(team, user, e.from_memory_id),
            "to_pk": scoped_key(team, user, e.to_memory_id),
            "relation": e.relation.value,
            "decided_by": e.decided_by,
            "reason": e.reason,
            "provenance": _provenance(e.provenance),
            "occurred_at": _utc(e.occurred_at),
            "recorded_at": _utc(e.recorded_at),
            **_log_fields(pe),
        }

    def _on_reflection(self, pe: PositionedEvent, plan: _Plan) -> None:
        e = pe.event
        assert isinstance(e, MemoryReflected)
        team, user = e.scope.team_id, e.scope.user_id
        pk = scoped_key(team, user, e.reflection_id)
        plan.reflections[pk] = {
            "pk": pk,
            "reflection_id": e.reflection_id,
            "team_id": team,
            "user_id": user,
            "agent_id": e.scope.agent_id,
            "session_id": e.session_id,
            "decision_id": e.decision_id,
            "outcome_id": e.outcome_id,
            "subject": e.subject,
            "rating": e.rating.value,
            "decision_text": e.decision_text or None,
            "raw_return": e.raw_return,
            "alpha": e.alpha,
            "correct": e.correct,
            "content": e.content,
            "content_hash": content_hash(e.content),
            "lesson": e.lesson,
            "templated": e.templated,
            "provenance": _provenance(e.provenance),
            "occurred_at": _utc(e.occurred_at),
            "recorded_at": _utc(e.recorded_at),
            **_log_fields(pe),
        }
        plan.decisions.append(
            _decision_update(
                pe,
                e,
                status="reflected",
                rating=e.rating.value,
                decision_text=e.decision_text or None,
                outcome_id=e.outcome_id,
                reflection_id=e.reflection_id,
                settled_at=_utc(e.occurred_at),
            )
        )

    def _on_decision(self, pe: PositionedEvent, plan: _Plan) -> None:
        e = pe.event
        assert isinstance(e, DecisionRecorded)
        plan.decisions.append(
            _decision_update(
                pe,
                e,
                status="pending",
                rating=e.rating.value,
                decision_text=e.decision_text,
                horizon_days=e.horizon_days,
                deadline=_utc(e.deadline),
                decided_at=_utc(e.occurred_at),
            )
        )

    def _on_expired(self, pe: PositionedEvent, plan: _Plan) -> None:
        e = pe.event
        assert isinstance(e, DecisionExpired)
        plan.decisions.append(
            _decision_update(
                pe,
                e,
                status="expired",
                deadline=_utc(e.deadline),
                reason=e.reason,
                settled_at=_utc(e.occurred_at),
            )
        )

    def _refuse_taken_ids(self, plan: _Plan) -> list[tuple[PositionedEvent, str]]:
        """Drop from the plan the memories whose id a stored memory of another agent
        owns: a memory id belongs to the agent that wrote it first in the log, and no
        other agent's write (a predicted or copied id) replaces its row. Keys the
        table certainly lacks (its key filter) are not read."""
        refused = self._refuse_taken_turns(plan)
        pks = [pk for pk in plan.owners if pk in plan.memories or pk in plan.fast]
        for pk, agent in self._stored_owners(MEMORIES, pks):
            if agent == plan.owners[pk]:
                continue
            if pk in plan.fast:
                assert plan.fast_source is not None
                pe = _fast_event(plan.fast_source, plan.fast.pop(pk))
            else:
                pe = plan.memory_events[pk]
                plan.memories.pop(pk)
                plan.vectors.pop(pk, None)
            refused.append((pe, _taken(pe.event.memory_id, agent)))  # type: ignore[attr-defined]
        return refused

    def _refuse_taken_turns(self, plan: _Plan) -> list[tuple[PositionedEvent, str]]:
        """The same rule for turns: a message id belongs to the agent that wrote it
        first, so another agent's turn never replaces its text (a memory's evidence)."""
        refused: list[tuple[PositionedEvent, str]] = []
        for pk, agent in self._stored_owners(MESSAGES, list(plan.turn_owners)):
            if agent != plan.turn_owners[pk]:
                pe = plan.turn_events[pk]
                plan.messages.pop(pk)
                refused.append((pe, _taken(pe.event.message_id, agent, "turn")))  # type: ignore[attr-defined]
        return refused

    def _stored_owners(self, table: str, pks: list[str]) -> list[tuple[str, str]]:
        """(pk, agent) of the stored rows among ``pks`` (keys the table certainly
        lacks, by its key filter, are not read)."""
        maybe = [pk for pk, new in zip(pks, self.store.key_absent(table, pks)) if not new] if pks else []
        if not maybe:
            return []
        stored = self.store.rows_by_keys(table, maybe, ["pk", "agent_id"])
        return list(zip(stored.column("pk").to_pylist(), stored.column("agent_id").to_pylist()))

    # ------------------------------------------------------------------ embeddings
    def _needs_vector(self, event: EventBase) -> bool:
        if not isinstance(event, MemoryAdded):
            return False
        emb = event.embedding
        return emb is None or emb.model != self.embedder.model_id

    def embed_ahead(self, batch: Sequence[PositionedEvent], memories: PositionedMemories | None = None) -> int:
        """Embed, in one call, a decoded batch's memories that carry no vector of this
        projector's model, before :meth:`apply` gets the batch: the fast path's rows
        are filled in place, the others are kept by position for ``apply``. Safe to
        call from another thread while ``apply`` writes an earlier batch (only the
        given objects and a locked table are touched). Returns the texts embedded."""
        pending = [pe for pe in batch if self._needs_vector(pe.event)]
        fast_rows = list(memories.unembedded) if memories is not None else []
        texts = [cast(MemoryAdded, pe.event).content for pe in pending]
        if memories is not None:
            texts += [memories.fields[i].content for i in fast_rows]
        if not texts:
            return 0
        matrix = embed_array(self.embedder, texts)
        with self._ahead_lock:
            for pe, vec in zip(pending, matrix):
                self._ahead[_pos_key(pe)] = vec
        if memories is not None and fast_rows:
            memories.vectors[fast_rows] = matrix[len(pending):]
            memories.unembedded = []
        return len(texts)

    def _embed_missing(self, plan: _Plan) -> None:
        """Embed, in one call, every memory of the batch that arrived without a vector
        of this projector's model: the general path's and the fast path's (only the
        rows that will be written; their zero rows are filled in)."""
        missing = [pk for pk, vec in plan.vectors.items() if vec is None]
        source = plan.fast_source
        fast_rows: list[int] = []
        if source is not None and source.unembedded and plan.fast:
            wanted = set(source.unembedded)
            fast_rows = [i for i in plan.fast.values() if i in wanted]
        if not missing and not fast_rows:
            return
        texts = [plan.memories[pk]["content"] for pk in missing]
        if source is not None:
            texts += [source.fields[i].content for i in fast_rows]
        matrix = embed_array(self.embedder, texts)  # checked: shape (the table's width), finite
        for pk, vec in zip(missing, matrix):
            plan.vectors[pk] = vec
        if fast_rows:
            assert source is not None
            source.vectors[fast_rows] = matrix[len(missing):]

    # ------------------------------------------------------------------ writing
    def _write(self, plan: _Plan) -> None:
        dim = self.store.embedding_dim
        if plan.messages:
            self.store.upsert(MESSAGES, _table(MESSAGES, dim, list(plan.messages.values())))
        if plan.links:
            self.store.upsert(LINKS, _table(LINKS, dim, list(plan.links.values())))
        if plan.reflections:
            self.store.upsert(REFLECTIONS, _table(REFLECTIONS, dim, list(plan.reflections.values())))
        if plan.decisions:
            self._write_decisions(plan.decisions)
        if plan.memories or plan.links or plan.fast:
            self._write_memories(plan)

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
        self.store.upsert(DECISIONS, _table(DECISIONS, self.store.embedding_dim, [current[k] for k in keys]))

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
                target = r["to_pk"] if r["relation"] in SUPERSEDING_RELATIONS else r["from_pk"]
                out.setdefault(target, []).append(r)
        return out

    def _write_memories(self, plan: _Plan) -> None:
        dim = self.store.embedding_dim
        rows: dict[str, dict[str, Any]] = dict(plan.memories)
        vectors: dict[str, np.ndarray] = {pk: v for pk, v in plan.vectors.items() if v is not None}
        fast = plan.fast
        # memories whose view a link of this batch may change, but that are not in it
        touched = {
            (link["to_pk"] if link["relation"] in SUPERSEDING_RELATIONS else link["from_pk"])
            for link in plan.links.values()
            if link["relation"] in SUPERSEDING_RELATIONS or link["relation"] == _DUPLICATES
        }
        stored_keys = sorted(touched - rows.keys() - fast.keys())
        existing: set[str] = set()
        if stored_keys:
            tbl = self.store.rows_by_keys(MEMORIES, stored_keys)
            for r in tbl.to_pylist():
                vec = np.asarray(r.pop("vector"), dtype=np.float32)
                rows[r["pk"]] = r
                vectors[r["pk"]] = vec
                existing.add(r["pk"])

        links = self._links_concerning(sorted(rows.keys() | fast.keys()))
        changed: list[str] = []
        for pk, row in rows.items():
            view = derive_view(row["memory_id"], _own_links(links.get(pk, []), row["agent_id"]))
            old = (row["superseded_by"], row["canonical_id"], row["status"])
            row["superseded_by"], row["canonical_id"], row["status"] = view
            if pk not in existing or view != old:
                changed.append(pk)
        if not changed and not fast:
            return
        parts: list[pa.Table] = []
        if changed:
            out = [rows[pk] for pk in changed]
            matrix = np.stack([vectors[pk] for pk in changed]).astype(np.float32, copy=False)
            parts.append(_table(MEMORIES, dim, out, matrix))
        fast_entities: pa.Table | None = None
        if fast:
            assert plan.fast_source is not None
            fields = plan.fast_source.fields
            views = {
                pk: derive_view(fields[i].memory_id, _own_links(links[pk], fields[i].agent_id))
                for pk, i in fast.items()
                if pk in links
            }
            fast_rows, fast_entities = memories_table(plan.fast_source, fast, views, dim=dim)
            parts.append(fast_rows)
        _, updated = self.store.upsert(MEMORIES, parts[0] if len(parts) == 1 else pa.concat_tables(parts))

        new = [pk for pk in changed if pk in plan.memories]
        # Memories re-added under an existing id may leave entity rows that their new
        # version no longer names; when every memory of the batch was an insert there
        # can be none (entity rows are only written after their memory row).
        readded = updated > sum(1 for pk in changed if pk in existing)
        ent_rows: list[dict[str, Any]] = []
        for pk in new:
            m = plan.memories[pk]
            ent_rows.extend(entity_row(pk, key, ent, m) for ent, key in zip(m["entities"], m["entity_keys"]))
        if new or fast:
            ents = _table(ENTITIES, dim, ent_rows)
            if fast_entities is not None:
                ents = pa.concat_tables([ents, fast_entities]) if ents.num_rows else fast_entities
            owners = new + list(fast)
            if readded:
                self.store.replace_rows(ENTITIES, ents, "memory_pk", owners)
            elif ents.num_rows:
                self.store.upsert(ENTITIES, ents)


def _taken(the_id: str, owner: str, what: str = "memory") -> str:
    return (
        f"{what} id {the_id!r} belongs to agent {owner!r} of this memory space; "
        "another agent's write never replaces it"
    )


def _fast_event(source: PositionedMemories, i: int) -> PositionedEvent:
    """A fast-path memory as an event, only to dead-letter it (the dead letter keeps
    the record's own bytes; this carries its position and id)."""
    f = source.fields[i]
    topic, partition, offset = source.positions[i]
    event = MemoryAdded.model_construct(
        scope=Scope(team_id=f.team_id, user_id=f.user_id, agent_id=f.agent_id),
        memory_id=f.memory_id, content=f.content,
    )
    return PositionedEvent(position=LogPosition(topic=topic, partition=partition, offset=offset), event=event)


def _own_links(links: list[dict[str, Any]], agent_id: str) -> list[dict[str, Any]]:
    """The links that may change a memory's view: those written in its own agent's
    scope. Another agent's link (even one naming a predicted id) never supersedes or
    merges a memory (``memstream.domain.access``; docs/security.md)."""
    return [link for link in links if link.get("agent_id") == agent_id]


def _table(name: str, dim: int, rows: list[dict[str, Any]], vectors: np.ndarray | None = None) -> pa.Table:
    """Rows (dicts) as an Arrow table of exactly the table's schema (Arrow's own
    converter; keys outside the schema are ignored). The vector column is built from a
    float32 matrix in one piece instead of per-row Python lists."""
    schema = schema_for(name, dim)
    if "vector" not in schema.names:
        return pa.Table.from_pylist(rows, schema=schema)
    if vectors is None or vectors.shape != (len(rows), dim):
        raise ValueError("vector matrix does not match the rows")
    at = schema.get_field_index("vector")
    rest = schema.remove(at)
    base = pa.Table.from_pylist(rows, schema=rest)
    column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), type=pa.float32()), dim)
    return base.add_column(at, schema.field(at), column)
