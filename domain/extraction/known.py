"""What the extraction call is told the memory space already knows.

Mem0's phase 1 shows the model the existing memories most similar to the new turns in
the extraction call itself, so it does not extract again what is known and can link a
new memory to a known one at once. Here the extractor recalls them (the judgment's
own candidate recall, in the window's scope), :func:`pick_known` keeps the best
``KNOWN_MEMORIES`` (the extractor's) of them, :func:`render_known` shows them as ``[k1]``...
and :func:`read_known_links` reads the links the model named (``"links": [{"known":
"k2", "relation": "supersedes"}]`` on a memory). :func:`decide_by_links` turns those
into the decisions the judgment would otherwise make; the judgment call is kept for the
drafts whose similar memories the extraction call did not see.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memstream.domain.events import LinkRelation
from memstream.domain.extraction.drafts import MemoryDraft, clean_text
from memstream.domain.extraction.judgment import Action, Candidate, Decision

__all__ = ["KNOWN_RELATIONS", "pick_known", "render_known", "read_known_links", "decide_by_links", "uncertain"]

KNOWN_RELATIONS: Mapping[str, LinkRelation] = {
    "supersedes": LinkRelation.supersedes,
    "preference_update": LinkRelation.preference_update,
    "contradicts": LinkRelation.contradicts,
    "same_entity": LinkRelation.same_entity,
    "narrative_continuation": LinkRelation.narrative_continuation,
    "duplicates": LinkRelation.duplicates,
}
"""Relations a new memory may name to a known one (``duplicates``: it is the same
statement, and no new memory is stored)."""

Links = tuple[tuple[str, LinkRelation], ...]


def pick_known(found: Sequence[Sequence[Candidate]], limit: int) -> list[Candidate]:
    """At most ``limit`` distinct memories from the candidate lists (one list per new
    turn, best first), taken rank by rank: every turn's best memory, then every
    turn's second... (within a rank, the higher score first), so each turn's closest
    known memory is shown before any turn's second."""
    picked: dict[str, Candidate] = {}
    depth = max((len(c) for c in found), default=0)
    for rank in range(depth):
        layer = sorted((c[rank] for c in found if rank < len(c)), key=lambda c: -(c.score or 0.0))
        for c in layer:
            if len(picked) >= limit:
                return list(picked.values())
            picked.setdefault(c.memory_id, c)
    return list(picked.values())


def render_known(known: Sequence[Candidate]) -> str:
    """One ``[k<n>] (type) content`` line per known memory; ``(none)`` without any."""
    if not known:
        return "(none)"
    lines = []
    for n, c in enumerate(known, 1):
        kind = f" ({c.memory_type})" if c.memory_type else ""
        lines.append(f"[k{n}]{kind} {' '.join(c.content.split())[:400]}")
    return "\n".join(lines)


def read_known_links(value: Any, known: Sequence[Candidate]) -> dict[str, Links]:
    """``clean content -> ((memory id, relation), ...)`` for every memory of the model's
    answer that names known memories; unknown aliases and relations are ignored."""
    by_alias = {f"k{n}": c.memory_id for n, c in enumerate(known, 1)}
    out: dict[str, Links] = {}
    scenes = value.get("scenes") if isinstance(value, Mapping) else None
    for scene in scenes if isinstance(scenes, list) else ():
        memories = scene.get("memories") if isinstance(scene, Mapping) else None
        for memory in memories if isinstance(memories, list) else ():
            if not isinstance(memory, Mapping) or not isinstance(memory.get("content"), str):
                continue
            links: list[tuple[str, LinkRelation]] = []
            raw = memory.get("links")
            for link in raw if isinstance(raw, list) else ():
                if not isinstance(link, Mapping):
                    continue
                target = by_alias.get(str(link.get("known", "")).strip().strip("[]").lower())
                relation = KNOWN_RELATIONS.get(str(link.get("relation", "")).strip().lower())
                if target is not None and relation is not None and (target, relation) not in links:
                    links.append((target, relation))
            if links:
                out[clean_text(memory["content"])] = tuple(links)
    return out


def decide_by_links(drafts: Sequence[MemoryDraft], links: Mapping[str, Links]) -> dict[int, Decision]:
    """The decisions the extraction call made by naming links: ``duplicates`` merges
    the draft into the known memory, ``supersedes`` or ``preference_update`` makes it an
    update of it, other relations store it with the links."""
    out: dict[int, Decision] = {}
    for i, draft in enumerate(drafts):
        named = links.get(clean_text(draft.content))
        if not named:
            continue
        reason = "named by the extraction call, which saw the known memories"
        duplicate = next((t for t, r in named if r is LinkRelation.duplicates), None)
        if duplicate is not None:
            out[i] = Decision(i, Action.merge, target=duplicate, reason=reason, decided_by="llm")
            continue
        replaced = next((t for t, r in named if r in (LinkRelation.supersedes, LinkRelation.preference_update)), None)
        action = Action.update if replaced is not None else Action.store
        kept = tuple((t, r) for t, r in named if r is not LinkRelation.supersedes)
        out[i] = Decision(i, action, target=replaced, links=kept, reason=reason, decided_by="llm")
    return out


def uncertain(
    candidates: Sequence[Sequence[Candidate]], known: Sequence[Candidate], decided: Mapping[int, Decision]
) -> list[list[Candidate]]:
    """The candidates left for the judgment (best first, per draft): none for a draft
    the extraction call decided, nor for one whose closest memory the call saw among
    the known ones and extracted anyway, naming no link; the full list otherwise."""
    shown = {c.memory_id for c in known}
    return [
        [] if i in decided or (found and found[0].memory_id in shown) else list(found)
        for i, found in enumerate(candidates)
    ]
