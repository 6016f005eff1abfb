"""Text as the injection rules read it: the disguises taken off.

An attacker who knows the quality gate's phrases writes them so that a regular
expression over the raw text misses them, while a model reading the text still
understands: a zero-width space inside a word ("Ignore\u200b all previous
instructions"), bidi controls, full-width or mathematical letters, look-alike letters
from other scripts (Cyrillic "о" for Latin "o"), letters spaced out or dotted
("i g n o r e", "I.G.N.O.R.E"), digits for letters ("1gn0re"). :func:`fold_for_rules`
undoes these, in this order:

1. Unicode NFKC (full-width, mathematical and other compatibility forms become plain
   letters; ligatures split);
2. format characters removed (category Cf: zero-width space and joiners, BOM, soft
   hyphen, bidi embeddings, overrides and isolates), and combining marks left by
   decomposed look-alikes;
3. common confusables folded to Latin: the Cyrillic and Greek letters that look like
   Latin ones (:data:`CONFUSABLES`, a small fixed table after Unicode's
   confusables list);
4. runs of single letters joined across one separator ("i g n o r e", "i-g-n-o-r-e");
5. digits and symbols inside words read as the letters they imitate ("1gn0re",
   "pr3vious", "@ll"), only when the word also holds letters.

The result is for matching only, never stored or shown: a memory is kept exactly as
written (its content hash is its producer's). Pure and deterministic.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["fold_for_rules", "fold_characters", "CONFUSABLES"]

CONFUSABLES: dict[str, str] = {
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p",
    "с": "c", "т": "t", "у": "y", "х": "x", "ѕ": "s", "і": "i", "ї": "i", "ј": "j", "ԁ": "d",
    "ԛ": "q", "ԝ": "w", "һ": "h", "ɡ": "g", "ӏ": "l",
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C",
    "Т": "T", "У": "Y", "Х": "X", "Ѕ": "S", "І": "I", "Ј": "J",
    # Greek
    "α": "a", "ε": "e", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "τ": "t", "υ": "u",
    "χ": "x", "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M",
    "Ν": "N", "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
    # Latin look-alikes outside ASCII that NFKC keeps
    "ı": "i", "ȷ": "j", "ł": "l", "ø": "o", "ß": "ss", "ſ": "s",
}
"""Look-alike letters folded to the Latin letter they imitate (a fixed table: the
letters of Cyrillic and Greek that Unicode's confusables list maps to one Latin
letter, and a few Latin ones NFKC leaves alone)."""

_FOLD = str.maketrans(CONFUSABLES)
_SPACED = re.compile(r"(?<![^\W\d_])(?:[^\W\d_][ .\-_*·•/\\|]){2,}[^\W\d_](?![^\W\d_])")
# The tail of every spaced-out run (three letters at least): its second letter between
# two separators, its third not followed by a letter. A lone letter between separators
# ("I have a dog") is in most texts; this tail is in few.
_SPACED_HINT = re.compile(r"[ .\-_*·•/\\|][^\W\d_][ .\-_*·•/\\|][^\W\d_](?![^\W\d_])")
_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s"})
_LEET_HINT = re.compile(r"[013457@$]")
# A run of word characters that holds a letter and a digit or symbol. Only a run's first
# character is tried: a suffix of a run holds no more than the run (and trying every
# position made this the costliest step of a memory write).
_LEET_WORD = re.compile(r"(?<![\w@$])(?=[\w@$]*[^\W\d_])(?=[\w@$]*[013457@$])[\w@$]+")


def _unspaced(match: re.Match[str]) -> str:
    return match.group(0)[::2]


def _unleet(match: re.Match[str]) -> str:
    return match.group(0).translate(_LEET)


def fold_for_rules(text: str) -> str:
    """``text`` with its disguises taken off (see the module docstring)."""
    folded = fold_characters(text)
    # Each rewrite only where it can apply: one quick search finds the texts (most) where
    # neither can, and scanning them is most of what a memory write costs here.
    if _SPACED_HINT.search(folded):
        folded = _SPACED.sub(_unspaced, folded)
    return _LEET_WORD.sub(_unleet, folded) if _LEET_HINT.search(folded) else folded


def fold_characters(text: str) -> str:
    """Steps 1-3 of the module docstring: compatibility forms, format characters,
    combining marks and confusables."""
    if text.isascii():
        return text
    folded = unicodedata.normalize("NFKC", text)
    folded = "".join(
        ch for ch in unicodedata.normalize("NFD", folded.translate(_FOLD))
        if unicodedata.category(ch) not in ("Cf", "Mn")
    )
    return unicodedata.normalize("NFC", folded).translate(_FOLD)
