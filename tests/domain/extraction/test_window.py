"""Gating and numbering the turns of an extraction window, and rendering them."""

from __future__ import annotations

from memstream.domain.extraction.window import build_window, render_turns
from memstream.domain.gate.quality import GateRule
from tests.domain.extraction.helpers import SCOPE, turn, window


def test_window_numbers_background_then_new_and_gates_new_turns() -> None:
    w = window("I love green tea", "/clear", "???", "I live in Porto", background=("hi there", "!!!"))
    assert [t.alias for t in w.turns] == ["t1", "t2", "t3"]
    assert [t.message_id for t in w.background_turns] == ["b0"]
    assert [t.message_id for t in w.new_turns] == ["m0", "m3"]
    assert [(mid, v.rule) for mid, v in w.rejected] == [
        ("m1", GateRule.slash_command),
        ("m2", GateRule.question_marks),
    ]
    assert w.new_message_ids == ("m0", "m1", "m2", "m3")
    assert w.input_refs == ("b0", "m0", "m3")


def test_window_keeps_only_the_latest_background_turns() -> None:
    bg = [turn(f"b{i}", f"fact number {i}", minutes=-20 + i) for i in range(8)]
    w = build_window(SCOPE, "s1", [turn("m0", "new fact")], bg, max_background=3)
    assert [t.message_id for t in w.background_turns] == ["b5", "b6", "b7"]
    assert build_window(SCOPE, "s1", [turn("m0", "x y")], bg, max_background=0).background_turns == ()


def test_window_never_repeats_a_new_turn_as_background() -> None:
    t = turn("m0", "same turn")
    w = build_window(SCOPE, "s1", [t, t], [t], max_background=5)
    assert [x.message_id for x in w.turns] == ["m0"]
    assert w.new_message_ids == ("m0",)


def test_resolve_accepts_aliases_and_real_ids_only() -> None:
    w = window("a fact", "another fact")
    assert w.resolve("t1").message_id == "m0"  # type: ignore[union-attr]
    assert w.resolve(" [T2] ").message_id == "m1"  # type: ignore[union-attr]
    assert w.resolve(2).message_id == "m1"  # type: ignore[union-attr]
    assert w.resolve("2").message_id == "m1"  # type: ignore[union-attr]
    assert w.resolve("m1").message_id == "m1"  # type: ignore[union-attr]
    for invented in ("t9", "m7", "msg-1", None, True, 3.5, ["t1"]):
        assert w.resolve(invented) is None


def test_rendered_turns_carry_alias_time_role_and_speaker() -> None:
    w = window("I love\ngreen tea", background=("earlier",))
    background, new = render_turns(w)
    assert background == "[t1] 2024-05-08 15:20 UTC (Wednesday) | user Ana: earlier"
    assert new == "[t2] 2024-05-08 15:30 UTC (Wednesday) | user Ana: I love\n    green tea"
    empty = build_window(SCOPE, "s1", [turn("m0", "/clear")], [])
    assert render_turns(empty) == ("(none)", "(none)")
