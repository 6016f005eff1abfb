"""The no-LLM extractor and its entity finder."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.domain.events import MAX_MEMORY_CHARS, EntityKind, MemoryType
from memstream.domain.extraction.drafts import MAX_ENTITIES
from memstream.domain.extraction.heuristic import _STOPWORDS, heuristic_drafts, heuristic_entities
from memstream.domain.extraction.window import build_window
from tests.domain.extraction.helpers import SCOPE, T0, turn


def test_heuristic_makes_one_episodic_memory_per_qualifying_turn() -> None:
    w = build_window(
        SCOPE,
        "s1",
        [
            turn("m0", "Yesterday I met Bob Smith in New York."),
            turn("m1", "/clear"),
            turn("m2", "ok thanks", speaker=None, role="assistant"),
        ],
        [],
    )
    first, second = heuristic_drafts(w)
    assert first.content == "Ana: Yesterday I met Bob Smith in New York."
    assert first.memory_type is MemoryType.episodic and first.priority == 50
    assert first.source_message_ids == ("m0",)
    assert first.timestamp == T0 and first.occurred_at == T0
    assert [(e.name, e.kind) for e in first.entities] == [
        ("Ana", EntityKind.person),
        ("Bob Smith", EntityKind.other),
        ("New York", EntityKind.other),
    ]
    assert second.content == "ok thanks" and second.entities == ()
    assert second.source_message_ids == ("m2",)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("I think The Beatles played Madison Square Garden.", ["Beatles", "Madison Square Garden"]),
        ("Bob's dog Max met NASA people on Monday in Paris.", ["Bob", "Max", "NASA", "Paris"]),
        ("Hello! Thanks, I'm fine. Today is great.", []),
        ("alice and bob", []),
        ("Ana. Ana! ANA", ["Ana"]),
        ("Ønskeøen and São Paulo", ["Ønskeøen", "São Paulo"]),
        ("A B C D E F", []),
        ("Jean Claude Van Damme Junior Senior", ["Jean Claude Van Damme", "Junior Senior"]),
    ],
)
def test_heuristic_entities(text: str, names: list[str]) -> None:
    assert [e.name for e in heuristic_entities(text, None)] == names


def test_heuristic_content_is_cut_to_the_memory_limit() -> None:
    w = build_window(SCOPE, "s1", [turn("m0", "word " * 3000)], [])
    (d,) = heuristic_drafts(w)
    assert len(d.content) <= MAX_MEMORY_CHARS and "content_cut" in d.notes


def _entities_word_by_word(text: str) -> list[str]:
    """The entity finder's rules applied to every word in turn: the reference that
    :func:`heuristic_entities`, which skips words starting ``a-z`` in its regex, must
    agree with."""
    stop = _STOPWORDS
    found: list[str] = []
    run: list[str] = []

    def flush() -> None:
        if run:
            name = " ".join(run)
            if name.casefold() not in {f.casefold() for f in found} and len(found) < MAX_ENTITIES:
                found.append(name[:200])
            run.clear()

    last_end = -1
    for match in re.finditer(r"[^\W\d_][\w'’.-]*", text):
        word = match.group(0)
        if not word[0].isupper():
            flush()
            last_end = match.end()
            continue
        bare = word.rstrip(".'’-")
        if bare.endswith(("'s", "’s")):
            bare = bare[:-2]
        is_name = len(bare) >= 2 and bare[0].isupper() and bare.casefold() not in stop
        gap = text[last_end : match.start()] if last_end >= 0 else ""
        if run and (not is_name or gap != " " or len(run) >= 4):
            flush()
        if is_name:
            run.append(bare)
            if word != bare:
                flush()
        last_end = match.end()
    flush()
    return found


_ENTITY_TEXT = st.lists(
    st.sampled_from(
        [*"aAbBzZéÉßΣσǅ²_09 .'’-,!\n\t", "New", "York", "The", "bob", "Bob's", "x.Y", "3A", " ", " "]
    ),
    max_size=30,
).map("".join)


@given(_ENTITY_TEXT)
@settings(max_examples=1500, deadline=None)
def test_heuristic_entities_agree_with_the_word_by_word_rules(text: str) -> None:
    assert [e.name for e in heuristic_entities(text, None)] == _entities_word_by_word(text)


@pytest.mark.parametrize(
    "text",
    [
        "x.Yolanda met 3Bob and _Carl in São Paulo; élan Émile Zola, ǅemal Ωmega ²Nd",
        "Bob and Carl", "Bob  Carl", "Bob carl Dan", "Bob-Carl Dan's Ed. Fay", "NASA NASA Nasa",
        "Jean Claude Van Damme Junior Senior", "a.B c-D e_F G'H", "’Twas Ana’s ’Bo",
    ],
)
def test_heuristic_entities_agree_on_tricky_words(text: str) -> None:
    assert [e.name for e in heuristic_entities(text, None)] == _entities_word_by_word(text)
