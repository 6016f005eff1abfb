"""JSON repair for the output of weak or hurried models.

Small and local models get the JSON *shape* right and the *syntax* wrong: a code fence
around the object, a trailing comma, a raw newline inside a string, a word where a
number belongs, or an answer cut off by the token limit. Rejecting the whole answer
for one of those throws away nine good memories for one bad comma, so the extractor
first repairs, then validates each memory on its own (see
:mod:`memstream.domain.extraction`: one bad scalar never sinks the batch).

:func:`repair_json` returns the parsed value and the names of the repairs it needed (the
list is in the docstring of :class:`Repaired`).

Anything that cannot be repaired raises :class:`JSONRepairError` and nothing else: the
function is fuzzed with hypothesis to hold that promise for arbitrary text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["JSONRepairError", "UnusableAnswer", "Repaired", "repair_json", "MAX_DEPTH", "MAX_INPUT_CHARS"]

MAX_DEPTH = 64
"""Deeper nesting is refused: no model answer we ask for is deeper than four levels."""

MAX_INPUT_CHARS = 2_000_000
"""Longer texts are refused before parsing (an answer this long is a runaway model)."""


class JSONRepairError(ValueError):
    """The text holds no JSON value that the documented repairs can recover."""


class UnusableAnswer(ValueError):
    """An answer that was read (repaired if need be) and holds nothing usable, in a way
    asking the same model the same question again will not change: callers fall back
    instead of retrying (:func:`memstream.llm.call_with_retry` does not retry it)."""


@dataclass(frozen=True)
class Repaired:
    """A parsed value and the repairs that were needed (empty for valid JSON).

    The repairs :func:`repair_json` applies to text that is not valid JSON, each named
    in ``repairs`` when it was needed:

    ``code_fence``        the value sits inside a Markdown fence (```json ... ```).
    ``surrounding_text``  prose before the value or after it is ignored.
    ``control_chars``     raw control characters inside a string: tab, newline and carriage
                          return are kept as characters, other C0 controls are dropped.
    ``trailing_comma``    a comma before ``]`` or ``}`` (or a doubled comma) is ignored.
    ``missing_comma``     two members or elements with only whitespace between them.
    ``single_quotes``     a string in single quotes.
    ``unquoted_key``      an object key without quotes (``{type: "x"}``).
    ``bare_word``         a value that is not JSON: ``True``/``False``/``None`` become the
                          JSON literals, anything else (``high``, ``50%``, ``~3``) becomes
                          the string it spells up to the next ``,``/``]``/``}``/newline, so
                          the caller's schema decides what to do with it (a priority falls
                          back to 50) instead of the whole answer failing.
    ``unescaped_quote``   a ``"`` inside a string that is not followed by a delimiter is
                          taken as a literal quote (``"he said "hi" twice"``).
    ``bad_escape``        an unknown backslash escape keeps the escaped character; a lone
                          surrogate escape becomes U+FFFD (it cannot be encoded as UTF-8).
    ``comments``          ``// line`` and ``/* block */`` comments are ignored.
    ``missing_value``     a member or element with nothing before its ``,``/``]``/``}``
                          reads as ``null``.
    ``truncated``         the text ends inside the value (the token limit cut it off): the
                          final element that was being written when the text ended is
                          dropped from its array (a half-written memory is never kept), and
                          every open container is closed. With no enclosing array, the
                          object being written drops its unfinished member. A truncated
                          value with nothing complete in it is an error, not ``{}``.

    The value is located at the first ``{`` or the first ``[`` (whichever parses to the
    longer span). Nesting deeper than :data:`MAX_DEPTH` is refused.
    """

    value: Any
    repairs: tuple[str, ...] = ()

    @property
    def was_repaired(self) -> bool:
        return bool(self.repairs)


_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_-]*[ \t]*\r?\n?(.*?)(?:```|\Z)", re.DOTALL)
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_WS = " \t\r\n\ufeff"
_VALUE_END = ",]}\n\r"
_LITERALS: dict[str, Any] = {
    "true": True,
    "false": False,
    "null": None,
    "True": True,
    "False": False,
    "None": None,
}
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class _Truncated(Exception):
    """The text ended inside a value."""


class _Syntax(Exception):
    """Something the repairs cannot interpret."""


def repair_json(text: str) -> Repaired:
    """Parse ``text`` as JSON, repairing what weak models get wrong.

    Valid JSON is returned exactly as :func:`json.loads` reads it (no repair applied);
    otherwise the repairs :class:`Repaired` lists are applied.

    Raises :class:`JSONRepairError` (only) when no value can be recovered.
    """
    if not isinstance(text, str):
        raise JSONRepairError(f"expected text, got {type(text).__name__}")
    if len(text) > MAX_INPUT_CHARS:
        raise JSONRepairError(f"text is {len(text)} characters; the limit is {MAX_INPUT_CHARS}")
    strict = _strict(text)
    if strict is not _MISSING:
        return Repaired(strict)

    repairs: list[str] = []
    body = text
    fence = _FENCE.search(text)
    if fence is not None and ("{" in fence.group(1) or "[" in fence.group(1)):
        body = fence.group(1)
        repairs.append("code_fence")
        strict = _strict(body)
        if strict is not _MISSING:
            if text[: fence.start()].strip() or text[fence.end():].strip():
                repairs.append("surrounding_text")
            return Repaired(strict, tuple(repairs))

    best: tuple[int, Any, list[str]] | None = None
    errors: list[str] = []
    for opener in ("{", "["):
        start = body.find(opener)
        if start < 0:
            continue
        parser = _Parser(body, start)
        try:
            value = parser.parse()
        except (_Syntax, _Truncated) as exc:
            errors.append(str(exc) or "truncated before any value")
            continue
        if not value and "truncated" in parser.repairs:
            errors.append("the text ends before any complete member or element")
            continue
        span = parser.pos - start
        if best is None or span > best[0]:
            extra = list(parser.repairs)
            if body[:start].strip() or body[parser.pos:].strip():
                extra.append("surrounding_text")
            best = (span, value, extra)
    if best is None:
        if not errors:
            raise JSONRepairError("no JSON object or array found")
        raise JSONRepairError(f"unrecoverable JSON: {errors[0]}")
    for name in best[2]:
        if name not in repairs:
            repairs.append(name)
    return Repaired(best[1], tuple(repairs))


_MISSING = object()


def _strict(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _MISSING


class _Parser:
    """A forgiving recursive-descent JSON reader (see the module docstring)."""

    def __init__(self, text: str, start: int) -> None:
        self.text = text
        self.n = len(text)
        self.pos = start
        self.depth = 0
        self.arrays_open = 0
        self.repairs: list[str] = []

    # -- helpers ---------------------------------------------------------------------
    def note(self, repair: str) -> None:
        if repair not in self.repairs:
            self.repairs.append(repair)

    def skip(self) -> None:
        """Skip whitespace and comments."""
        text, n = self.text, self.n
        while self.pos < n:
            ch = text[self.pos]
            if ch in _WS:
                self.pos += 1
            elif ch == "/" and self.pos + 1 < n and text[self.pos + 1] == "/":
                end = text.find("\n", self.pos)
                self.pos = n if end < 0 else end + 1
                self.note("comments")
            elif ch == "/" and self.pos + 1 < n and text[self.pos + 1] == "*":
                end = text.find("*/", self.pos + 2)
                self.pos = n if end < 0 else end + 2
                self.note("comments")
            else:
                return

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos] if self.pos < self.n else ""

    # -- grammar ---------------------------------------------------------------------
    def parse(self) -> Any:
        return self.value()

    def value(self) -> Any:
        ch = self.peek()
        if not ch:
            raise _Truncated()
        if ch == "{":
            return self.obj()
        if ch == "[":
            return self.arr()
        if ch in "\"'":
            return self.string(ch)
        return self.scalar()

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise JSONRepairError(f"nesting deeper than {MAX_DEPTH} levels")

    def obj(self) -> dict[str, Any]:
        self.enter()
        self.pos += 1  # "{"
        out: dict[str, Any] = {}
        catches = self.arrays_open == 0
        expect_member = True
        while True:
            ch = self.peek()
            if not ch:
                self.note("truncated")
                break
            if ch == "}":
                self.pos += 1
                break
            if ch == ",":
                self.pos += 1
                if expect_member:
                    self.note("trailing_comma")
                expect_member = True
                nxt = self.peek()
                if nxt == "}":
                    self.note("trailing_comma")
                continue
            if ch == "]":
                raise _Syntax(f"']' closes an object at offset {self.pos}")
            if not expect_member:
                self.note("missing_comma")
            try:
                key = self.key()
                if self.peek() != ":":
                    if not self.peek():
                        raise _Truncated()
                    raise _Syntax(f"expected ':' after key {key[:40]!r} at offset {self.pos}")
                self.pos += 1
                value = self.value()
            except _Truncated:
                if not catches:
                    raise
                self.note("truncated")
                self.pos = self.n
                break
            out[key] = value
            expect_member = False
        self.depth -= 1
        return out

    def key(self) -> str:
        ch = self.peek()
        if ch in "\"'":
            return self.string(ch, in_key=True)
        start = self.pos
        text, n = self.text, self.n
        while self.pos < n and text[self.pos] not in ":,{}[]\n":
            self.pos += 1
        if self.pos >= n:
            raise _Truncated()
        key = text[start:self.pos].strip()
        if not key:
            raise _Syntax(f"empty key at offset {start}")
        self.note("unquoted_key")
        return key

    def arr(self) -> list[Any]:
        self.enter()
        self.pos += 1  # "["
        self.arrays_open += 1
        out: list[Any] = []
        expect_element = True
        try:
            while True:
                ch = self.peek()
                if not ch:
                    self.note("truncated")
                    break
                if ch == "]":
                    self.pos += 1
                    break
                if ch == ",":
                    self.pos += 1
                    if expect_element:
                        self.note("trailing_comma")
                    expect_element = True
                    if self.peek() == "]":
                        self.note("trailing_comma")
                    continue
                if ch == "}":
                    raise _Syntax(f"'}}' closes an array at offset {self.pos}")
                if not expect_element:
                    self.note("missing_comma")
                try:
                    item = self.value()
                except _Truncated:
                    self.note("truncated")
                    self.pos = self.n
                    break
                out.append(item)
                expect_element = False
        finally:
            self.arrays_open -= 1
        self.depth -= 1
        return out

    def string(self, quote: str, in_key: bool = False) -> str:
        if quote == "'":
            self.note("single_quotes")
        text, n = self.text, self.n
        self.pos += 1
        chunks: list[str] = []
        while True:
            if self.pos >= n:
                raise _Truncated()
            ch = text[self.pos]
            if ch == quote:
                if self._closes_string(in_key):
                    self.pos += 1
                    return "".join(chunks)
                self.note("unescaped_quote")
                chunks.append(ch)
                self.pos += 1
                continue
            if ch == "\\":
                if self.pos + 1 >= n:
                    raise _Truncated()
                esc = text[self.pos + 1]
                if esc in _ESCAPES:
                    chunks.append(_ESCAPES[esc])
                    self.pos += 2
                    continue
                if esc == "'":
                    chunks.append("'")
                    self.pos += 2
                    continue
                if esc == "u":
                    hexpart = text[self.pos + 2:self.pos + 6]
                    if len(hexpart) < 4 and self.pos + 6 > n:
                        raise _Truncated()
                    if _HEX4.fullmatch(hexpart):
                        code = int(hexpart, 16)
                        self.pos += 6
                        if 0xD800 <= code <= 0xDBFF:
                            low = _HEX4.fullmatch(text[self.pos + 2:self.pos + 6])
                            if text[self.pos:self.pos + 2] == "\\u" and low:
                                low_code = int(low.group(0), 16)
                                if 0xDC00 <= low_code <= 0xDFFF:
                                    code = 0x10000 + ((code - 0xD800) << 10) + (low_code - 0xDC00)
                                    self.pos += 6
                        if 0xD800 <= code <= 0xDFFF:
                            self.note("bad_escape")
                            code = 0xFFFD  # a lone surrogate cannot be encoded as UTF-8
                        chunks.append(chr(code))
                        continue
                self.note("bad_escape")
                chunks.append(esc)
                self.pos += 2
                continue
            if ord(ch) < 0x20:
                self.note("control_chars")
                if ch in "\t\n\r":
                    chunks.append(ch)
                self.pos += 1
                continue
            chunks.append(ch)
            self.pos += 1

    def _closes_string(self, in_key: bool) -> bool:
        """A quote closes the string when what follows it is a delimiter (or the end)."""
        text, n = self.text, self.n
        i = self.pos + 1
        while i < n and text[i] in " \t":
            i += 1
        if i >= n:
            return True
        follow = text[i]
        if in_key:
            return follow in ":\r\n"
        return follow in ",]}:\"'\r\n/"

    def scalar(self) -> Any:
        text, n = self.text, self.n
        start = self.pos
        match = _NUMBER.match(text, start)
        if match:
            end = match.end()
            rest = end
            while rest < n and text[rest] in " \t":
                rest += 1
            if rest >= n:
                raise _Truncated()  # a number cut at the end may have lost digits
            if (
                text[rest] in _VALUE_END
                or text[rest : rest + 2] in ("//", "/*")
                or (rest > end and (text[rest] in "\"'{[-" or text[rest].isdigit()))
            ):
                self.pos = end
                literal = match.group(0)
                if any(c in literal for c in ".eE"):
                    return float(literal)
                return int(literal)
        end = start
        while end < n and text[end] not in _VALUE_END:
            if end > start and text[end : end + 2] in ("//", "/*"):
                break
            if end > start and text[end] in "\"'" and text[end - 1] in " \t":
                break  # `high "next": 1`: a missing comma, not part of the word
            end += 1
        if end >= n:
            raise _Truncated()
        word = text[start:end].strip()
        self.pos = end
        if not word:
            self.note("missing_value")
            return None
        if word in _LITERALS:
            if word not in ("true", "false", "null"):
                self.note("bare_word")
            return _LITERALS[word]
        self.note("bare_word")
        return word
