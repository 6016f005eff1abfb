"""The small facts about a memory space that ranking needs besides the candidates:
who speaks in it (query processing), how many memories it holds and how many name
each entity (the entity boost's IDF). Kept in the :class:`SearchCache` per table
version, because a conversation's questions keep naming its few participants."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pyarrow.compute as pc

from memstream.domain.content import normalize_content
from memstream.domain.events import Scope
from memstream.projections.schema import ENTITIES, MEMORIES, MESSAGES
from memstream.projections.search import queries as q
from memstream.projections.search.cache import (
    FACTS_MAX,
    READ_NOT_BEFORE,
    SearchCache,
    Version,
    space_key,
    table_identity,
)
from memstream.projections.store import LanceStore, chunked, gather_all, in_list, space_where, wait

__all__ = ["WHOLE_SPACE_MEMORIES", "SPEAKERS_TTL_S", "space_speakers", "space_size", "entity_stats"]

WHOLE_SPACE_MEMORIES = 2_000
"""A space of at most this many memories has its entity names counted whole at the
first name a search misses (one read per version of ``entities``; a larger space
reads the names its searches ask for)."""

SPEAKERS_TTL_S = 30.0
"""How long a memory space's list of speakers is reused for query processing (a
speaker who joins meanwhile only misses the name removal, never the speaker prior)."""


def space_speakers(cache: SearchCache, store: LanceStore, scope: Scope) -> frozenset[str]:
    """The distinct speakers of the space's turns, cached for :data:`SPEAKERS_TTL_S`
    (a read that waited for a position takes only a list read after it was reached)."""
    key = space_key(str(store.root), scope)
    now = time.monotonic()
    # kept until read time + TTL: a list read after ``not_before`` is kept past not_before + TTL
    hit = cache.speakers(key, max(now, READ_NOT_BEFORE.get() + SPEAKERS_TTL_S))
    if hit is not None:
        return hit
    where = f"{space_where(scope)} AND speaker IS NOT NULL"
    table = wait(q.scan(q.native(store, MESSAGES), where, ["speaker"]))
    speakers = frozenset(str(v) for v in pc.unique(table.column("speaker")).to_pylist() if v)
    cache.keep_speakers(key, now + SPEAKERS_TTL_S, speakers)
    return speakers


async def space_size(cache: SearchCache, store: LanceStore, scope: Scope, version: Version | None = None) -> int:
    """How many memories the space holds (``LanceStore.count_memories``), counted once
    per version of the memories table: counting a large space through its
    ``team_id`` / ``user_id`` indexes costs about as much as a lookup. Kept only when
    no write landed while counting, so a count is never filed under a wrong version.
    ``version``: the memories table's version the search already asked for (else asked)."""
    table = q.native(store, MEMORIES)
    key = space_key(str(store.root), scope)
    if version is None:
        version = (*table_identity(key[0], MEMORIES), int(await table.version()))
    hit = cache.size(key)
    if hit is not None and hit[0] == version:
        return hit[1]
    if hit is not None and await asyncio.to_thread(cache.unchanged, key[0], MEMORIES, scope, hit[0], version):
        cache.keep_size(key, version, hit[1])
        return hit[1]
    total = int(await table.count_rows(space_where(scope)))
    if await table.version() == version[2]:
        cache.keep_size(key, version, total)
    return total


async def entity_stats(
    cache: SearchCache,
    store: LanceStore,
    scope: Scope,
    keys: Iterable[str],
    memories_version: Version | None = None,
    entities_version: Version | None = None,
) -> tuple[dict[str, int], int]:
    """How many memories of the space name each entity, and how many there are (what
    ``LanceStore.entity_frequencies`` and ``count_memories`` return), kept per version
    of their table like :func:`space_size` (``memories_version``: passed on to it;
    ``entities_version``: the entities table's version the search already asked for,
    else asked)."""
    names = sorted({normalize_content(n) for n in keys if normalize_content(n)})
    entities = q.native(store, ENTITIES)
    key = space_key(str(store.root), scope)
    version = entities_version or (*table_identity(key[0], ENTITIES), int(await entities.version()))
    hit = cache.frequencies(key)
    still = hit is not None and (
        hit[0] == version or await asyncio.to_thread(cache.unchanged, key[0], ENTITIES, scope, hit[0], version)
    )
    known, complete = (dict(hit[1]), hit[2]) if hit is not None and still else ({}, False)
    missing = [] if complete else [n for n in names if n not in known]
    total = await space_size(cache, store, scope, memories_version)
    counted, whole = await _count_names(entities, scope, missing, total) if missing else ({}, False)
    if still and not missing and hit is not None and hit[0] != version:
        cache.keep_frequencies(key, version, hit[1], complete)
    if missing and await entities.version() == version[2]:
        if whole:
            cache.keep_frequencies(key, version, counted, True)
        else:
            known.update(counted)
            cache.keep_frequencies(key, version, known if len(known) <= FACTS_MAX else counted)
    if whole:
        known, counted = counted, {}
    return {k: known.get(k, counted.get(k, 0)) for k in names}, int(total)


async def _count_names(entities: Any, scope: Scope, missing: list[str], total: int) -> tuple[dict[str, int], bool]:
    """How many of the space's entity rows carry each name: every name of the space
    (``True``) when the space is small enough to count whole (one read, then no later
    search of this version misses), else the ``missing`` ones (0 for a name not found)."""
    space = space_where(scope)
    if total <= WHOLE_SPACE_MEMORIES:
        table = await q.scan(entities, space, ["name_key"], FACTS_MAX * 4 + 1)
        counts = Counter(table.column("name_key").to_pylist())
        if table.num_rows <= FACTS_MAX * 4 and len(counts) <= FACTS_MAX:
            return dict(counts), True
    reads = [q.scan(entities, f"{space} AND {in_list('name_key', chunk)}", ["name_key"]) for chunk in chunked(missing)]
    counted = {k: 0 for k in missing}
    for tbl in await gather_all(reads):
        for name in tbl.column("name_key").to_pylist():
            counted[name] = counted.get(name, 0) + 1
    return counted, False
