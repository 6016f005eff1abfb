"""A person-facts paraphrase set, generated (written for memstream, CC0; nothing in it
comes from LoCoMo), and chit-chat turns about the same persons.

Every person has one fact per topic, asked for by a question that shares no content
word with the fact except the person's name (``tests/bench/test_person_facts.py``
checks it), and three distractors: other facts about the same person and topic that
do not answer the question (and often share its words, as small talk does). The
chit-chat turns are spoken by the persons, in sessions of two, about dinners, trips
and errands, and never state a fact of the set.

Deterministic: the same seed gives the same set.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["PERSONS", "TOPICS", "PersonFact", "ChatTurn", "person_facts", "distractors", "chit_chat"]

PERSONS: tuple[str, ...] = ("Alice", "Bruno", "Chiara", "Dmitri", "Esther", "Farid", "Greta", "Hiroshi")

# topic -> (variants of (fact, question)), then distractors: same person and topic, no answer
TOPICS: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]] = {
    "diet": (
        (("{p} is vegetarian.", "Does {p} eat meat?"),
         ("{p} follows a strict vegan diet.", "Which animal products does {p} avoid eating?")),
        ("{p} likes to eat breakfast late on weekends.", "{p} cooks pasta for friends every Sunday.",
         "{p} orders the same sandwich at lunch.", "{p} tried a new ramen place downtown."),
    ),
    "allergy": (
        (("{p} is allergic to cats.", "Which pet makes {p} sneeze?"),
         ("{p} has a peanut allergy.", "What nut must {p} never eat?")),
        ("{p} keeps a first aid kit in the car.", "{p} went to the doctor for a checkup in spring.",
         "{p} never gets sick in the winter.", "{p} takes vitamins with breakfast."),
    ),
    "seat": (
        (("{p} prefers window seats on flights.", "Where does {p} like to sit when travelling by plane?"),
         ("{p} always books an aisle seat when flying.", "Which place on an airplane does {p} choose?")),
        ("{p} sleeps badly on long trips.", "{p} travels by plane twice a year.",
         "{p} packs only a small bag for holidays.", "{p} likes to sit in the back row at the cinema."),
    ),
    "work": (
        (("{p} works as a nurse at the city hospital.", "What is {p}'s job?"),
         ("{p} is employed as a software developer.", "How does {p} earn a living?")),
        ("{p} commutes by bus to the office.", "{p} finds the job stressful on Mondays.",
         "{p} has a meeting with the boss next week.", "{p} earns extra money tutoring at weekends."),
    ),
    "sibling": (
        (("{p} has two younger brothers.", "How many siblings does {p} have?"),
         ("{p}'s sister lives in Lisbon.", "Where is {p}'s family member based?")),
        ("{p} calls the parents every Sunday.", "{p} has a cousin who plays the violin.",
         "{p} visits the grandparents at Christmas.", "{p} babysits a neighbour's kids sometimes."),
    ),
    "pet": (
        (("{p} owns a golden retriever named Max.", "What kind of dog does {p} have?"),
         ("{p} keeps three goldfish in a tank.", "Which animals live with {p} at home?")),
        ("{p} walks in the park every morning.", "{p} wants a bigger flat with a garden.",
         "{p} fed a neighbour's dog while they were away.", "{p} watched a documentary about wolves."),
    ),
    "instrument": (
        (("{p} plays the cello in an amateur orchestra.", "Which instrument does {p} perform on?"),
         ("{p} learned the piano as a child.", "What did {p} practise playing when young?")),
        ("{p} goes to a jazz concert once a month.", "{p} listens to podcasts while cooking.",
         "{p} plays chess online at night.", "{p} sings loudly in the shower."),
    ),
    "sport": (
        (("{p} runs marathons.", "Which long race does {p} train for?"),
         ("{p} swims laps before work.", "How does {p} exercise in the pool?")),
        ("{p} watches football with friends on Saturdays.", "{p} bought new trainers last month.",
         "{p} hurt a knee skiing years ago.", "{p} plays tennis badly but enjoys it."),
    ),
    "home": (
        (("{p} lives in a houseboat on the canal.", "Where does {p} reside?"),
         ("{p} rents a small flat above a bakery.", "What kind of home does {p} have?")),
        ("{p} is painting the kitchen walls blue.", "{p} bought a new sofa for the living room.",
         "{p} has noisy neighbours upstairs.", "{p} waters the plants on the balcony daily."),
    ),
    "language": (
        (("{p} speaks fluent Japanese.", "Which foreign tongue has {p} mastered?"),
         ("{p} is learning Portuguese.", "Which language is {p} studying?")),
        ("{p} reads crime novels in bed.", "{p} writes a diary every evening.",
         "{p} watches films with subtitles.", "{p} corrects everyone's grammar at dinner."),
    ),
    "drink": (
        (("{p} never drinks coffee.", "Does {p} have caffeine in the morning?"),
         ("{p} loves green tea.", "What hot beverage is {p}'s favourite?")),
        ("{p} orders sparkling water at restaurants.", "{p} drinks a glass of wine on Fridays.",
         "{p} bought a new kettle last month.", "{p} meets friends at a cafe near the station."),
    ),
    "fear": (
        (("{p} is afraid of heights.", "What scares {p} when standing on a tall building?"),
         ("{p} panics in crowded lifts.", "Which small enclosed space makes {p} anxious?")),
        ("{p} loves horror films.", "{p} went climbing with a guide once.",
         "{p} feels calm near the sea.", "{p} gets nervous before exams."),
    ),
}


@dataclass(frozen=True)
class PersonFact:
    memory_id: str
    person: str
    topic: str
    text: str
    question: str | None
    """The question it answers (``None``: a distractor)."""


@dataclass(frozen=True)
class ChatTurn:
    message_id: str
    session: int
    speaker: str
    text: str


def person_facts(seed: int = 41) -> list[PersonFact]:
    """One fact (with its question) per person and topic, the variant drawn by ``seed``."""
    rng = random.Random(seed)
    out: list[PersonFact] = []
    for person in PERSONS:
        for topic, (variants, _) in TOPICS.items():
            fact, question = rng.choice(variants)
            out.append(PersonFact(f"{person.lower()}-{topic}", person, topic, fact.format(p=person),
                                  question.format(p=person)))
    return out


def distractors(seed: int = 41) -> list[PersonFact]:
    """Three distractors per person and topic (drawn by ``seed``)."""
    rng = random.Random(seed + 1)
    out: list[PersonFact] = []
    for person in PERSONS:
        for topic, (_, others) in TOPICS.items():
            for i, text in enumerate(rng.sample(others, 3)):
                out.append(PersonFact(f"{person.lower()}-{topic}-x{i}", person, topic, text.format(p=person), None))
    return out


_CHAT: tuple[str, ...] = (
    "Hey {q}, are we still on for dinner tonight?",
    "Yes please, short and polite.",
    "I'm running late, the traffic near the station is awful.",
    "Can you pick up some bread on your way?",
    "That trip last summer was so much fun, {q}.",
    "I still have to post that parcel before five.",
    "Did you book the table for Friday?",
    "Let's try the new place on the corner this time.",
    "Sorry {q}, I forgot to call you back yesterday.",
    "No worries, see you at eight.",
    "The train was cancelled again this morning.",
    "I need to return the library books, remind me please.",
    "Should we take the car or the bus to the market?",
    "Thanks {q}, that was a lovely evening.",
    "I'll bring dessert if you handle the drinks.",
    "My phone battery died halfway through the day.",
    "We could go to the coast next month if the weather holds.",
    "Have you seen my blue umbrella anywhere?",
    "I'm stuck in a queue at the post office.",
    "Great, I'll send you the address later.",
)


def chit_chat(sessions: int = 32, turns: int = 10, seed: int = 41) -> list[ChatTurn]:
    """``sessions`` sessions of ``turns`` turns, each between two persons of the set who
    take turns; the texts mention the other person by name now and then and never
    state a fact of the set."""
    rng = random.Random(seed + 2)
    out: list[ChatTurn] = []
    for s in range(1, sessions + 1):
        a, b = rng.sample(PERSONS, 2)
        for t in range(1, turns + 1):
            speaker, other = (a, b) if t % 2 else (b, a)
            out.append(ChatTurn(f"S{s}:{t}", s, speaker, rng.choice(_CHAT).format(q=other)))
    return out
