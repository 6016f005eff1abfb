"""The pure extraction core: windows, parsing the model's answer, times, dedup, the
judgment plan and its answer, the events, and the no-LLM heuristic."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memstream.domain.extraction as extraction_module
from memstream.domain.content import content_hash
from memstream.domain.events import (
    MAX_MEMORY_CHARS,
    EmbeddingPayload,
    EntityKind,
    LinkRelation,
    MemoryAdded,
    MemoryLinked,
    MemoryType,
    MessageObserved,
    Scope,
    parse_event,
)
from memstream.domain.extraction import (
    Action,
    Candidate,
    Decision,
    EmptyExtraction,
    ExtractionFormatError,
    JudgmentFormatError,
    MemoryDraft,
    StageReport,
    build_events,
    build_window,
    dedupe_batch,
    heuristic_drafts,
    heuristic_entities,
    link_id_for,
    memory_id_for,
    parse_extraction,
    parse_judgment,
    plan_judgment,
    record_items,
    render_judgment,
    render_turns,
    resolve_time,
    split_known,
    store_all,
)
from memstream.domain.quality import GateRule

SCOPE = Scope(team_id="acme", user_id="ana", agent_id="bot")
T0 = datetime(2024, 5, 8, 15, 30, tzinfo=timezone.utc)  # a Wednesday


def turn(mid: str, content: str, *, minutes: int = 0, speaker: str | None = "Ana", role: str = "user") -> MessageObserved:
    return MessageObserved(
        scope=SCOPE,
        session_id="s1",
        message_id=mid,
        role=role,  # type: ignore[arg-type]
        speaker=speaker,
        content=content,
        occurred_at=T0 + timedelta(minutes=minutes),
    )


def window(*contents: str, background: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    bg = [turn(f"b{i}", c, minutes=-10 + i) for i, c in enumerate(background)]
    new = [turn(f"m{i}", c, minutes=i) for i, c in enumerate(contents)]
    return build_window(SCOPE, "s1", new, bg, max_background=5)


def memory(content: str, sources: list[Any], **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "content": content,
        "type": "persona",
        "priority": 70,
        "source_ids": sources,
        "timestamp": None,
        "timestamp_start": None,
        "timestamp_end": None,
        "entities": [],
    }
    out.update(extra)
    return out


def answer(*memories: dict[str, Any], ids: list[str] | None = None, title: str = "Food") -> dict[str, Any]:
    return {"scenes": [{"title": title, "message_ids": ids or [], "memories": list(memories)}]}


# --- windows ----------------------------------------------------------------------------


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


# --- parsing the extraction answer ---------------------------------------------------------


def test_a_well_formed_answer_becomes_drafts() -> None:
    w = window("I love green tea", "I moved to Porto yesterday")
    parsed = parse_extraction(
        answer(
            memory("Ana loves green tea.", ["t1"], entities=[{"name": "green tea", "kind": "product"}]),
            memory(
                "Ana moved to Porto.",
                ["t2"],
                type="episodic",
                priority=80,
                timestamp="2024-05-07",
                entities=[{"name": "Porto", "kind": "place"}, {"name": "Ana", "kind": "person"}],
            ),
            ids=["t1", "t2"],
        ),
        w,
        max_memories=10,
    )
    assert parsed.issues == ()
    assert parsed.scenes == 1
    tea, porto = parsed.drafts
    assert tea.content == "Ana loves green tea."
    assert tea.memory_type is MemoryType.persona and tea.priority == 70
    assert tea.source_message_ids == ("m0",)
    assert tea.scene == "Food"
    assert tea.occurred_at == T0
    assert porto.memory_type is MemoryType.episodic and porto.priority == 80
    assert porto.timestamp == datetime(2024, 5, 7, tzinfo=timezone.utc)
    assert [(e.name, e.kind) for e in porto.entities] == [("Porto", EntityKind.place), ("Ana", EntityKind.person)]
    assert porto.notes == ()


def test_invented_source_ids_are_dropped_never_kept() -> None:
    w = window("I love green tea", "I hate rain")
    parsed = parse_extraction(
        answer(memory("Ana loves green tea.", ["t1", "t7", "msg-42"]), memory("Ana hates snow.", ["t9"])),
        w,
        max_memories=10,
    )
    tea, snow = parsed.drafts
    assert tea.source_message_ids == ("m0",)
    assert any(n.startswith("dropped_source_ids:t7,msg-42") for n in tea.notes)
    # no valid source left: the window's turns are its evidence, flagged
    assert snow.source_message_ids == ("m0", "m1")
    assert "sources_from_window" in snow.notes and "dropped_source_ids:t9" in snow.notes
    kinds = [i.kind for i in parsed.issues]
    assert kinds == ["invented_source_ids", "invented_source_ids"]
    assert parsed.invented_ids_dropped == 3


def test_sources_fall_back_to_the_scene_turns_when_none_are_cited() -> None:
    w = window("I love green tea")
    parsed = parse_extraction(answer(memory("Ana loves green tea.", []), ids=["t1"]), w, max_memories=10)
    assert parsed.drafts[0].source_message_ids == ("m0",)
    assert "sources_from_scene" in parsed.drafts[0].notes


def test_a_memory_citing_only_background_is_dropped() -> None:
    w = window("sounds good", background=("I love green tea",))
    with pytest.raises(EmptyExtraction) as raised:  # no memory left, and not "nothing to remember"
        parse_extraction(answer(memory("Ana loves green tea.", ["t1"])), w, max_memories=10)
    assert raised.value.parse.drafts == ()
    assert [i.kind for i in raised.value.parse.issues] == ["background_only"]


def test_background_may_support_a_memory_from_a_new_turn() -> None:
    w = window("yes, that one", background=("Do you want the blue car?",))
    parsed = parse_extraction(answer(memory("Ana wants the blue car.", ["t1", "t2"])), w, max_memories=10)
    assert parsed.drafts[0].source_message_ids == ("b0", "m0")


@pytest.mark.parametrize(
    ("raw", "expected", "fell_back"),
    [
        (80, 80, False),
        (79.6, 80, False),
        ("65", 65, False),
        ("90/100", 90, False),
        ("40%", 40, False),
        (250, 100, False),
        (-5, 0, False),
        ("high", 50, True),
        (True, 50, True),
        ([1], 50, True),
        ({"v": 1}, 50, True),
        (float("nan"), 50, True),
    ],
)
def test_one_bad_priority_falls_back_to_50(raw: Any, expected: int, fell_back: bool) -> None:
    w = window("I love green tea")
    (draft,) = parse_extraction(answer(memory("Ana loves tea.", ["t1"], priority=raw)), w, max_memories=10).drafts
    assert draft.priority == expected
    assert ("priority_fallback" in draft.notes) is fell_back


def test_wrong_types_degrade_per_field_and_never_sink_the_batch() -> None:
    w = window("I love green tea", "I work at Initech", "I was born in 1990")
    parsed = parse_extraction(
        answer(
            memory("Ana loves green tea.", ["t1"], type="preference"),  # legacy name
            memory("Ana works at Initech.", ["t2"], type="job-ish", timestamp="someday soon"),
            memory(1990, ["t3"], type=7, entities="Initech", timestamp_start=[1]),
            {"content": None, "source_ids": ["t1"]},
            "Ana is friendly.",
            42,
            memory("Ana was born in 1990.", "t3", timestamp=1990),
        ),
        w,
        max_memories=10,
    )
    by_content = {d.content: d for d in parsed.drafts}
    assert by_content["Ana loves green tea."].memory_type is MemoryType.persona
    job = by_content["Ana works at Initech."]
    assert job.memory_type is MemoryType.episodic
    assert "type_repaired:default:job-ish->episodic" in job.notes and "bad_timestamp" in job.notes
    numeric = by_content["1990"]
    assert [e.name for e in numeric.entities] == ["Initech"]
    assert "type_repaired:not_text:int->episodic" in numeric.notes and "bad_timestamp_start" in numeric.notes
    born = by_content["Ana was born in 1990."]
    assert born.source_message_ids == ("m2",)
    assert born.timestamp == datetime(1990, 1, 1, tzinfo=timezone.utc)
    # the string memory cites nothing, so the window's turns are its sources; it shares
    # no content word with them -> dropped as a hallucination suspect
    kinds = sorted(i.kind for i in parsed.issues)
    assert kinds == ["hallucination_suspect", "no_content", "not_an_object"]
    # repairs are counted as the model wrote them, dropped memories included
    assert parsed.type_repairs == 3 and parsed.hallucination_suspects == 1


def test_alternative_shapes_are_accepted() -> None:
    w = window("I love green tea")
    flat = parse_extraction({"memories": [memory("Ana loves tea.", ["t1"])]}, w, max_memories=10)
    bare = parse_extraction([memory("Ana loves tea.", ["t1"])], w, max_memories=10)
    single = parse_extraction(memory("Ana loves tea.", ["t1"]), w, max_memories=10)
    assert flat.drafts == bare.drafts == single.drafts
    assert len(flat.drafts) == 1
    nothing = parse_extraction({"scenes": []}, w, max_memories=10)
    assert nothing.drafts == () and nothing.nothing_to_remember
    assert [i.kind for i in nothing.issues] == ["nothing_to_remember"]


@pytest.mark.parametrize("value", [{"answer": "none"}, "text", 42, None])
def test_an_answer_without_any_usable_shape_is_a_format_error(value: Any) -> None:
    with pytest.raises(ExtractionFormatError):
        parse_extraction(value, window("I love green tea"), max_memories=10)


def test_at_most_max_memories() -> None:
    w = window("many facts")
    mems = [memory(f"Fact {i}.", ["t1"]) for i in range(5)]
    parsed = parse_extraction(answer(*mems), w, max_memories=3)
    assert [d.content for d in parsed.drafts] == ["Fact 0.", "Fact 1.", "Fact 2."]
    assert [i.kind for i in parsed.issues] == ["over_limit", "over_limit"]


def test_content_is_cleaned_and_bounded() -> None:
    w = window("I like tea, and here is my long note")
    long_text = "note " * (MAX_MEMORY_CHARS // 5 + 10)
    parsed = parse_extraction(
        answer(memory("  Ana\x00 likes\x07 tea \ud800 ", ["t1"]), memory(long_text, ["t1"])), w, max_memories=10
    )
    tea, long_draft = parsed.drafts
    assert tea.content == "Ana likes tea"
    assert len(long_draft.content) == MAX_MEMORY_CHARS and "content_cut" in long_draft.notes


def test_reversed_interval_is_swapped() -> None:
    w = window("I was in Rome on a trip")
    (d,) = parse_extraction(
        answer(memory("Ana was in Rome.", ["t1"], timestamp_start="2024-05-10", timestamp_end="2024-05-01")),
        w,
        max_memories=10,
    ).drafts
    assert d.timestamp_start < d.timestamp_end  # type: ignore[operator]
    assert "interval_reversed" in d.notes


def test_entities_are_deduplicated_and_kinds_normalised() -> None:
    w = window("I met Bo at Initech")
    (d,) = parse_extraction(
        answer(
            memory(
                "Ana met Bo at Initech.",
                ["t1"],
                entities=[
                    {"name": "Bo", "kind": "person"},
                    {"name": "bo", "kind": "person"},
                    {"name": "Initech", "kind": "organisation"},
                    {"name": "Lisbon", "kind": "city"},
                    {"name": "", "kind": "person"},
                    {"name": "a\x01b", "kind": "person"},
                    {"kind": "person"},
                    7,
                ],
            )
        ),
        w,
        max_memories=10,
    ).drafts
    assert [(e.name, e.kind.value) for e in d.entities] == [
        ("Bo", "person"),
        ("Initech", "organization"),
        ("Lisbon", "other"),
        ("ab", "person"),
    ]


# --- times ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-07", datetime(2024, 5, 7, tzinfo=timezone.utc)),
        ("2024-05-07T10:00:00Z", datetime(2024, 5, 7, 10, tzinfo=timezone.utc)),
        ("2024-05-07T12:00:00+02:00", datetime(2024, 5, 7, 10, tzinfo=timezone.utc)),
        ("2024-05-07T10:00:00", datetime(2024, 5, 7, 10, tzinfo=timezone.utc)),
        ("2024-05", datetime(2024, 5, 1, tzinfo=timezone.utc)),
        ("2021", datetime(2021, 1, 1, tzinfo=timezone.utc)),
        ("today", datetime(2024, 5, 8, tzinfo=timezone.utc)),
        ("yesterday", datetime(2024, 5, 7, tzinfo=timezone.utc)),
        ("Yesterday.", datetime(2024, 5, 7, tzinfo=timezone.utc)),
        ("tomorrow", datetime(2024, 5, 9, tzinfo=timezone.utc)),
        ("the day before yesterday", datetime(2024, 5, 6, tzinfo=timezone.utc)),
        ("3 days ago", datetime(2024, 5, 5, tzinfo=timezone.utc)),
        ("two weeks ago", datetime(2024, 4, 24, tzinfo=timezone.utc)),
        ("in 2 days", datetime(2024, 5, 10, tzinfo=timezone.utc)),
        ("a month ago", datetime(2024, 4, 8, tzinfo=timezone.utc)),
        ("1 year ago", datetime(2023, 5, 8, tzinfo=timezone.utc)),
        ("last week", datetime(2024, 5, 1, tzinfo=timezone.utc)),
        ("next month", datetime(2024, 6, 8, tzinfo=timezone.utc)),
        ("last friday", datetime(2024, 5, 3, tzinfo=timezone.utc)),
        ("last wednesday", datetime(2024, 5, 1, tzinfo=timezone.utc)),
        ("next monday", datetime(2024, 5, 13, tzinfo=timezone.utc)),
        ("this friday", datetime(2024, 5, 10, tzinfo=timezone.utc)),
    ],
)
def test_resolve_time(text: str, expected: datetime) -> None:
    assert resolve_time(text, T0) == expected


@pytest.mark.parametrize("value", [None, "", "someday", "the 5th", "2024-13-01", "0001-01-01T00:00:00+05:00", True, 12.5, [], "x" * 200])
def test_unresolvable_times_are_none(value: Any) -> None:
    assert resolve_time(value, T0) is None


def test_month_arithmetic_clamps_the_day() -> None:
    assert resolve_time("a month ago", datetime(2024, 3, 31, tzinfo=timezone.utc)) == datetime(
        2024, 2, 29, tzinfo=timezone.utc
    )


# --- ids and exact dedup ---------------------------------------------------------------------


def draft(content: str, sources: tuple[str, ...] = ("m0",), priority: int = 50, **kw: Any) -> MemoryDraft:
    return MemoryDraft(
        content=content,
        memory_type=kw.pop("memory_type", MemoryType.persona),
        priority=priority,
        source_message_ids=sources,
        occurred_at=kw.pop("occurred_at", T0),
        **kw,
    )


def test_memory_ids_depend_on_the_space_and_the_normalised_content() -> None:
    a = memory_id_for(SCOPE, content_hash("Ana likes tea."))
    assert a == memory_id_for(SCOPE, content_hash("ANA  likes tea."))
    # two agents of one user never share a memory id (a write of one can never replace
    # the other's row)
    other = memory_id_for(Scope(team_id="acme", user_id="ana", agent_id="other"), content_hash("Ana likes tea."))
    assert other != a
    assert other != memory_id_for(Scope(team_id="acme", user_id="ana", agent_id="third"), content_hash("Ana likes tea."))
    assert a != memory_id_for(Scope(team_id="acme", user_id="bob"), content_hash("Ana likes tea."))
    assert a != memory_id_for(SCOPE, content_hash("Ana likes tea"))
    assert a.startswith("mem-") and len(a) == 36
    assert link_id_for("a", "b", LinkRelation.supersedes) != link_id_for("b", "a", LinkRelation.supersedes)


def test_dedupe_within_a_batch_merges_sources_and_keeps_the_highest_priority() -> None:
    kept, issues = dedupe_batch(
        [draft("Ana likes tea.", ("m0",), 40), draft("Bo likes rum."), draft("ana LIKES tea.", ("m1",), 90)]
    )
    assert [d.content for d in kept] == ["Ana likes tea.", "Bo likes rum."]
    assert kept[0].source_message_ids == ("m0", "m1") and kept[0].priority == 90
    assert [i.kind for i in issues] == ["duplicate_in_batch"]


def test_split_known_against_the_space() -> None:
    tea, rum = draft("Ana likes tea."), draft("Bo likes rum.")
    new, dups = split_known([tea, rum], {content_hash("ana likes tea."): "mem-old"})
    assert new == [rum]
    assert dups == [(tea, "mem-old")]


# --- judgment ----------------------------------------------------------------------------------


def cand(mid: str, content: str) -> Candidate:
    return Candidate(memory_id=mid, content=content, memory_type="persona", when=T0 - timedelta(days=3))


def test_plan_numbers_shared_candidates_once_and_skips_drafts_without_any() -> None:
    drafts = [draft("Ana likes pepperoni."), draft("Bo likes rum."), draft("Ana dislikes cheese pizza.")]
    shared = cand("mem-cheese", "Ana likes cheese pizza.")
    plan = plan_judgment(drafts, [[shared, cand("mem-x", "Ana likes pizza.")], [], [shared]])
    assert plan.items == ((1, 0, (1, 2)), (2, 2, (1,)))
    assert plan.candidates[1].memory_id == "mem-cheese"
    text = render_judgment(plan, drafts)
    assert 'N1 [persona] "Ana likes pepperoni."' in text
    assert '[1] [persona] "Ana likes cheese pizza." (from 2024-05-05)' in text
    assert "Bo likes rum" not in text
    assert "mem-cheese" not in text  # real ids are never shown
    with pytest.raises(ValueError):
        plan_judgment(drafts, [[]])


def test_parse_judgment_maps_short_ids_back_and_distrusts_the_rest() -> None:
    drafts = [draft("Ana likes pepperoni."), draft("Ana likes tea."), draft("Ana is 30."), draft("Ana owns a cat.")]
    plan = plan_judgment(
        drafts,
        [
            [cand("mem-cheese", "Ana likes cheese pizza."), cand("mem-pizza", "Ana eats pizza on Fridays.")],
            [cand("mem-tea", "Ana loves tea.")],
            [cand("mem-age", "Ana is 29.")],
            [cand("mem-dog", "Ana owns a dog.")],
        ],
    )
    got = parse_judgment(
        {
            "decisions": [
                {
                    "new": 1,
                    "action": "update",
                    "target": 1,
                    "links": [
                        {"target": 1, "relation": "preference_update"},
                        {"target": 2, "relation": "same_entity"},
                        {"target": 4, "relation": "same_entity"},  # not this draft's candidate
                        {"target": 2, "relation": "supersedes"},  # not for the judge to name
                        {"target": 2, "relation": "likes"},
                    ],
                    "reason": "changed preference",
                },
                {"new": "N2", "action": "merge", "target": "[3]"},
                {"new": 3, "action": "update", "target": 99},  # invented target
                {"new": 4, "action": "obliterate"},
                {"new": 1, "action": "drop"},  # a second answer for N1 is ignored
                {"new": 17, "action": "drop"},  # no such item
                "garbage",
            ]
        },
        plan,
        len(drafts),
    )
    assert got[0].action is Action.update and got[0].target == "mem-cheese"
    assert got[0].links == (("mem-cheese", LinkRelation.preference_update), ("mem-pizza", LinkRelation.same_entity))
    assert got[0].decided_by == "llm" and got[0].reason == "changed preference"
    assert {n.split(":")[0] for n in got[0].notes} == {"invalid_link_target", "relation_not_allowed", "unknown_relation"}
    assert got[1].action is Action.merge and got[1].target == "mem-tea"
    assert got[2].action is Action.store and got[2].notes == ("invalid_target:99",)
    assert got[3].action is Action.store and got[3].notes == ("unknown_action:obliterate",)


def test_unanswered_and_unasked_drafts_are_stored() -> None:
    drafts = [draft("A."), draft("B."), draft("C.")]
    plan = plan_judgment(drafts, [[cand("mem-a", "a")], [], [cand("mem-c", "c")]])
    got = parse_judgment({"decisions": [{"new": 1, "action": "drop"}]}, plan, 3)
    assert got[0].action is Action.drop
    assert got[1].action is Action.store and got[1].decided_by == "rule"
    assert got[2].action is Action.store and got[2].notes == ("no_decision",)
    # a positional list without "new" numbers is read in order
    got = parse_judgment([{"action": "drop"}, {"action": "merge", "target": 2}], plan, 3)
    assert got[0].action is Action.drop and got[2].action is Action.merge


@pytest.mark.parametrize("value", [{"answer": []}, "store", None, {"decisions": "all"}])
def test_a_judgment_without_decisions_is_a_format_error(value: Any) -> None:
    plan = plan_judgment([draft("A.")], [[cand("mem-a", "a")]])
    with pytest.raises(JudgmentFormatError):
        parse_judgment(value, plan, 1)


# --- events ---------------------------------------------------------------------------------------

EXTRACTION = StageReport(
    "llm",
    prompt_id="extraction",
    prompt_version="1",
    prompt_sha256="ab" * 32,
    model="m1",
    latency_ms=12.5,
    token_usage={"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
)
JUDGMENT = StageReport("llm", prompt_id="judgment", prompt_version="1", prompt_sha256="cd" * 32, model="m1", latency_ms=3.0)


def events_for(decisions: dict[int, Decision], drafts: list[MemoryDraft], **kw: Any):  # type: ignore[no-untyped-def]
    payload = EmbeddingPayload.from_vector("emb", [0.1, 0.2, 0.3])
    return build_events(
        scope=SCOPE,
        session_id="s1",
        drafts=drafts,
        decisions=decisions,
        embeddings=[payload] * len(drafts),
        extraction=kw.pop("extraction", EXTRACTION),
        judgment=kw.pop("judgment", JUDGMENT),
        input_refs=("m0", "m1"),
        batch_record=kw.pop("batch_record", [{"gate": "slash_command", "message_id": "m9"}]),
        recorded_at=T0 + timedelta(seconds=5),
        correlation_id="x-run",
        own_refs=kw.pop("own_refs", False),
    )


def test_actions_map_to_add_only_events() -> None:
    drafts = [
        draft("Ana now likes pepperoni pizza.", ("m1",), occurred_at=T0 + timedelta(minutes=1)),
        draft("Ana likes tea."),
        draft("Ana loves green tea."),
        draft("Ana said hi."),
    ]
    built = events_for(
        {
            0: Decision(0, Action.update, target="mem-cheese", links=(("mem-cheese", LinkRelation.preference_update),), reason="changed", decided_by="llm"),
            1: Decision(1, Action.store, decided_by="rule"),
            2: Decision(2, Action.merge, target="mem-tea", decided_by="llm"),
            3: Decision(3, Action.drop, reason="small talk", decided_by="llm"),
        },
        drafts,
    )
    assert built.rejected == ()
    kinds = [(type(e).__name__, getattr(e, "relation", None)) for e in built.events]
    assert kinds == [
        ("MemoryAdded", None),
        ("MemoryLinked", LinkRelation.supersedes),
        ("MemoryLinked", LinkRelation.preference_update),
        ("MemoryAdded", None),
        ("MemoryLinked", LinkRelation.duplicates),
    ]
    pepperoni, supersedes, pref, tea, merge = built.events
    assert isinstance(pepperoni, MemoryAdded) and isinstance(supersedes, MemoryLinked)
    assert pepperoni.memory_id == memory_id_for(SCOPE, content_hash(drafts[0].content))
    assert supersedes.from_memory_id == pepperoni.memory_id and supersedes.to_memory_id == "mem-cheese"
    assert supersedes.decided_by == "llm" and supersedes.reason == "changed"
    assert supersedes.link_id == link_id_for(pepperoni.memory_id, "mem-cheese", LinkRelation.supersedes)
    assert isinstance(merge, MemoryLinked) and merge.to_memory_id == "mem-tea"
    assert merge.from_memory_id == memory_id_for(SCOPE, content_hash("Ana loves green tea."))
    # the event's own time is when it was said; all share the run's correlation id
    assert pepperoni.occurred_at == T0 + timedelta(minutes=1)
    assert {e.correlation_id for e in built.events} == {"x-run"}
    assert {e.session_id for e in built.events} == {"s1"}
    assert all(e.producer == "memstream-extractor" for e in built.events)
    # provenance: a link names the draft's own turns and the judgment that decided it;
    # every event's record starts with its own decision, then the batch's; all valid
    assert supersedes.provenance is not None and merge.provenance is not None
    assert supersedes.provenance.input_refs == drafts[0].source_message_ids
    assert supersedes.provenance.method == "llm" and supersedes.provenance.prompt_id == JUDGMENT.prompt_id
    assert merge.provenance.decisions[0]["memory_id"] == merge.from_memory_id
    assert tea.provenance is not None and tea.provenance.method == EXTRACTION.method
    assert tea.provenance.decisions[0]["memory_id"] == tea.memory_id  # type: ignore[union-attr]
    assert tea.provenance.decisions[1:] == pepperoni.provenance.decisions[1:]  # type: ignore[union-attr]
    for event in built.events:
        assert parse_event(event.model_dump(mode="json")) == event


def test_every_event_carries_provenance_and_drops_stay_on_record() -> None:
    drafts = [draft("Ana likes tea."), draft("Ana said hi.")]
    built = events_for(
        {0: Decision(0, Action.store), 1: Decision(1, Action.drop, reason="small talk", decided_by="llm")},
        drafts,
    )
    (added,) = built.events
    assert isinstance(added, MemoryAdded)
    p = added.provenance
    assert p is not None
    assert (p.method, p.prompt_id, p.prompt_version, p.prompt_sha256, p.model) == (
        "llm", "extraction", "1", "ab" * 32, "m1",
    )
    assert p.input_refs == ("m0", "m1")
    assert p.output_refs == (added.memory_id,)
    assert p.latency_ms == 12.5
    assert p.token_usage == {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
    assert p.status == "ok"
    actions = [d.get("action") for d in p.decisions]
    assert actions[0] == "store"
    assert {"gate": "slash_command", "message_id": "m9"} in p.decisions
    dropped = [d for d in p.decisions if d.get("action") == "drop"]
    assert dropped and dropped[0]["content"] == "Ana said hi." and dropped[0]["reason"] == "small talk"
    # the event survives its own wire round trip
    assert parse_event(added.model_dump(mode="json")) == added


def test_own_refs_name_each_memory_s_own_turns_and_itself() -> None:
    drafts = [draft("Ana likes tea."), draft("Bo likes rum.", ("m1",))]
    shared = events_for(store_all(2, "heuristic"), drafts).events
    own = events_for(store_all(2, "heuristic"), drafts, own_refs=True).events
    assert [e.provenance.input_refs for e in shared] == [("m0", "m1")] * 2  # type: ignore[attr-defined]
    assert [e.provenance.input_refs for e in own] == [d.source_message_ids for d in drafts]  # type: ignore[attr-defined]
    assert [e.provenance.output_refs for e in own] == [(e.memory_id,) for e in own]  # type: ignore[attr-defined]
    # nothing else differs, and each event survives its wire round trip
    for a, b in zip(shared, own):
        assert a.model_dump(exclude={"event_id", "provenance"}) == b.model_dump(exclude={"event_id", "provenance"})
        assert a.provenance.decisions == b.provenance.decisions  # type: ignore[attr-defined]
        assert parse_event(b.model_dump(mode="json")) == b


def test_status_combines_a_repaired_extraction_and_a_failed_judgment() -> None:
    built = events_for(
        {0: Decision(0, Action.store, reason="judgment failed: stored all")},
        [draft("Ana likes tea.")],
        extraction=StageReport("llm", status="repaired", note="json repaired: trailing_comma"),
        judgment=StageReport("llm", status="failed", note="timeout"),
    )
    p = built.events[0].provenance  # type: ignore[attr-defined]
    assert p.status == "repaired+judgment_failed"
    assert p.note == "json repaired: trailing_comma; timeout"


def test_a_draft_that_cannot_be_an_event_is_rejected_alone() -> None:
    bad = MemoryDraft(
        content="Ana likes tea.",
        memory_type=MemoryType.persona,
        priority=50,
        source_message_ids=("not a valid id!",),
        occurred_at=T0,
    )
    built = events_for(store_all(2, "no candidates"), [bad, draft("Bo likes rum.")])
    assert [e.content for e in built.events] == ["Bo likes rum."]  # type: ignore[attr-defined]
    assert built.rejected[0]["issue"] == "invalid_memory"
    assert built.events[0].provenance.output_refs == (  # type: ignore[attr-defined]
        memory_id_for(SCOPE, content_hash("Bo likes rum.")),
    )


def test_record_items_lists_gate_rejections_issues_and_duplicates() -> None:
    w = window("I love tea", "/clear")
    parsed = parse_extraction(answer(memory("Ana loves tea.", ["t1", "t5"])), w, max_memories=10)
    items = record_items(w, parsed.issues, [(draft("Ana loves tea."), "mem-old")])
    assert items[0] == {"gate": "slash_command", "message_id": "m1", "detail": "client command /clear"}
    assert items[1]["issue"] == "invented_source_ids"
    assert items[2] == {"action": "exact_duplicate", "memory_id": "mem-old", "content": "Ana loves tea."}


# --- the heuristic ------------------------------------------------------------------------------


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
    import re

    stop = extraction_module._STOPWORDS
    found: list[str] = []
    run: list[str] = []

    def flush() -> None:
        if run:
            name = " ".join(run)
            if name.casefold() not in {f.casefold() for f in found} and len(found) < extraction_module.MAX_ENTITIES:
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
