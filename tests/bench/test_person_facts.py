"""The person-facts set keeps its rules: a question shares no content word with its
fact but the person's name, distractors are about the same person and topic and are
never the fact, and chit-chat states no fact of the set."""

from __future__ import annotations

from memstream.bench.person_facts import PERSONS, TOPICS, chit_chat, distractors, person_facts
from memstream.projections.search.lexical import terms


def test_questions_share_only_the_name_with_their_fact() -> None:
    facts = person_facts()
    assert len(facts) == len(PERSONS) * len(TOPICS) and len({f.memory_id for f in facts}) == len(facts)
    for f in facts:
        assert f.question is not None and f.person in f.question
        shared = (set(terms(f.question)) & set(terms(f.text))) - set(terms(f.person))
        assert not shared, (f.text, f.question, shared)


def test_distractors_share_person_and_topic_but_are_not_the_fact() -> None:
    facts = {(f.person, f.topic): f for f in person_facts()}
    extra = distractors()
    assert len(extra) == 3 * len(facts)
    for d in extra:
        fact = facts[(d.person, d.topic)]
        assert d.question is None and d.person in d.text and d.text != fact.text
    every_fact = {t.format(p=p) for p in PERSONS for variants, _ in TOPICS.values() for t, _q in variants}
    assert not every_fact & {d.text for d in extra}


def test_chit_chat_is_spoken_by_the_persons_and_states_no_fact() -> None:
    turns = chit_chat()
    assert len(turns) == 320 and {t.speaker for t in turns} <= set(PERSONS)
    facts = {f.text for f in person_facts()}
    assert not facts & {t.text for t in turns}
    assert person_facts() == person_facts() and chit_chat() == turns  # deterministic
