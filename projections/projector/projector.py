"""The projector: turns a batch of positioned events into LanceDB rows, idempotently.

The worker's projector service (``memstream.services.projector.service``) reads the topics in
batches and hands each to :meth:`Projector.apply` from an executor thread.

* **Resume exactly**: records below the stored position of their (topic, partition)
  are skipped; once the rows are written the positions move to one past the highest
  offset seen (never backwards), in the same call. Rows written before a crash are
  applied again on restart, which changes nothing.
* **Idempotent**: every table is upserted by a scoped key (``team|user|id``); a batch
  is deduplicated first (the latest log position wins).
* **Embeddings**: a memory carrying a vector of the configured model is stored as
  carried; all others are embedded in one call per batch (or ahead, by
  :meth:`Projector.embed_ahead`, while the previous batch is written).
* **Bad events do not stop the batch**: an event that cannot be projected lands in
  ``ApplyResult.failed`` with a one-line reason (the service dead-letters it) and its
  position is still passed. Infrastructure errors raise instead, and the whole batch is
  retried, which is safe.

Rows come from :mod:`memstream.projections.projector.rows`; the view derived from links and the
writes are :mod:`memstream.projections.projector.plan_writer`'s."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from memstream.codec.batch import PositionedMemories
from memstream.codec.values import event_values
from memstream.domain.events import (
    DecisionExpired,
    DecisionRecorded,
    EventBase,
    MemoryAdded,
    MemoryLinked,
    MemoryReflected,
    MessageObserved,
    OutcomeObserved,
    Scope,
    SubjectForgotten,
)
from memstream.domain.log import LogPosition, PositionedEvent
from memstream.projections.embedders import Embedder, embed_array
from memstream.projections.projector.forget import delete_subject, drop_old_versions, shred_deleted_rows
from memstream.projections.projector.plan_writer import SUPERSEDING_RELATIONS, Plan, PlanWriter, derive_view
from memstream.projections.projector.rows import (
    decision_update,
    link_row,
    memory_row,
    message_row,
    reflection_row,
)
from memstream.projections.schema import MEMORIES, MESSAGES, scoped_key
from memstream.projections.store import LanceStore

__all__ = ["ApplyResult", "Projector", "ProjectionError", "SUPERSEDING_RELATIONS", "derive_view"]

log = logging.getLogger("memstream.projections")


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
        self._writer = PlanWriter(store)
        # Vectors made by :meth:`embed_ahead` for general-path events, by position,
        # until the batch holding them is applied.
        self._ahead: dict[tuple[str, int, int], np.ndarray] = {}
        self._ahead_lock = threading.Lock()
        # The stored positions, read once: the projector is the table set's only
        # writer (one worker per directory), so after the first read it knows them
        # without a LanceDB query per batch.
        self._positions: dict[tuple[str, int], int] | None = None
        # After a forget: when the versions readers may still be on can go (monotonic).
        self.reader_grace = store.reader_grace
        self.shred_due: float | None = None
        self._handlers: dict[type[EventBase], Callable[[PositionedEvent, Plan], None]] = {
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

        plan = Plan(fast_source=memories)
        with self._ahead_lock:
            plan.ahead = {k: v for k in fresh if (v := self._ahead.pop(k, None)) is not None}
            for pe in batch:  # skipped ones too: nothing of this batch stays behind
                self._ahead.pop(_pos_key(pe), None)
        forgot = False
        for key in sorted(fresh):
            item = fresh[key]
            if not isinstance(item, int) and isinstance(item.event, SubjectForgotten):
                # A forget covers exactly what precedes it: the plan so far is written
                # first, and what follows it in the batch goes to a fresh plan.
                self._write_plan(plan, result)
                self._forget(item)
                plan = Plan(fast_source=memories, ahead=plan.ahead)
                forgot = True
                continue
            # Most of a batch is fast-path memories: filed without the general dispatch.
            refused = self._on_fast_memory(item, plan) if isinstance(item, int) else self._file(item, plan)
            if refused is not None:
                result.failed.append(refused)
        self._write_plan(plan, result)
        result.applied = len(fresh) - len(result.failed)
        if forgot:
            self._shred()

        next_offsets: dict[tuple[str, int], int] = {}
        for topic, partition, offset in fresh:
            tp = (topic, partition)
            next_offsets[tp] = max(next_offsets.get(tp, 0), offset + 1, stored.get(tp, 0))
        self.save_positions(next_offsets)
        log.debug(
            "applied %d, skipped %d, failed %d; positions %s",
            result.applied, result.skipped, len(result.failed), next_offsets,
        )
        return result

    def _write_plan(self, plan: Plan, result: ApplyResult) -> None:
        result.failed.extend(self._refuse_taken_ids(plan))
        self._embed_missing(plan)
        self._writer.write(plan)

    # ------------------------------------------------------------------ forgetting
    def _forget(self, pe: PositionedEvent) -> None:
        """Delete the rows a ``SubjectForgotten`` covers: its space's (or team's) rows
        last written from its own topic and partition below its offset. The forget
        command writes one to each topic the projector folds, so a write after it, in
        any topic and any batch, survives; applied again after a crash it deletes
        the same rows (positions move only once the whole batch is written)."""
        e = pe.event
        assert isinstance(e, SubjectForgotten)
        p = pe.position
        delete_subject(
            self.store, e.scope.team_id, None if e.whole_team else e.scope.user_id, before=(p.topic, p.partition, p.offset)
        )

    def _shred(self) -> None:
        """Down to the files: fragments with deletions are rewritten and older versions
        dropped, now for those older than the readers' grace and later for the rest."""
        shred_deleted_rows(self.store, grace=self.reader_grace)
        self.shred_due = time.monotonic() + self.reader_grace.total_seconds()

    def finish_shredding(self) -> bool:
        """Once the readers' grace after a forget has passed, drop the versions that
        still held the forgotten rows (the worker's maintenance calls this); True
        when it did."""
        if self.shred_due is None or time.monotonic() < self.shred_due:
            return False
        try:
            drop_old_versions(self.store, older_than=self.reader_grace)
        except Exception as exc:  # noqa: BLE001 - a maintenance task: the next call tries again
            log.warning("dropping the versions that held forgotten rows failed (will retry): %s", exc)
            return False
        self.shred_due = None
        log.info("forgotten rows dropped from the older table versions")
        return True

    def _file(self, pe: PositionedEvent, plan: Plan) -> tuple[PositionedEvent, str] | None:
        """Put one event into the plan; the event and the reason when it cannot be
        projected."""
        handler = self._handlers.get(type(pe.event))
        try:
            if handler is None:
                raise ProjectionError(f"no projection for event type {pe.event.type!r}")
            handler(pe, plan)
        except ProjectionError as exc:
            return pe, str(exc)
        except Exception as exc:  # noqa: BLE001 - one event must not block the log
            # Handlers only reshape an already validated event; anything else they
            # raise is about this event, and retrying the batch would never end.
            log.warning("cannot project %s", pe.position, exc_info=True)
            return pe, f"cannot project: {type(exc).__name__}: {exc}"
        return None

    # ------------------------------------------------------------------ handlers
    def _on_message(self, pe: PositionedEvent, plan: Plan) -> None:
        e = pe.event
        assert isinstance(e, MessageObserved)
        row = message_row(e, _pos_key(pe))
        pk = row["pk"]
        if plan.turn_owners.setdefault(pk, e.scope.agent_id) != e.scope.agent_id:
            raise ProjectionError(_taken(e.message_id, plan.turn_owners[pk], "turn"))
        plan.turn_events[pk] = pe
        plan.messages[pk] = row

    def _check_fast(self, memories: PositionedMemories) -> None:
        dim = self.store.embedding_dim
        if memories.model != self.embedder.model_id or memories.vectors.shape != (len(memories), dim):
            raise ValueError(
                f"fast-path memories carry {memories.vectors.shape} vectors of {memories.model!r}; "
                f"this projector stores {dim}-dimension vectors of {self.embedder.model_id!r}"
            )

    def _on_fast_memory(self, i: int, plan: Plan) -> tuple[PositionedEvent, str] | None:
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

    def _on_memory(self, pe: PositionedEvent, plan: Plan) -> None:
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
        row = memory_row(event_values(e), _pos_key(pe), self.embedder.model_id)
        pk = row["pk"]
        if plan.owners.setdefault(pk, e.scope.agent_id) != e.scope.agent_id:
            raise ProjectionError(_taken(e.memory_id, plan.owners[pk]))
        plan.memory_events[pk] = pe
        plan.fast.pop(pk, None)  # a later position wins
        plan.memories[pk] = row
        plan.vectors[pk] = vector

    def _on_link(self, pe: PositionedEvent, plan: Plan) -> None:
        e = pe.event
        assert isinstance(e, MemoryLinked)
        row = link_row(e, _pos_key(pe))
        plan.links[row["pk"]] = row

    def _on_reflection(self, pe: PositionedEvent, plan: Plan) -> None:
        e = pe.event
        assert isinstance(e, MemoryReflected)
        row = reflection_row(e, _pos_key(pe))
        plan.reflections[row["pk"]] = row
        plan.decisions.append(
            decision_update(
                e, _pos_key(pe), status="reflected", rating=e.rating.value, decision_text=e.decision_text or None,
                outcome_id=e.outcome_id, reflection_id=e.reflection_id, settled_at=e.occurred_at,
            )
        )

    def _on_decision(self, pe: PositionedEvent, plan: Plan) -> None:
        e = pe.event
        assert isinstance(e, DecisionRecorded)
        plan.decisions.append(
            decision_update(
                e, _pos_key(pe), status="pending", rating=e.rating.value, decision_text=e.decision_text,
                horizon_days=e.horizon_days, deadline=e.deadline, decided_at=e.occurred_at,
            )
        )

    def _on_expired(self, pe: PositionedEvent, plan: Plan) -> None:
        e = pe.event
        assert isinstance(e, DecisionExpired)
        plan.decisions.append(
            decision_update(
                e, _pos_key(pe), status="expired", deadline=e.deadline, reason=e.reason, settled_at=e.occurred_at
            )
        )

    def _refuse_taken_ids(self, plan: Plan) -> list[tuple[PositionedEvent, str]]:
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

    def _refuse_taken_turns(self, plan: Plan) -> list[tuple[PositionedEvent, str]]:
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

    def _embed_missing(self, plan: Plan) -> None:
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
