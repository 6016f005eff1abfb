"""The injection gate over its corpus (``memstream.bench.gate_corpus``): every attack
is caught, on normalised text, and no benign text about instructions is refused.
``memstream bench gate`` prints the same figures (docs/benchmarks-history.md)."""

from __future__ import annotations

import pytest

from memstream.bench.gate_corpus import ATTACKS, BENIGN
from memstream.domain.gate.normalise import fold_for_rules
from memstream.domain.gate.quality import GateRule, gate, injection_reason


def test_the_corpus_is_big_enough() -> None:
    assert len(set(ATTACKS)) >= 50 and len(set(BENIGN)) >= 50


@pytest.mark.parametrize("text", ATTACKS)
def test_attacks_are_caught_in_turns_and_memories(text: str) -> None:
    assert injection_reason(text) is not None
    assert gate(text).rule == GateRule.prompt_injection


@pytest.mark.parametrize("text", BENIGN)
def test_benign_texts_pass(text: str) -> None:
    assert injection_reason(text) is None
    assert gate(text).passed


@pytest.mark.parametrize(
    ("disguised", "plain"),
    [
        ("Ignore\u200b all", "Ignore all"),
        ("\u202eabc\u202c", "abc"),
        ("Ignоre", "Ignore"),  # Cyrillic o
        ("\uff29\uff47\uff4e", "Ign"),
        ("i g n o r e  it", "ignore  it"),
        ("1gn0re", "ignore"),
        ("café", "cafe"),
        ("Bob paid $50", "Bob paid $50"),
    ],
)
def test_folding(disguised: str, plain: str) -> None:
    assert fold_for_rules(disguised) == plain
