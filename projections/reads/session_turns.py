"""Conversation turns read back from the ``messages`` projection (L0).

The extractor keeps a session's latest extracted turns in memory as background for
its next window; after a restart or a partition move that memory is empty, and the
turns are read from here instead (:func:`turns_before`), so the restarted extractor
builds the window it would have built without the restart. ``memstream extract``
(one window by hand, and ``--retry-failed``) reads its turns here too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from memstream.domain.events import MessageObserved, Scope, build_event
from memstream.projections.schema import MESSAGES
from memstream.projections.store import chunked, in_list, quote, space_where

__all__ = ["message_from_row", "session_turns", "turns_by_id", "turns_before"]


def message_from_row(row: Mapping[str, Any]) -> MessageObserved:
    """The turn a ``messages`` row was projected from."""
    meta = row.get("metadata")
    return build_event(
        MessageObserved,
        scope={"team_id": row["team_id"], "user_id": row["user_id"], "agent_id": row["agent_id"]},
        session_id=row.get("session_id"),
        message_id=row["message_id"],
        role=row["role"],
        speaker=row.get("speaker"),
        content=row["content"],
        occurred_at=row["occurred_at"],
        metadata=json.loads(meta) if isinstance(meta, str) and meta else {},
    )


def _log_order(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return (row.get("log_partition") or 0, row.get("log_offset") or 0, row["occurred_at"])


def _session_where(scope: Scope, session_id: str | None, agent: bool) -> str:
    where = space_where(scope)
    if agent:
        where += f" AND agent_id = {quote(scope.agent_id)}"
    if session_id is None:
        return where + " AND session_id IS NULL"
    return where + f" AND session_id = {quote(session_id)}"


def session_turns(store: Any, scope: Scope, session_id: str) -> list[MessageObserved]:
    """Every projected turn of a session of the memory space, oldest first (by time,
    then log position), whichever agent spoke."""
    rows = store.rows(MESSAGES, _session_where(scope, session_id, agent=False)).to_pylist()
    rows.sort(key=lambda r: (r["occurred_at"], r.get("log_partition") or 0, r.get("log_offset") or 0))
    return [message_from_row(r) for r in rows]


def turns_by_id(store: Any, scope: Scope, message_ids: Sequence[str]) -> list[MessageObserved]:
    """The projected turns with these ids of the scope's own agent, in the order given
    (ids not projected, or another agent's, are left out: whoever names a turn id
    reads only its own agent's turns)."""
    found: dict[str, MessageObserved] = {}
    own = f"{space_where(scope)} AND agent_id = {quote(scope.agent_id)}"
    for chunk in chunked(list(dict.fromkeys(message_ids))):
        for row in store.rows(MESSAGES, f"{own} AND {in_list('message_id', chunk)}").to_pylist():
            found[row["message_id"]] = message_from_row(row)
    return [found[m] for m in message_ids if m in found]


def turns_before(
    store: Any, scope: Scope, session_id: str | None, partition: int, offset: int, limit: int
) -> list[MessageObserved]:
    """The last ``limit`` turns of the conversation (scope with its agent, session)
    logged before ``offset`` of the messages topic's ``partition``, oldest first: the
    order in which a running extractor saw them (a conversation's turns share a
    partition, keyed by their session)."""
    if limit <= 0:
        return []
    where = (
        f"{_session_where(scope, session_id, agent=True)}"
        f" AND log_partition = {int(partition)} AND log_offset < {int(offset)}"
    )
    rows = store.rows(MESSAGES, where).to_pylist()
    rows.sort(key=_log_order)
    return [message_from_row(r) for r in rows[-limit:]]
