"""Content normalisation and hashing: what folds (case, whitespace, Unicode compatibility
forms), what does not (punctuation, accents, word order), and that both are stable."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.domain.content import content_hash, normalize_content

HASH_FORMAT = re.compile(r"^sha256:[0-9a-f]{64}$")
WHITESPACE_RUNS = st.lists(
    st.sampled_from([" ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2003", "\u2028", "\x0b", "\x0c"]),
    min_size=1,
    max_size=3,
).map("".join)
# Words without any character that is, or NFKC-decomposes into, whitespace.
WORD_CHARS = st.characters(
    codec="utf-8",
    exclude_categories=("Zs", "Zl", "Zp", "Cc", "Cs"),
).filter(lambda c: not any(ch.isspace() for ch in unicodedata.normalize("NFKC", c)))
WORDS = st.lists(st.text(WORD_CHARS, min_size=1, max_size=6), min_size=1, max_size=6)
ASCII_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)


@settings(max_examples=300)
@given(st.text(max_size=60))
def test_normalisation_is_idempotent(text: str) -> None:
    once = normalize_content(text)
    assert normalize_content(once) == once


# Characters whose case folding leaves NFKC (e.g. "ǰ" folds to "j" + combining caron):
# the reason normalize_content runs NFKC a second time.
FOLDING_LEAVES_NFKC = ["\u01f0", "\u0390", "\u03b0", "\u1e96", "\u1f50", "\u1fb6", "\u1fd7"]


@pytest.mark.parametrize("char", FOLDING_LEAVES_NFKC)
def test_case_folding_that_leaves_nfkc_is_renormalised(char: str) -> None:
    assert not unicodedata.is_normalized("NFKC", unicodedata.normalize("NFKC", char).casefold())
    text = f"x {char.upper()} {char}"
    normal = normalize_content(text)
    assert unicodedata.is_normalized("NFKC", normal)
    assert normalize_content(normal) == normal


@settings(max_examples=300)
@given(st.text(max_size=60))
def test_normal_form_is_nfkc(text: str) -> None:
    assert unicodedata.is_normalized("NFKC", normalize_content(text))


@settings(max_examples=300)
@given(st.text(max_size=60))
def test_normal_form_has_no_edge_or_repeated_whitespace(text: str) -> None:
    normal = normalize_content(text)
    assert normal == normal.strip()
    assert "  " not in normal
    assert not any(ch.isspace() and ch != " " for ch in normal)


@settings(max_examples=300)
@given(st.text(max_size=60), st.sampled_from(["NFC", "NFD", "NFKC", "NFKD"]))
def test_hash_is_equal_for_every_unicode_normalisation_form(
    text: str, form: Literal["NFC", "NFD", "NFKC", "NFKD"]
) -> None:
    assert content_hash(unicodedata.normalize(form, text)) == content_hash(text)


@settings(max_examples=300)
@given(ASCII_TEXT, st.data())
def test_hash_is_equal_for_case_variants(text: str, data: st.DataObject) -> None:
    flips = data.draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
    variant = "".join(c.swapcase() if flip else c for c, flip in zip(text, flips))
    assert content_hash(variant) == content_hash(text)
    assert content_hash(text.upper()) == content_hash(text.lower())


@settings(max_examples=300)
@given(WORDS, st.data())
def test_hash_is_equal_for_whitespace_variants(words: list[str], data: st.DataObject) -> None:
    plain = " ".join(words)
    seps = data.draw(st.lists(WHITESPACE_RUNS, min_size=len(words) + 1, max_size=len(words) + 1))
    variant = seps[0] + "".join(w + s for w, s in zip(words, seps[1:]))
    assert content_hash(variant) == content_hash(plain)


@settings(max_examples=300)
@given(st.text(max_size=30), st.text(max_size=30))
def test_hash_equality_is_normal_form_equality(a: str, b: str) -> None:
    assert (content_hash(a) == content_hash(b)) == (normalize_content(a) == normalize_content(b))


@settings(max_examples=200)
@given(st.text(max_size=60))
def test_hash_is_sha256_of_the_utf8_normal_form(text: str) -> None:
    digest = content_hash(text)
    assert HASH_FORMAT.match(digest)
    assert digest == "sha256:" + hashlib.sha256(normalize_content(text).encode("utf-8", "surrogatepass")).hexdigest()


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Straße", "STRASSE"),  # casefold, not lower
        ("ΣΊΣΥΦΟΣ", "σίσυφος"),  # final sigma folds
        ("ﬁle", "file"),  # ligature (NFKC)
        ("Ｌｉｓｂｏｎ", "lisbon"),  # full-width letters (NFKC)
        ("café", "cafe\u0301"),  # composed vs combining accent
        ("no\u00a0break", "no break"),  # non-breaking space
        ("  Ada\tlives\n\nin   Lisbon  ", "ada lives in lisbon"),
        ("①", "1"),  # circled digit (NFKC)
    ],
)
def test_documented_foldings(a: str, b: str) -> None:
    assert normalize_content(a) == normalize_content(b)
    assert content_hash(a) == content_hash(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("I like cats.", "I like cats"),  # punctuation kept
        ("café", "cafe"),  # accents kept
        ("dog bites man", "man bites dog"),  # word order kept
        ("zero\u200bwidth", "zerowidth"),  # zero-width space is not whitespace
        ("it's", "it’s"),  # quote shapes kept
        ("a-b", "a–b"),  # dash shapes kept
    ],
)
def test_documented_non_foldings(a: str, b: str) -> None:
    assert content_hash(a) != content_hash(b)


def test_known_hash_value() -> None:
    expected = "sha256:" + hashlib.sha256(b"hello world").hexdigest()
    assert content_hash("  Hello \n WORLD ") == expected


def test_functions_are_total_on_lone_surrogates() -> None:
    assert HASH_FORMAT.match(content_hash("a\ud800b"))
    assert normalize_content("A\ud800") == "a\ud800"


@given(st.text(alphabet=st.characters(max_codepoint=127)))
def test_ascii_shortcut_equals_the_general_normal_form(text: str) -> None:
    # The general path, spelled out: NFKC, casefold, NFKC, whitespace runs collapsed.
    general = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    assert normalize_content(text) == re.sub(r"\s+", " ", general).strip()
