"""JSON repair: each documented repair, the truncation rule, and fuzzing for its promises
(valid JSON comes back unchanged; anything else yields a value or JSONRepairError only)."""

from __future__ import annotations

import json
from typing import Any

import json_repair
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.domain.repair import MAX_DEPTH, JSONRepairError, repair_json


def fix(text: str) -> tuple[Any, tuple[str, ...]]:
    r = repair_json(text)
    return r.value, r.repairs


def test_valid_json_needs_no_repair() -> None:
    value, repairs = fix('{"a": [1, 2.5, "x", null, true]}')
    assert value == {"a": [1, 2.5, "x", None, True]}
    assert repairs == ()
    assert not repair_json("[]").was_repaired


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('Here you go:\n```\n{"a": 1}\n```\nAnything else?', {"a": 1}),
        ('```json\n{"a": [1, 2,],}\n', {"a": [1, 2]}),
        ('Sure! {"a": 1} Hope this helps.', {"a": 1}),
        ('{"a": [1, 2, ], "b": 3, }', {"a": [1, 2], "b": 3}),
        ("[1,, 2]", [1, 2]),
        ('{"a": 1 "b": "x"\n "c": [1 2]}', {"a": 1, "b": "x", "c": [1, 2]}),
        ('{"priority": high, "ok": true}', {"priority": "high", "ok": True}),
        ("{'a': True, 'b': None, 'c': False}", {"a": True, "b": None, "c": False}),
        ("{type: 'persona', 'it\\'s': 1}", {"type": "persona", "it's": 1}),
        ('{"content": "She said "call me Jo" twice", "priority": 60}', {"content": 'She said "call me Jo" twice', "priority": 60}),
        ('{"a": 1, // the first\n /* block */ "b": 2}', {"a": 1, "b": 2}),
        ('{"content": "line one\nline\ttwo"}', {"content": "line one\nline\ttwo"}),
    ],
)
def test_the_librarys_repairs(text: str, expected: Any) -> None:
    assert fix(text) == (expected, ("json_repair",))


def test_raw_control_characters_are_dropped() -> None:
    # the library keeps them inside strings, and an event refuses them
    text = '{"content": "tea\x01\x7f end",}'
    assert json_repair.loads(text) == {"content": "tea\x01\x7f end"}
    assert fix(text) == ({"content": "tea\x7f end"}, ("json_repair", "control_chars"))


def test_surrogate_escapes_are_joined_or_replaced() -> None:
    # the library leaves a pair apart and a lone one as it is: neither encodes as UTF-8
    text = '{"a": "\\ud83d\\ude00 \\ud800 done",}'
    assert json_repair.loads(text) == {"a": "\ud83d\ude00 \ud800 done"}
    assert fix(text) == ({"a": "\U0001F600 \ufffd done"}, ("json_repair", "bad_escape"))
    json.dumps(fix(text)[0], ensure_ascii=False).encode()


def test_truncated_final_element_is_dropped() -> None:
    # the library keeps the half-written memory ("Ana dislikes cof"); a cut answer must not
    text = (
        '{"scenes": [{"title": "Food", "message_ids": ["t1"], "memories": ['
        '{"content": "Ana likes tea", "priority": 70}, '
        '{"content": "Ana dislikes cof'
    )
    value, repairs = fix(text)
    assert value == {
        "scenes": [
            {"title": "Food", "message_ids": ["t1"], "memories": [{"content": "Ana likes tea", "priority": 70}]}
        ]
    }
    assert "truncated" in repairs


def test_truncated_inside_a_nested_array_drops_only_the_innermost_element() -> None:
    value, _ = fix('{"scenes": [{"title": "x", "message_ids": ["t1", "t')
    assert value == {"scenes": [{"title": "x", "message_ids": ["t1"]}]}


def test_a_number_cut_at_the_end_is_not_trusted() -> None:
    # "priority": 5 might have been 50 or 55; the library keeps it
    assert json_repair.loads('[{"priority": 70}, {"priority": 5') == [{"priority": 70}, {"priority": 5}]
    assert fix('[{"priority": 70}, {"priority": 5')[0] == [{"priority": 70}]
    assert fix('{"a": 1, "b": 12')[0] == {"a": 1}


def test_truncated_after_a_complete_value_closes_everything() -> None:
    assert fix('{"a": [1, 2], "b": "done"')[0] == {"a": [1, 2], "b": "done"}


def test_picks_the_longest_value() -> None:
    # the library answers a list of every value it found
    assert json_repair.loads('See [note] below: {"a": [1, 2, 3]}') == [["note"], {"a": [1, 2, 3]}]
    assert fix('See [note] below: {"a": [1, 2, 3]}') == ({"a": [1, 2, 3]}, ("json_repair", "several_values"))
    assert fix('result: [1, 2, {"a": 1}]')[0] == [1, 2, {"a": 1}]


@pytest.mark.parametrize("text", ["", "no json here", "42 is the answer", "}{", '{"a": 1', "{"])
def test_unrecoverable_text_raises_the_documented_error(text: str) -> None:
    with pytest.raises(JSONRepairError):
        repair_json(text)


def test_nesting_limit() -> None:
    with pytest.raises(JSONRepairError, match="nesting"):
        repair_json("[" * (MAX_DEPTH + 5) + "1")
    with pytest.raises(JSONRepairError):
        repair_json("[" * 100_000)
    assert repair_json("[" * 10 + "]" * 10).value == [[[[[[[[[[]]]]]]]]]]


def test_not_text_raises_the_documented_error() -> None:
    with pytest.raises(JSONRepairError):
        repair_json(b"{}")  # type: ignore[arg-type]


# --- fuzzing ---------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=12,
)

_JSONISH = st.sampled_from(list('{}[]",:\'\\/*` \n\ttrufalsenul0123456789.-+eEabcxyzTFN#`'))


@settings(max_examples=200)
@given(json_values, st.sampled_from([None, 0, 2]))
def test_valid_json_round_trips_unchanged(value: Any, indent: int | None) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    result = repair_json(text)
    assert result.value == value
    assert result.repairs == ()


@settings(max_examples=100)
@given(json_values.filter(lambda v: isinstance(v, (dict, list))))
def test_fenced_valid_json_round_trips(value: Any) -> None:
    assert repair_json(f"```json\n{json.dumps(value)}\n```").value == value


@settings(max_examples=1500)
@given(st.text(alphabet=_JSONISH, max_size=80) | st.text(max_size=80))
def test_never_raises_anything_but_its_error(text: str) -> None:
    try:
        result = repair_json(text)
    except JSONRepairError:
        return
    json.dumps(result.value)  # whatever comes back is plain JSON data


@settings(max_examples=200)
@given(json_values.filter(lambda v: isinstance(v, (dict, list))), st.data())
def test_any_prefix_of_valid_json_is_handled(value: Any, data: st.DataObject) -> None:
    text = json.dumps(value)
    cut = data.draw(st.integers(min_value=0, max_value=len(text)))
    try:
        result = repair_json(text[:cut])
    except JSONRepairError:
        return
    assert isinstance(result.value, (dict, list))
