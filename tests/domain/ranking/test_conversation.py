"""The conversation-aware ranking math: query processing, score fusion, neighbouring
turns and the speaker and time priors (``memstream.domain.ranking.conversation``, steps 5-8)."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memstream.domain.ranking.conversation import (
    asks_about_conversation,
    asks_for_time,
    coverage,
    is_question,
    is_turn_copy,
    lexical_confidence,
    lexical_query,
    mentions_time,
    named_dates,
    on_named_day,
    prior_factor,
    propagate_context,
    query_names,
    score_fusion,
)
from memstream.domain.ranking.weights import RankingWeights


def test_lexical_query_keeps_content_words_only() -> None:
    assert lexical_query("When did Caroline go to the LGBTQ support group?") == "caroline go lgbtq support group"
    assert lexical_query("What would Ana likely do?") == "ana"


def test_lexical_query_moves_named_speakers_out() -> None:
    assert lexical_query("What do Melanie's kids like?", ["Melanie"]) == "kids like"
    assert lexical_query("Did Mary Ann Lee call Bob?", ["Mary Ann Lee", "Bob"]) == "call"
    # a name that is only part of a longer word is not a mention
    assert lexical_query("Where is Bobby?", ["Bob"]) == "bobby"


def test_lexical_query_never_empties_a_query() -> None:
    assert lexical_query("Who is Melanie?", ["Melanie"]) == "melanie"
    assert lexical_query("what is it?") == "what is it?"
    assert lexical_query("") == ""


@given(st.text(max_size=60), st.lists(st.text(max_size=10), max_size=3))
def test_lexical_query_is_total(query: str, names: list[str]) -> None:
    out = lexical_query(query, names)
    assert isinstance(out, str)
    assert out.strip() or not query.strip() or out == query


def test_score_fusion_normalises_bm25_and_weights_similarity() -> None:
    fused = score_fusion({"a": 10.0, "b": 5.0}, {"a": 0.2, "c": 0.8, "d": -0.5}, 1.0, 0.5)
    assert fused["a"] == pytest.approx((1.0 + 0.5 * 0.2) / 1.5)
    assert fused["b"] == pytest.approx(0.5 / 1.5)
    assert fused["c"] == pytest.approx(0.5 * 0.8 / 1.5)
    assert fused["d"] == 0.0  # negative similarity counts as none
    assert all(0.0 <= v <= 1.0 for v in fused.values())
    assert score_fusion({}, {"x": 0.4}, 1.0, 0.5) == {"x": pytest.approx(0.2 / 1.5)}
    with pytest.raises(ValueError):
        score_fusion({"a": 1.0}, {}, 0.0, 0.0)


def test_score_fusion_can_scale_similarity_over_the_candidates() -> None:
    sims = {"best": 0.7, "mid": 0.55, "worst": 0.4}
    fused = score_fusion({"mid": 3.0}, sims, 1.0, 0.5, "minmax")
    assert fused["best"] == pytest.approx(0.5 / 1.5) and fused["worst"] == 0.0
    assert fused["mid"] == pytest.approx((1.0 + 0.5 * 0.5) / 1.5)
    # all equal (or one candidate): nothing to scale, the raw similarity counts
    assert score_fusion({}, {"x": 0.4}, 1.0, 0.5, "minmax") == {"x": pytest.approx(0.2 / 1.5)}
    with pytest.raises(ValueError):
        score_fusion({}, sims, 1.0, 0.5, "zscore")
    with pytest.raises(ValueError):
        RankingWeights(vector_scaling="zscore")


def test_score_fusion_keeps_how_much_better_a_hit_is() -> None:
    # RRF would give ranks 1 and 2 almost the same; score fusion keeps the gap
    fused = score_fusion({"answer": 12.0, "one_word": 2.0}, {}, 1.0, 0.5)
    assert fused["answer"] > 5 * fused["one_word"]


def test_context_flows_from_a_question_to_its_answer_and_back() -> None:
    w = RankingWeights()
    scores = {"q": 1.0, "other": 0.5}
    # "ans" follows "q" (a question); "q" follows "before"
    ctx = propagate_context(scores, {"ans": "q", "q": "before"}, questions={"q"}, weights=w)
    assert ctx["ans"] == pytest.approx(w.context_forward * 1.0)
    assert ctx["before"] == pytest.approx(w.context_backward * 1.0)
    assert "other" not in ctx
    plain = propagate_context(scores, {"ans": "q"}, questions=set(), weights=w)
    assert plain["ans"] == pytest.approx(w.context_forward_statement * 1.0)
    off = RankingWeights(context_forward=0, context_forward_statement=0, context_backward=0)
    assert propagate_context(scores, {"ans": "q", "q": "before"}, {"q"}, off) == {}


def test_context_only_comes_from_scored_documents() -> None:
    assert propagate_context({}, {"b": "a"}, {"a"}) == {}
    assert propagate_context({"a": 1.0}, {"a": "a"}, {"a"}) == {}  # no self loops


def test_time_questions_and_time_statements() -> None:
    assert asks_for_time("When did she move?")
    assert asks_for_time("How long ago was the trip?")
    assert asks_for_time("In what year did he start?")
    assert not asks_for_time("What does she like?")
    assert mentions_time("I went there yesterday")
    assert mentions_time("We met on 12/05/2023")
    assert mentions_time("Back in 2019 it was different")
    assert mentions_time("Last Friday was great")
    assert not mentions_time("I like painting landscapes")
    assert is_question("How was it?") and not is_question("It was fine.")


def test_priors_multiply() -> None:
    w = RankingWeights(speaker_weight=0.8, temporal_weight=0.6)
    assert prior_factor(False, False, w) == 1.0
    assert prior_factor(True, False, w) == pytest.approx(1.8)
    assert prior_factor(True, True, w) == pytest.approx(1.8 * 1.6)
    assert prior_factor(True, False, w, only_asks=True) == pytest.approx(1.8 * w.question_penalty)
    assert prior_factor(False, False, RankingWeights(question_penalty=1.0), only_asks=True) == 1.0


def test_new_weights_are_validated() -> None:
    with pytest.raises(ValueError):
        RankingWeights(fusion="max")
    with pytest.raises(ValueError):
        RankingWeights(context_forward=-0.1)
    with pytest.raises(ValueError):
        RankingWeights(speaker_weight=-1)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError):
            RankingWeights(question_penalty=bad)


def test_coverage_is_the_share_of_query_terms_held() -> None:
    q = frozenset({"sit", "plane", "travel"})
    assert coverage(q, frozenset({"sit", "cinema"})) == pytest.approx(1 / 3)
    assert coverage(q, frozenset({"window", "seat"})) == 0.0
    assert coverage(frozenset(), frozenset({"x"})) == 1.0  # nothing to weigh: no reordering


def test_query_names_are_capitalised_words_inside_the_sentence() -> None:
    assert query_names("What did Caroline research?") == {"Caroline"}
    assert query_names("Where is Bruno's sister based, Alice?") == {"Bruno", "Alice"}
    assert query_names("Does anyone eat meat?") == frozenset()  # a sentence's first word is no name


def test_when_asks_only_where_a_question_starts() -> None:
    assert asks_for_time("When did Maria start volunteering?")
    assert asks_for_time("Maria moved, and when was that?")
    assert not asks_for_time("Who gave Maria's family money when she was younger?")
    assert not asks_for_time("Where does Alice like to sit when travelling by plane?")


def test_asks_about_conversation() -> None:
    assert asks_about_conversation("What did Alice say about her trip?")
    assert asks_about_conversation("Which book was mentioned?")
    assert not asks_about_conversation("Is Alice vegetarian?")


def test_named_dates_and_the_day_a_memory_falls_on() -> None:
    days = named_dates("What did Tim do on 16 November, 2023 and on May 3rd, 2023? Not 2023-02-30.")
    assert days == {date(2023, 11, 16), date(2023, 5, 3)}
    at = datetime(2023, 11, 16, 13, 5, tzinfo=timezone.utc)
    assert on_named_day(days, at, at)
    assert not on_named_day(days, at + timedelta(days=1), at + timedelta(days=1))
    assert on_named_day(days, at - timedelta(days=2), at + timedelta(days=2))  # a span over it
    assert not on_named_day(frozenset(), at, at) and not on_named_day(days, None, None)


def test_a_turn_copy_is_its_turn_word_for_word() -> None:
    assert is_turn_copy("Alice: Yes please.", [("Alice", "Yes please.")])
    assert is_turn_copy("Yes please.", [(None, "Yes please.")])
    assert not is_turn_copy("Alice likes things short and polite.", [("Alice", "Yes please.")])
    assert not is_turn_copy("Bob: Yes please.", [("Alice", "Yes please.")])


def test_lexical_confidence_of_a_query() -> None:
    assert lexical_confidence([1, 0], 3) == pytest.approx(1 / 3)  # one word of three: a topic match
    assert lexical_confidence([2, 1], 3) == 1.0  # two words held together
    assert lexical_confidence([1], 1) == 1.0  # all of a one-word query
    assert lexical_confidence([0, 0], 2) == 0.0  # nothing in common: BM25 reorders nothing
    assert lexical_confidence([], 0) == 1.0


def test_turn_and_day_priors() -> None:
    w = RankingWeights(turn_prior=0.5, date_weight=2.0)
    assert prior_factor(False, False, w, small_talk=True) == 0.5
    assert prior_factor(False, False, w, day_match=True) == 3.0
    assert prior_factor(True, False, w, small_talk=True) == pytest.approx(0.5 * (1 + w.speaker_weight))
    with pytest.raises(ValueError):
        RankingWeights(turn_prior=0.0)
    with pytest.raises(ValueError):
        RankingWeights(date_weight=-1.0)
