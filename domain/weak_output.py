"""Rules for what weak models write inside well-formed JSON: a memory type that is not
one of the seven, and content the cited turns never said.

:mod:`memstream.domain.repair` fixes the syntax of an answer; these rules fix (or reject)
its meaning, one memory at a time, the same way every time.

The rules are in the docstrings of :func:`repair_type` and :func:`shares_content_word`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

from memstream.domain.events import MemoryType

__all__ = [
    "TYPE_WORDS",
    "FUNCTION_WORDS",
    "TypeRepair",
    "repair_type",
    "content_words",
    "shares_content_word",
]

TYPE_WORDS: dict[str, MemoryType] = {
    **dict.fromkeys(
        ["preference", "preferences", "like", "likes", "dislike", "dislikes", "identity", "trait",
         "traits", "personal", "profile", "relationship", "relationships", "hobby", "hobbies",
         "interest", "interests", "bio", "biography", "personality", "user"],
        MemoryType.persona,
    ),
    **dict.fromkeys(
        ["event", "events", "experience", "experiences", "episode", "plan", "plans", "happening",
         "activity", "activities", "history", "story", "trip", "memory"],
        MemoryType.episodic,
    ),
    **dict.fromkeys(
        ["rule", "rules", "directive", "guideline", "guidelines", "request", "command", "style",
         "behavior", "behaviour"],
        MemoryType.instruction,
    ),
    **dict.fromkeys(
        ["fact", "facts", "knowledge", "info", "information", "domain", "project", "system",
         "technical", "work"],
        MemoryType.work_fact,
    ),
    **dict.fromkeys(
        ["task", "tasks", "todo", "commitment", "deadline", "assignment", "action", "reminder"],
        MemoryType.work_task,
    ),
    **dict.fromkeys(
        ["method", "methods", "procedure", "process", "howto", "workflow", "recipe", "approach",
         "technique", "steps"],
        MemoryType.work_method,
    ),
    **dict.fromkeys(
        ["artifact", "artifacts", "document", "documents", "file", "files", "repository", "repo",
         "dataset", "doc", "docs", "link", "url"],
        MemoryType.work_artifact,
    ),
}
"""Words that name a memory type (rule 3 of the type repair)."""

FUNCTION_WORDS = frozenset(
    """
    a an the and or but nor so yet if then than that this these those there here what which
    who whom whose when where why how all any both each few more most other some such no not
    only own same too very can will just should would could might must shall may do does did
    doing done is am are was were be been being have has had having i me my mine myself we us
    our ours you your yours he him his she her hers it its they them their theirs itself
    himself herself themselves ourselves yourself of at by for with about against between into
    through during before after above below to from up down in out on off over under again
    further once also as until while because since per via user assistant said says say told
    tells mentioned mentions stated states noted notes asked asks
    """.split()
)
"""Words that carry no content of their own (the grounding check ignores them)."""

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*", re.UNICODE)
_SPLIT = re.compile(r"[|/,;:()\[\]]|\bor\b", re.IGNORECASE)
_INFLECTIONS = ("'s", "’s", "ing", "es", "ed", "ly", "s")


class TypeRepair:
    """The outcome of :func:`repair_type`: the type and the rule that chose it
    (``None`` when the model's type was valid as written)."""

    __slots__ = ("memory_type", "rule")

    def __init__(self, memory_type: MemoryType, rule: str | None) -> None:
        self.memory_type = memory_type
        self.rule = rule

    @property
    def repaired(self) -> bool:
        return self.rule is not None


def _parse(text: str) -> MemoryType | None:
    try:
        return MemoryType.parse(text)
    except ValueError:
        return None


def repair_type(raw: object) -> TypeRepair:
    """The memory type for what the model wrote.

    A type that :meth:`MemoryType.parse` reads is kept.
    Otherwise, in this order, the first rule that finds a type wins:

    1. *a listed type*: the text split at ``| / , ; : ( ) [ ]`` and ``or``; the first piece
       that parses (a small model copies the prompt's ``persona|episodic|...`` list);
    2. *a misspelling*: the closest of the seven names by :func:`difflib.get_close_matches`
       with a similarity of at least 0.8 (``epsiodic``, ``work_artefact``);
    3. *a word that names a type*: the text's words left to right, looked up in
       :data:`TYPE_WORDS` (``preference`` -> persona, ``event`` -> episodic, ``rule`` ->
       instruction, ``task`` -> work_task, ``procedure`` -> work_method, ``document`` ->
       work_artifact, ``fact`` -> work_fact...);
    4. else ``episodic`` (an event is the least committal reading of a statement), which
       is also the type of a memory whose type is missing or not text.
    """
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return TypeRepair(MemoryType.episodic, "missing")
    if not isinstance(raw, str):
        return TypeRepair(MemoryType.episodic, "not_text")
    direct = _parse(raw)
    if direct is not None:
        return TypeRepair(direct, None)
    for piece in _SPLIT.split(raw):
        found = _parse(piece) if piece and piece.strip() else None
        if found is not None:
            return TypeRepair(found, "listed")
    key = raw.strip().casefold().replace("-", "_").replace(" ", "_")
    close = difflib.get_close_matches(key, [t.value for t in MemoryType], n=1, cutoff=0.8)
    if close:
        return TypeRepair(MemoryType(close[0]), "spelling")
    for word in _WORD.findall(raw.casefold()):
        if word in TYPE_WORDS:
            return TypeRepair(TYPE_WORDS[word], "word")
    return TypeRepair(MemoryType.episodic, "default")


def _stem(word: str) -> str:
    for suffix in _INFLECTIONS:
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            word = word[: -len(suffix)]
            break
    # "love", "loves", "loved", "loving" all end as "lov"
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


def content_words(text: str, *, leave_out: Iterable[str] = ()) -> set[str]:
    """The stems of ``text``'s content words, without the words of ``leave_out``."""
    skip = {_stem(w) for name in leave_out for w in _WORD.findall(name.casefold())}
    out: set[str] = set()
    for word in _WORD.findall(text.casefold()):
        if word in FUNCTION_WORDS:
            continue
        stem = _stem(word)
        if stem not in skip:
            out.add(stem)
    return out


def shares_content_word(content: str, sources: Iterable[str], speakers: Iterable[str] = ()) -> bool:
    """Whether ``content`` has a content word in common with the ``sources`` texts
    (speaker names in ``content`` do not count).

    A memory must share at least one content word with the turns it cites; otherwise it is a
    hallucination suspect. Content words are the text's words (letters and digits, case-
    folded) that are not in :data:`FUNCTION_WORDS` and, in the memory, not the name of a
    speaker of the cited turns (a model names the speaker in every memory; the name alone
    proves nothing). Two words match when they are equal after dropping one English
    inflection (``-s``, ``-es``, ``-ed``, ``-ing``, ``-ly``, ``'s``) and then a final ``e``,
    so "loves" matches "loving" and "enjoying" matches "enjoy". The rule is lenient on
    purpose: it catches memories with nothing in common with their sources, not paraphrase.
    """
    mine = content_words(content, leave_out=speakers)
    if not mine:
        return False
    theirs: set[str] = set()
    for text in sources:
        theirs |= content_words(text)
    return not mine.isdisjoint(theirs)
