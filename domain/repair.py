"""JSON repair for the output of weak or hurried models.

Small and local models get the JSON *shape* right and the *syntax* wrong: a code fence
around the object, a trailing comma, a raw newline inside a string, a word where a
number belongs, or an answer cut off by the token limit. Rejecting the whole answer
for one of those throws away nine good memories for one bad comma, so the extractor
first repairs, then validates each memory on its own (see
:mod:`memstream.domain.extraction`: one bad scalar never sinks the batch).

The syntax is mended by the ``json_repair`` library (fences, prose around the value,
quotes, commas, comments, Python literals, unquoted keys and words, unclosed
containers). memstream adds only the rules it does not have, each named in
:attr:`Repaired.repairs` when applied (the tests in ``tests/domain/test_repair.py``
show the library's answer each rule corrects):

``truncated``       the text ends inside the value (the token limit cut it off): the
                    element being written is dropped from the innermost open array
                    (a half-written memory, a cut id, a number that may have lost digits
                    is never kept); with no array open, the object being written drops
                    its unfinished member. A truncated value with nothing complete in
                    it is an error, not ``{}``. The library keeps the fragment.
``several_values``  the text holds more than one value (``see [note]: {...}``): the
                    longest is taken; the library returns a list of them all.
``control_chars``   raw C0 control characters other than tab, newline and carriage
                    return are dropped (the library keeps them inside strings).
``bad_escape``      a lone surrogate escape becomes U+FFFD and a pair is joined (the
                    library leaves them apart, and such a string cannot be encoded as
                    UTF-8 for the log).

Any other repair is named ``json_repair``. Valid JSON is returned as :func:`json.loads`
reads it, with no repair named. Anything that cannot be repaired into an object or an
array raises :class:`JSONRepairError` and nothing else: the function is fuzzed with
hypothesis to hold that promise for arbitrary text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import json_repair

__all__ = ["JSONRepairError", "UnusableAnswer", "Repaired", "repair_json", "MAX_DEPTH", "MAX_INPUT_CHARS"]

MAX_DEPTH = 64
"""Deeper nesting is refused: no model answer we ask for is deeper than four levels."""

MAX_INPUT_CHARS = 2_000_000
"""Longer texts are refused before parsing (an answer this long is a runaway model)."""

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_MORE_VALUES = ("checking if there's more json elements", "There were no more elements")
"""How the library's log says it looked for a value after the first, and found none
(``tests/domain/test_repair.py`` fails if a release words it otherwise)."""


class JSONRepairError(ValueError):
    """The text holds no JSON value that the documented repairs can recover."""


class UnusableAnswer(ValueError):
    """An answer that was read (repaired if need be) and holds nothing usable, in a way
    asking the same model the same question again will not change: callers fall back
    instead of retrying (:func:`memstream.llm.client.call_with_retry` does not retry it)."""


@dataclass(frozen=True)
class Repaired:
    """A parsed value and the repairs that were needed (empty for valid JSON; the
    names are listed in the module docstring)."""

    value: Any
    repairs: tuple[str, ...] = ()

    @property
    def was_repaired(self) -> bool:
        return bool(self.repairs)


def repair_json(text: str) -> Repaired:
    """Parse ``text`` as JSON, repairing what weak models get wrong.

    Raises :class:`JSONRepairError` (only) when no object or array can be recovered.
    """
    if not isinstance(text, str):
        raise JSONRepairError(f"expected text, got {type(text).__name__}")
    if len(text) > MAX_INPUT_CHARS:
        raise JSONRepairError(f"text is {len(text)} characters; the limit is {MAX_INPUT_CHARS}")
    try:
        return Repaired(json.loads(text))
    except (ValueError, RecursionError):
        pass
    repairs = ["json_repair"]
    if _CONTROL.search(text):
        text = _CONTROL.sub("", text)
        repairs.append("control_chars")
    cut = _finished_part(text)
    if cut is not None:
        text = cut
        repairs.append("truncated")
    try:
        value, log = json_repair.repair_json(text, return_objects=True, skip_json_loads=True, logging=True)
    except Exception as exc:  # noqa: BLE001 - whatever the library trips on, the caller gets one error
        raise JSONRepairError(f"unrecoverable JSON: {type(exc).__name__}") from None
    said = " ".join(entry["text"] for entry in log)
    if isinstance(value, list) and _MORE_VALUES[0] in said and _MORE_VALUES[1] not in said:
        value = max(value, key=lambda v: len(json.dumps(v)))
        repairs.append("several_values")
    if not isinstance(value, (dict, list)):
        raise JSONRepairError("no JSON object or array found")
    if not value and cut is not None:
        raise JSONRepairError("the text ends before any complete member or element")
    if _SURROGATE.search(json.dumps(value, ensure_ascii=False)):
        value = _joined(value)
        repairs.append("bad_escape")
    return Repaired(value, tuple(repairs))


def _finished_part(text: str) -> str | None:
    """The text without the element or member the token limit cut off (the
    ``truncated`` rule), or ``None`` when the value starting at the first ``{`` or
    ``[`` is closed. Refuses nesting deeper than :data:`MAX_DEPTH`."""
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if not starts:
        return None
    # per open container: its bracket, where its current element starts, and (objects)
    # whether that member has its ':' yet
    stack: list[list[Any]] = []
    in_string = escaped = False
    for i in range(min(starts), len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append([ch, i + 1, False])
            if len(stack) > MAX_DEPTH:
                raise JSONRepairError(f"nesting deeper than {MAX_DEPTH} levels")
        elif ch in "}]":
            stack.pop()
            if not stack:
                return None  # the value is closed; what follows is prose
        elif ch == "," and stack:
            stack[-1][1:] = [i, False]
        elif ch == ":" and stack:
            stack[-1][2] = True
    if not stack:
        return None
    tail = text.rstrip()
    closed = not in_string and tail[-1:] in ('"', "}", "]")  # a finished string or container
    arrays = [n for n, frame in enumerate(stack) if frame[0] == "["]
    if arrays:
        frame = stack[arrays[-1]]
        finished = closed and arrays[-1] == len(stack) - 1 and tail[-1] != "["
    else:
        frame = stack[-1]
        finished = closed and frame[2]
    return text if finished else text[: frame[1]]


def _joined(value: Any) -> Any:
    """``value`` with every string's surrogate pairs joined and lone ones U+FFFD."""
    if isinstance(value, str):
        if not _SURROGATE.search(value):
            return value
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_joined(v) for v in value]
    if isinstance(value, dict):
        return {_joined(k): _joined(v) for k, v in value.items()}
    return value
