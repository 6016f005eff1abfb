"""The LoCoMo benchmark's pure parts: the session date-time parser, evidence splitting
and validation, recall@k / hit@k and their per-category averages, and the loader,
on small synthetic data (the real data set is never read here: its licence keeps it
out of the repository and CI)."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

import pytest

from memstream.bench.locomo import (
    SCORED_CATEGORIES,
    ScoreBoard,
    conversation_events,
    hit_at_k,
    load_locomo,
    parse_session_time,
    recall_at_k,
    resolve_evidence,
    scope_of,
    split_evidence,
)


def test_session_time_is_parsed_as_utc() -> None:
    assert parse_session_time("1:56 pm on 8 May, 2023") == datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)
    assert parse_session_time("10:37 am on 27 June, 2023") == datetime(2023, 6, 27, 10, 37, tzinfo=timezone.utc)
    assert parse_session_time("12:05 am on 1 Jan, 2024") == datetime(2024, 1, 1, 0, 5, tzinfo=timezone.utc)
    with pytest.raises(ValueError, match="unrecognised"):
        parse_session_time("yesterday")


def test_evidence_strings_are_split_on_semicolons_commas_and_spaces() -> None:
    assert split_evidence(["D1:3"]) == ["D1:3"]
    assert split_evidence(["D8:6; D9:17", "D2:1,D2:2", "D3:1 D3:2", "D1:3"]) == [
        "D8:6", "D9:17", "D2:1", "D2:2", "D3:1", "D3:2", "D1:3",
    ]
    assert split_evidence(["D1:1", "D1:1"]) == ["D1:1"]  # repeats count once
    assert split_evidence([]) == []


def test_ids_that_match_no_turn_are_set_apart() -> None:
    valid, invalid = resolve_evidence(["D1:1; D:11:26", "D", "D2:2"], {"D1:1", "D2:2", "D3:3"})
    assert valid == ("D1:1", "D2:2")
    assert invalid == ("D:11:26", "D")


def test_recall_and_hit_count_sources_within_the_cutoff() -> None:
    results = [("D1:1",), ("D5:5",), ("D2:2", "D3:3"), ("D4:4",)]
    evidence = ["D2:2", "D4:4"]
    assert recall_at_k(results, evidence, 1) == 0.0
    assert hit_at_k(results, evidence, 1) == 0.0
    assert recall_at_k(results, evidence, 3) == 0.5
    assert hit_at_k(results, evidence, 3) == 1.0
    assert recall_at_k(results, evidence, 4) == 1.0
    assert recall_at_k(results, evidence, 50) == 1.0  # fewer results than k
    assert recall_at_k([], evidence, 10) == 0.0
    with pytest.raises(ValueError):
        recall_at_k(results, [], 10)
    with pytest.raises(ValueError):
        hit_at_k(results, evidence, 0)


def test_a_result_citing_several_turns_credits_each() -> None:
    assert recall_at_k([("D1:1", "D1:2", "D1:3")], ["D1:1", "D1:3", "D9:9"], 1) == pytest.approx(2 / 3)


def test_scoreboard_averages_per_category_and_overall_excludes_adversarial() -> None:
    board = ScoreBoard((1, 2))
    hit, miss = [("a",), ("b",)], [("x",), ("y",)]
    board.add("memstream", 1, hit, ["a"])  # recall@1 = 1
    board.add("memstream", 1, miss, ["a"])  # 0
    board.add("memstream", 4, [("x",), ("a",)], ["a"])  # @1 = 0, @2 = 1
    board.add("memstream", 5, hit, ["a"])  # adversarial: reported, not in overall
    board.add("bm25", 4, hit, ["a", "b"])  # @1 = 0.5, hit@1 = 1
    summary = board.summary()
    mem = summary["memstream"]
    assert mem["1"]["recall@1"] == 0.5 and mem["1"]["n"] == 2
    assert mem["4"]["recall@1"] == 0.0 and mem["4"]["recall@2"] == 1.0
    assert mem["5"]["recall@1"] == 1.0
    # overall is the mean over the items of categories 1-4: (1 + 0 + 0) / 3 at k=1
    assert mem["overall"]["n"] == 3
    assert mem["overall"]["recall@1"] == pytest.approx(round(1 / 3, 4))
    assert mem["overall"]["recall@2"] == pytest.approx(round(2 / 3, 4))
    assert summary["bm25"]["4"]["recall@1"] == 0.5 and summary["bm25"]["4"]["hit@1"] == 1.0
    assert "2" not in mem  # no item, no entry
    assert math.isnan(board.mean("memstream", [2], "recall", 1))
    assert board.systems()[0] == "memstream"
    assert SCORED_CATEGORIES == (1, 2, 3, 4)


def _sample() -> list[dict[str, object]]:
    return [
        {
            "sample_id": "conv-x",
            "conversation": {
                "speaker_a": "Ann",
                "speaker_b": "Ben",
                "session_2_date_time": "9:00 am on 2 March, 2024",
                "session_2": [{"speaker": "Ann", "dia_id": "D2:1", "text": "Back from the lake."}],
                "session_1_date_time": "8:15 pm on 1 March, 2024",
                "session_1": [
                    {"speaker": "Ann", "dia_id": "D1:1", "text": "I bought a red kayak."},
                    {"speaker": "Ben", "dia_id": "D1:2", "text": "Look!", "blip_caption": "a photo of a dog"},
                    {"speaker": "Ben", "dia_id": "D1:3", "text": "", "blip_caption": "a photo of a cat"},
                    {"speaker": "Ann", "dia_id": "D1:4", "text": "   "},
                ],
            },
            "qa": [
                {"question": "What did Ann buy?", "answer": "a kayak", "evidence": ["D1:1"], "category": 4},
                {"question": "Unanswerable?", "adversarial_answer": "x", "evidence": [], "category": 5},
            ],
        }
    ]


def test_loader_orders_sessions_carries_captions_and_skips_empty_turns(tmp_path: Path) -> None:
    path = tmp_path / "sample.json"
    path.write_text(json.dumps(_sample()))
    (conv,) = load_locomo(path)
    assert conv.sample_id == "conv-x" and conv.speakers == ("Ann", "Ben")
    assert [t.dia_id for t in conv.turns] == ["D1:1", "D1:2", "D1:3", "D2:1"]
    assert conv.turns[1].text == "Look! [image: a photo of a dog]"
    assert conv.turns[2].text == "[image: a photo of a cat]"
    assert conv.turns[0].occurred_at == datetime(2024, 3, 1, 20, 15, tzinfo=timezone.utc)
    assert conv.turns[3].session == 2
    assert [q.category for q in conv.qa] == [4, 5]
    assert conv.qa[1].evidence == ()


def test_turns_become_message_events_of_one_space_per_conversation(tmp_path: Path) -> None:
    path = tmp_path / "sample.json"
    path.write_text(json.dumps(_sample()))
    (conv,) = load_locomo(path)
    events = conversation_events(conv)
    assert [e.message_id for e in events] == ["D1:1", "D1:2", "D1:3", "D2:1"]
    first = events[0]
    assert first.scope == scope_of(conv) and first.scope.user_id == "conv-x"
    assert first.speaker == "Ann" and first.content == "I bought a red kayak."
    assert first.occurred_at == datetime(2024, 3, 1, 20, 15, tzinfo=timezone.utc)
    assert first.session_id == "session_1" and events[3].session_id == "session_2"
