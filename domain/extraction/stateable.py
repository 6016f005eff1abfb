"""Which new turns plainly state a fact: the check on a model that answers "nothing".

A small model asked to extract memories may declare a window empty although its turns
say "I moved to Porto" or "my sister is a nurse". The extractor cannot know the truth,
but it can tell a window that plainly states facts from small talk: a turn with a
declarative sentence (not a question) whose subject is the speaker ("I", "my", "we",
"our"), of at least :data:`MIN_WORDS` words. That rule is deliberately narrow (it
misses third-person facts, and says nothing about whether the fact is worth keeping):
it only flags the answers that are plainly wrong, ``declared_empty_with_facts``.
"""

from __future__ import annotations

import re

from memstream.domain.extraction.drafts import DraftIssue
from memstream.domain.extraction.window import Window

__all__ = ["MIN_WORDS", "stateable_turns", "declared_empty_with_facts"]

MIN_WORDS = 4
"""Fewer words than this ("I see.", "My bad.") state nothing."""

_SENTENCE = re.compile(r"[^.!?\n]+[.!?]*")
_FIRST_PERSON = re.compile(r"\b(?:i|i'm|i’m|i've|i’ve|i'd|i’d|my|we|we're|we’re|our)\b", re.IGNORECASE)
_WORD = re.compile(r"\w+")


def _states_a_fact(text: str) -> bool:
    for sentence in _SENTENCE.findall(text):
        sentence = sentence.strip()
        if not sentence or sentence.endswith("?"):
            continue
        if len(_WORD.findall(sentence)) >= MIN_WORDS and _FIRST_PERSON.search(sentence):
            return True
    return False


def stateable_turns(window: Window) -> tuple[str, ...]:
    """The ids of the window's new qualifying turns that plainly state a fact (see the
    module docstring)."""
    return tuple(t.message_id for t in window.new_turns if _states_a_fact(t.text))


def declared_empty_with_facts(window: Window) -> DraftIssue | None:
    """The record entry for a window the model declared empty although some of its
    turns plainly state facts (``None`` when none does)."""
    found = stateable_turns(window)
    if not found:
        return None
    return DraftIssue(
        "declared_empty_with_facts",
        f"the model declared the window empty; {len(found)} turn(s) state facts: " + ", ".join(found[:10]),
    )
