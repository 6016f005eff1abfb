"""Extraction informed by memory: the extraction call is shown the space's memories
closest to the new turns (the judgment's own recall, in scope), links to them at once,
and the judgment is kept for the drafts whose closest memory the call did not see.
Real broker and LanceDB, the scripted endpoint behind the real ``openai`` client."""

from __future__ import annotations

import re

import pytest
from tests.fakes.openai_server import fake_llm  # noqa: F401 - the fixture
from tests.services.extraction.test_extractor import SCOPE, Env, env, mem, scenes, turn  # noqa: F401 - env is a fixture

from memstream.domain.events import LinkRelation, Scope
from memstream.services.extraction.extractor import Extractor

pytestmark = [pytest.mark.kafka]


def informed(env: Env, known: int = 10) -> Extractor:
    extractor = Extractor(env.settings, env.llm, env.embedder, env.store, env.producer)
    extractor.known_memories = known
    return extractor


def user_prompt(env: Env, index: int = -1) -> str:
    return str(env.fake.chat.requests[index]["messages"][1]["content"])


async def seed(env: Env, *contents: str, scope: Scope = SCOPE) -> list[str]:
    """Store memories through an extraction (no known memories yet) and project them."""
    env.fake.chat.push_json(scenes(*(mem(c, ["t1"]) for c in contents)))
    outcome = await informed(env, known=0).run_window(scope, "s0", [turn("m0", " ".join(contents))])
    await env.project()
    return [m.memory_id for m in outcome.memories]


async def test_the_call_sees_the_closest_memories_and_links_at_once_without_a_judgment(env: Env) -> None:
    (cheese,) = await seed(env, "Ana likes cheese pizza.")
    env.fake.chat.push_json(
        scenes(mem("Ana now prefers pepperoni pizza.", ["t1"], links=[{"known": "k1", "relation": "preference_update"}]))
    )
    before = env.fake.chat.count
    outcome = await informed(env).run_window(SCOPE, "s1", [turn("m1", "honestly I prefer pepperoni pizza now")])
    assert env.fake.chat.count == before + 1  # the extraction call only: no judgment
    prompt = user_prompt(env)
    assert prompt.startswith("KNOWN MEMORIES") and "[k1] (persona) Ana likes cheese pizza." in prompt
    (pepperoni,) = outcome.memories
    assert {(link.to_memory_id, link.relation) for link in outcome.links} == {
        (cheese, LinkRelation.supersedes),
        (cheese, LinkRelation.preference_update),
    }
    (decision,) = outcome.decisions
    assert decision["action"] == "update" and decision["decided_by"] == "llm"
    await env.project()
    row = env.store.get_memory(SCOPE, cheese)
    assert row is not None and row["superseded_by"] == pepperoni.memory_id


async def test_a_duplicate_named_by_the_call_is_not_stored_again(env: Env) -> None:
    (porto,) = await seed(env, "Ana lives in Porto.")
    env.fake.chat.push_json(scenes(mem("The user lives in Porto.", ["t1"], links=[{"known": "k1", "relation": "duplicates"}])))
    outcome = await informed(env).run_window(SCOPE, "s1", [turn("m1", "as I said I live in Porto")])
    assert outcome.memories == ()
    (link,) = outcome.links
    assert (link.to_memory_id, link.relation) == (porto, LinkRelation.duplicates)


async def test_only_drafts_whose_closest_memory_the_call_did_not_see_are_judged(env: Env) -> None:
    tea, porto = await seed(env, "Ana loves green tea.", "Ana lives in Porto.")
    env.fake.chat.push_json(scenes(mem("Ana drinks green tea daily.", ["t1"]), mem("Ana lives in central Porto.", ["t2"])))
    env.fake.chat.push_json({"decisions": [{"new": 1, "action": "store", "target": None, "links": [], "reason": "x"}]})
    turns = [turn("m1", "I drink green tea every day"), turn("m2", "my flat is in central Porto", minutes=1)]
    outcome = await informed(env, known=1).run_window(SCOPE, "s1", turns)
    shown = user_prompt(env, -2).split("BACKGROUND TURNS", 1)[0]
    assert shown.count("[k") == 1
    judged = user_prompt(env)
    assert judged.startswith("NEW MEMORIES AND THEIR CANDIDATES") and len(re.findall(r"^N\d+ ", judged, re.MULTILINE)) == 1
    seen = tea if "green tea" in shown else porto
    by_content = {d["memory"]: d for d in outcome.decisions}
    settled = by_content["Ana drinks green tea daily." if seen == tea else "Ana lives in central Porto."]
    assert settled["action"] == "store" and "named no link" in settled["reason"]
    assert len(outcome.memories) == 2


async def test_known_memories_stay_inside_the_memory_space(env: Env) -> None:
    other = Scope(team_id="acme", user_id="bo", agent_id="bot")
    await seed(env, "Bo likes cheese pizza.", scope=other)
    env.fake.chat.push_json(scenes(mem("Ana likes pizza.", ["t1"])))
    await informed(env).run_window(SCOPE, "s1", [turn("m1", "I like cheese pizza")])
    assert "Bo likes" not in user_prompt(env) and "KNOWN MEMORIES (already stored; do not extract these again, link to them):\n(none)" in user_prompt(env)
