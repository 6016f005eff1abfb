"""Conversation-aware search on real LanceDB tables: turns in the ``messages`` table,
one memory per turn (as the no-LLM extractor writes them), and the steps that use
them: the answer after a matching question, the speaker prior, and isolation of the
neighbour lookup."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from tests.projections.projection_helpers import DIM, T0, memory, positioned

from memstream.domain.events import MessageObserved, Scope
from memstream.domain.ranking import QUESTION_PENALTY, TURN_PRIOR, RankingWeights
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.search.hybrid import search
from memstream.projections.store.lance_store import LanceStore

EMB = LocalEmbedder(DIM)
ANN = Scope(team_id="acme", user_id="ann")
EVE = Scope(team_id="acme", user_id="eve")
PLAIN = RankingWeights(
    fusion="rrf", query_processing=False, context_forward=0, context_forward_statement=0,
    context_backward=0, speaker_weight=0, temporal_weight=0, question_penalty=1.0,
)
FILLER = [
    ("Ann", "The weather was lovely on the coast."),
    ("Bob", "I fixed the bicycle chain again."),
    ("Ann", "Dinner with my sister went well."),
    ("Bob", "The new office chairs arrived."),
]


def _conversation(scope: Scope, turns: list[tuple[str, str]], session: str = "s1") -> tuple[list, list]:
    messages, memories = [], []
    for i, (speaker, text) in enumerate(turns):
        mid = f"{session}-{i}"
        when = T0 + timedelta(minutes=i)
        messages.append(
            MessageObserved(scope=scope, message_id=mid, speaker=speaker, content=text,
                            session_id=session, occurred_at=when, recorded_at=when)
        )
        memories.append(memory(scope, f"m-{mid}", f"{speaker}: {text}", source_message_ids=(mid,),
                               session_id=session, occurred_at=when))
    return messages, memories


def _store(tmp_path: Path, *conversations: tuple[list, list]) -> LanceStore:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    messages = [m for c in conversations for m in c[0]]
    memories = [m for c in conversations for m in c[1]]
    projector = Projector(store, EMB)
    projector.apply(positioned(messages, topic="test.messages"))
    projector.apply(positioned(memories))
    store.optimize()
    return store


def test_an_answer_is_found_through_the_question_before_it(tmp_path: Path) -> None:
    turns = FILLER + [
        ("Bob", "What did you take away from the pottery workshop?"),
        ("Ann", "Mostly patience, and that mistakes are part of it."),
    ] + FILLER
    store = _store(tmp_path, _conversation(ANN, turns))
    query = "What did Ann take away from the pottery workshop?"
    results = search(store, EMB, ANN, query, k=3)
    ids = [r.memory_id for r in results]
    assert "m-s1-5" in ids  # the answer shares no content word with the query
    answer = results[ids.index("m-s1-5")]
    assert answer.parts.context > 0.0
    assert answer.parts.prior > 1.0  # Ann said it and the query names Ann
    plain = [r.memory_id for r in search(store, EMB, ANN, query, k=3, weights=PLAIN)]
    assert "m-s1-5" not in plain


def test_the_named_speaker_ranks_first_among_equal_matches(tmp_path: Path) -> None:
    turns = [("Bob", "I adopted a grey cat last week."), ("Ann", "I adopted a grey cat last week.!")]
    store = _store(tmp_path, _conversation(ANN, turns))
    first = search(store, EMB, ANN, "Which cat did Ann adopt?", k=2)[0]
    assert first.memory_id == "m-s1-1" and first.parts.prior > 1.0
    first = search(store, EMB, ANN, "Which cat did Bob adopt?", k=2)[0]
    assert first.memory_id == "m-s1-0"


def test_a_time_question_prefers_the_turn_that_states_a_time(tmp_path: Path) -> None:
    turns = [("Ann", "I love the pottery class."), ("Ann", "I started the pottery class yesterday.")]
    store = _store(tmp_path, _conversation(ANN, turns))
    first = search(store, EMB, ANN, "When did Ann start the pottery class?", k=2)[0]
    assert first.memory_id == "m-s1-1"


def test_neighbours_never_come_from_another_space(tmp_path: Path) -> None:
    question = [("Bob", "What did you take away from the pottery workshop?")]
    answer_elsewhere = [("Ann", "Mostly patience, and that mistakes are part of it.")]
    # Eve's space holds the answer at the very next log offset, in a session of the same name
    store = _store(tmp_path, _conversation(ANN, question), _conversation(EVE, answer_elsewhere))
    results = search(store, EMB, ANN, "What did Ann take away from the pottery workshop?", k=10)
    assert results and all((r.team_id, r.user_id) == ("acme", "ann") for r in results)
    assert all(r.memory_id != "m-s1-0" or r.user_id == "ann" for r in results)
    assert search(store, EMB, EVE, "pottery workshop", k=10)[0].user_id == "eve"


def test_memories_without_turns_still_rank(tmp_path: Path) -> None:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    Projector(store, EMB).apply(positioned([memory(ANN, "x", "Ann likes green tea"), memory(ANN, "y", "Budget review")]))
    store.optimize()
    results = search(store, EMB, ANN, "What tea does Ann like?", k=2)
    assert results[0].memory_id == "x"
    # no turn, no context; the query names Ann and so does the memory: it is about her
    assert results[0].parts.context == 0.0 and results[0].parts.prior == 1.0 + RankingWeights().speaker_weight
    assert all(r.parts.prior == 1.0 for r in results if r.memory_id == "y")


def test_a_turn_that_only_asks_ranks_below_the_statement(tmp_path: Path) -> None:
    turns = [("Bob", "Have you been to the pottery class?"), ("Ann", "I have been to the pottery class.")]
    store = _store(tmp_path, _conversation(ANN, turns))
    query = "pottery class"
    results = {r.memory_id: r for r in search(store, EMB, ANN, query, k=2)}
    # both are turn memories (turn prior alike); the question pays the penalty on top
    assert results["m-s1-0"].parts.prior == QUESTION_PENALTY * results["m-s1-1"].parts.prior
    assert results["m-s1-0"].score < results["m-s1-1"].score
    off = {r.memory_id: r for r in search(store, EMB, ANN, query, k=2, weights=RankingWeights(question_penalty=1.0))}
    assert off["m-s1-0"].parts.prior == off["m-s1-1"].parts.prior


def test_an_explicit_fact_outranks_small_talk_of_the_person_it_is_about(tmp_path: Path) -> None:
    # the person's turns name her as their speaker; the fact names her in its text: both
    # are about her, so neither prior lifts small talk above the fact that answers
    chat = [("Alice", "Yes please, short and polite."), ("Bob", "See you at eight then."),
            ("Alice", "I am running late again."), ("Bob", "No worries at all.")]
    messages, turns = _conversation(ANN, chat)
    facts = [memory(ANN, "fact", "Alice is vegetarian"), memory(ANN, "other", "Bob plays the cello")]
    store = _store(tmp_path, (messages, turns + facts))
    results = search(store, EMB, ANN, "Is Alice vegetarian or not?", k=3)
    assert results[0].memory_id == "fact"
    speaker = 1.0 + RankingWeights().speaker_weight
    first_turn = next(r for r in results if r.source_message_ids)
    assert results[0].parts.prior == speaker
    # a turn stored word for word ranks below a fact of equal relevance...
    assert first_turn.parts.prior == speaker * TURN_PRIOR
    # ...unless the query asks what was said
    asked = search(store, EMB, ANN, "What did Alice say about being vegetarian?", k=5)
    assert next(r for r in asked if r.source_message_ids).parts.prior == speaker


def test_a_question_about_a_day_prefers_what_was_recorded_that_day(tmp_path: Path) -> None:
    day = T0 + timedelta(days=3)
    # the later one would win on recency alone
    same = [memory(ANN, "later", "Ann went to a pottery class", occurred_at=day + timedelta(days=3)),
            memory(ANN, "that-day", "Ann went to the pottery class", occurred_at=day)]
    store = _store(tmp_path, ([], same))
    named = f"What did Ann do on {day.day} {day.strftime('%B')}, {day.year}?"
    results = search(store, EMB, ANN, named, k=2)
    assert results[0].memory_id == "that-day"
    # both name Ann (the same prior for that); the day multiplies on top
    assert results[0].parts.prior == results[1].parts.prior * (1.0 + RankingWeights().date_weight)
    off = search(store, EMB, ANN, named, k=2, weights=RankingWeights(date_weight=0.0))
    assert off[0].parts.prior == off[1].parts.prior and off[0].memory_id == "later"
