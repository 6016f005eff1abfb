"""Ids derived from content, and exact dedup by content hash.

Memory ids come from the scope and the content hash (keyed), link ids from their
endpoints: a repeated run (a crash after producing, a rebalance) produces the same ids
and the projection's upserts absorb it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import replace

from memstream.domain.content import content_hash
from memstream.domain.events import LinkRelation, Scope
from memstream.domain.extraction.drafts import DraftIssue, MemoryDraft

__all__ = ["memory_id_for", "memory_id_key", "content_memory_id", "link_id_for", "dedupe_batch", "split_known"]


def memory_id_for(scope: Scope, digest: str, key: bytes) -> str:
    """The memory id of a content hash in a memory space and agent: the same statement
    of the same agent always gets the same id, so a repeated run is absorbed by
    upserts, and two agents never share one. Keyed (HMAC under ``key``, the worker's
    :func:`memory_id_key`): a client that guesses another agent's text cannot compute
    the id that agent's next memory will get, so it can neither probe for it nor take
    it first (docs/security.md)."""
    if not key:
        raise ValueError("memory ids need the worker's id key")
    parts = [scope.team_id, scope.user_id, scope.agent_id, digest]
    return "mem-" + hmac.new(key, "\x1f".join(parts).encode(), hashlib.sha256).hexdigest()[:32]


def content_memory_id(scope: Scope, content: str, key: bytes) -> str:
    """The id of a client memory written without one: the same content (normalised)
    written again by the same team, user and agent is the same memory, whichever path
    wrote it (and the id the extractor gives that statement)."""
    return memory_id_for(scope, content_hash(content), key)


def memory_id_key(worker_key: bytes) -> bytes:
    """The key of extracted memory ids, derived from the worker key (its own use, so
    no id is ever a signature of anything)."""
    return hmac.new(worker_key, b"memstream memory ids v1", hashlib.sha256).digest()


def link_id_for(from_id: str, to_id: str, relation: LinkRelation | str) -> str:
    key = f"{from_id}\x1f{to_id}\x1f{relation}".encode()
    return "lnk-" + hashlib.sha256(key).hexdigest()[:32]


def dedupe_batch(drafts: Sequence[MemoryDraft]) -> tuple[list[MemoryDraft], list[DraftIssue]]:
    """Drop drafts whose content hash repeats an earlier draft of the same batch; the
    kept draft takes the union of their sources and the highest priority."""
    kept: dict[str, MemoryDraft] = {}
    issues: list[DraftIssue] = []
    for draft in drafts:
        digest = draft.content_hash
        first = kept.get(digest)
        if first is None:
            kept[digest] = draft
            continue
        sources = tuple(dict.fromkeys(first.source_message_ids + draft.source_message_ids))
        kept[digest] = replace(
            first,
            source_message_ids=sources,
            priority=max(first.priority, draft.priority),
            occurred_at=max(first.occurred_at, draft.occurred_at),
        )
        issues.append(DraftIssue("duplicate_in_batch", digest, draft.content))
    return list(kept.values()), issues


def split_known(
    drafts: Sequence[MemoryDraft], known: Mapping[str, str]
) -> tuple[list[MemoryDraft], list[tuple[MemoryDraft, str]]]:
    """``(new drafts, [(draft, existing memory id)])`` given the hashes already stored in
    the memory space (``{content_hash: memory_id}``)."""
    new: list[MemoryDraft] = []
    duplicates: list[tuple[MemoryDraft, str]] = []
    for draft in drafts:
        existing = known.get(draft.content_hash)
        if existing is None:
            new.append(draft)
        else:
            duplicates.append((draft, existing))
    return new, duplicates
