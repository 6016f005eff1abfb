"""The no-LLM extractor: each qualifying new turn becomes one ``episodic`` memory."""

from __future__ import annotations

import re

from memstream.domain.events import MAX_MEMORY_CHARS, Entity, EntityKind, MemoryType
from memstream.domain.extraction.drafts import DEFAULT_PRIORITY, MAX_ENTITIES, MemoryDraft
from memstream.domain.extraction.window import Window

__all__ = ["heuristic_entities", "heuristic_drafts"]

_STOPWORDS = frozenset(
    """
    i i'm i've i'll i'd me my mine we we're our us you you're your he he's him his she she's
    her it it's its they they're them their this that these those there here the a an and
    but or so if then than also just not no yes yeah yep ok okay hi hello hey thanks thank
    please sorry sure well oh ah maybe what when where why how who whom which whose can
    could would should will shall do does did is are was were be been have has had let
    let's at in on for to from with by of as after before since until about into over
    under again today tomorrow yesterday tonight now later soon great good nice cool fine
    monday tuesday wednesday thursday friday saturday sunday january february march april
    may june july august september october november december user assistant system
    """.split()
)
"""Capitalised words that are never entities on their own (sentence starters, pronouns,
greetings, weekdays, months)."""

_NOT_ASCII_LOWER_WORD = re.compile(r"(?<![\w'’.-])[\d_'’.-]*([^\W\d_a-z])[\w'’.-]*", re.UNICODE)
r"""The words of a text except those starting with an ASCII lower-case letter (group 1
starts the word). A word is a letter, then word characters and ``'’.-``
(``[^\W\d_][\w'’.-]*`` scanned left to right): the rest of a run of those
characters from the run's first letter; here, of a run whose first letter is not
``a-z``. Most words of a text start lower-case and can never begin a name, so the
regex skips them instead of the Python loop. They still end a name: the text between
two names' words is then not a single space."""


_ENTITY_CACHE_SIZE = 16_384
_entities_seen: dict[tuple[str, EntityKind], Entity] = {}


def _entity(name: str, kind: EntityKind) -> Entity:
    """``Entity(name=name, kind=kind)``, shared when built before (entities are
    immutable, and the same speakers and names recur turn after turn)."""
    key = (name, kind)
    found = _entities_seen.get(key)
    if found is None:
        found = Entity(name=name, kind=kind)
        if len(_entities_seen) >= _ENTITY_CACHE_SIZE:
            _entities_seen.clear()
        _entities_seen[key] = found
    return found


def heuristic_entities(text: str, speaker: str | None) -> tuple[Entity, ...]:
    """Entities without a model: the speaker (a ``person``), then every run of up to four
    capitalised words of two or more letters separated by single spaces (kind ``other``: the heuristic cannot
    tell a person from a place). Stopwords (:data:`_STOPWORDS`: pronouns, sentence
    starters, greetings, weekdays, months) are never part of a name; punctuation
    attached to a word ("Paris.", "Bob's") ends the name there. Case-insensitively
    unique, at most :data:`MAX_ENTITIES`."""
    found: list[Entity] = []
    seen: set[str] = set()

    def add(name: str, kind: EntityKind) -> None:
        key = name.casefold()
        if name and key not in seen and len(found) < MAX_ENTITIES:
            seen.add(key)
            found.append(_entity(name[:200], kind))

    if speaker and speaker.strip():
        add(" ".join(speaker.split()), EntityKind.person)
    run: list[str] = []

    def flush() -> None:
        if run:
            add(" ".join(run), EntityKind.other)
            run.clear()

    last_end = -1
    for match in _NOT_ASCII_LOWER_WORD.finditer(text):
        word = text[match.start(1) : match.end()]
        if not word[0].isupper():
            # Not a name (the word's first character is its bare form's first: only
            # its end is ever stripped), which ends any run.
            if run:
                flush()
            last_end = match.end()
            continue
        bare = word.rstrip(".'’-")
        if bare.endswith(("'s", "’s")):
            bare = bare[:-2]
        is_name = len(bare) >= 2 and bare[0].isupper() and bare.casefold() not in _STOPWORDS
        gap = text[last_end : match.start(1)] if last_end >= 0 else ""
        if run and (not is_name or gap != " " or len(run) >= 4):
            flush()
        if is_name:
            run.append(bare)
            if word != bare:
                flush()
        last_end = match.end()
    flush()
    return tuple(found)


def heuristic_drafts(window: Window) -> list[MemoryDraft]:
    """Memories without a model: each qualifying new turn becomes one ``episodic``
    memory of priority 50 whose only source is that turn. The content is the gated text,
    prefixed with ``"<speaker>: "`` when the turn names its speaker (so "what did Alice
    say" finds it), cut to the memory size limit. Its point time is the turn's time;
    its entities follow :func:`heuristic_entities`."""
    drafts: list[MemoryDraft] = []
    for turn in window.new_turns:
        speaker = turn.message.speaker
        content = f"{speaker.strip()}: {turn.text}" if speaker and speaker.strip() else turn.text
        notes: tuple[str, ...] = ()
        if len(content) > MAX_MEMORY_CHARS:
            content = content[: MAX_MEMORY_CHARS - 1].rstrip() + "…"
            notes = ("content_cut",)
        drafts.append(
            MemoryDraft(
                content=content,
                memory_type=MemoryType.episodic,
                priority=DEFAULT_PRIORITY,
                source_message_ids=(turn.message_id,),
                occurred_at=turn.message.occurred_at,
                timestamp=turn.message.occurred_at,
                entities=heuristic_entities(turn.text, speaker),
                notes=notes,
            )
        )
    return drafts
