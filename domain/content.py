"""Content normalisation and the content hash that exact dedup keys on.

Two memories are "the same text" when their normal forms are equal. The normal form:

1. Unicode NFKC (compatibility forms fold: full-width letters, ligatures, non-breaking
   spaces become their plain equivalents),
2. case folded with ``str.casefold`` (stronger than ``lower``: "Straße" == "STRASSE"),
3. every run of whitespace (any Unicode space, tab, newline) collapsed to one space,
   leading and trailing whitespace removed.

Punctuation and word order are kept: "I like cats." and "I like cats" differ, on
purpose, because exact dedup must never merge two statements that could mean different
things. Near-duplicates are the candidate-recall + judgment step's job.

The hash is the hex SHA-256 of the UTF-8 bytes of the normal form, prefixed with the
algorithm (``sha256:``) so it can change without ambiguity. Both functions are total
(they accept any ``str``; unpaired surrogates, which the event model refuses anyway, are
hashed through ``surrogatepass`` rather than raising).

Not folded: zero-width characters (U+200B and friends are not whitespace), accents
(NFKC keeps "café" distinct from "cafe"), quotes and dashes of different shapes.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

__all__ = ["normalize_content", "content_hash"]

_WS = re.compile(r"\s+", re.UNICODE)


def normalize_content(text: str) -> str:
    """The normal form exact dedup compares: NFKC, case folded, whitespace collapsed.

    Idempotent: ``normalize_content(normalize_content(t)) == normalize_content(t)``.
    """
    if text.isascii():
        # The common case, several times cheaper: ASCII is already NFKC, its case
        # fold is ``lower``, and ``str.split`` splits on exactly the characters ``\s``
        # matches (``str.isspace``). Proven equal to the general path by a property test.
        return " ".join(text.lower().split())
    folded = unicodedata.normalize("NFKC", text).casefold()
    # casefold can produce sequences that are not NFKC-stable (e.g. some ligatures);
    # a second NFKC pass makes the function idempotent.
    folded = unicodedata.normalize("NFKC", folded)
    return _WS.sub(" ", folded).strip()


def content_hash(text: str) -> str:
    """``"sha256:" + hex(SHA-256(UTF-8(normalize_content(text))))``: equal exactly when
    the normal forms are equal."""
    data = normalize_content(text).encode("utf-8", "surrogatepass")
    return "sha256:" + hashlib.sha256(data).hexdigest()
