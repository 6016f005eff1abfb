"""Windows the model cannot take, and restarts: on the real broker and real LanceDB, with
the scripted OpenAI-compatible endpoint behind the real ``openai`` client.

* a failure no retry can fix (a 4xx refusal, a context-length error, an unparsable
  answer) stores the window's turns by the heuristic at once, marked as a fallback;
  retryable failures do on the window's last attempt or when its budget runs out;
* the :class:`TurnBuffer` bounds a window's attempts and the time it holds its
  partition's commit;
* the runner commits past a window the model always refuses, other sessions flow;
* ``memstream extract --retry-failed`` redoes fallback windows ADD-only, linking;
* a restarted extractor builds the windows an uninterrupted one builds: turns after
  the commit that were extracted already are background (the commit's resume mark),
  and earlier background turns come from the ``messages`` projection.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from tests.fakes.openai_server import FakeOpenAI, Reply, fake_llm  # noqa: F401 - the fixture
from tests.services.extraction.test_extractor import (  # noqa: F401 - env is a fixture
    SCOPE,
    Env,
    added,
    committed,
    env,
    linked,
    mem,
    produce_turns,
    read_topic,
    responder,
    scenes,
    turn,
)
from tests.support import wait_until

from memstream.domain.events import LinkRelation
from memstream.metrics import EXTRACTION_FALLBACKS
from memstream.projections.projector.projector import Projector
from memstream.services.extraction.run import WindowInput
from memstream.services.extraction.extractor import Extractor
from memstream.services.extraction.turn_buffer import TurnBuffer
from memstream.services.extraction.service import ExtractorRunner

pytestmark = [pytest.mark.kafka]

TURNS = [turn("m1", "I love green tea"), turn("m2", "/clear"), turn("m3", "I live in Porto", minutes=1)]


def fallbacks(reason: str) -> float:
    return EXTRACTION_FALLBACKS.labels(reason=reason)._value.get()


@pytest.mark.parametrize(
    ("replies", "reason"),
    [
        ([Reply(status=400, error_message="flagged by the content policy")], "refused"),
        ([Reply(status=400, error_message="This model's maximum context length is 8192 tokens")], "context_length"),
        ([Reply(content="I cannot help with that."), Reply(content="no json at all")], "unparseable"),
        ([Reply(json_value={"answer": "nothing"}), Reply(json_value=["not", "memories"])], "unparseable"),
    ],
    ids=["policy_400", "context_length", "prose", "wrong_shape"],
)
async def test_a_failure_no_retry_can_fix_stores_the_turns_by_the_fallback_at_once(
    env: Env, replies: list[Reply], reason: str
) -> None:
    if replies[0].status == 400:  # every output mode is refused in turn
        env.fake.chat.responder = lambda body: replies[0]
    else:
        env.fake.chat.push(*replies)
    before = fallbacks(reason)
    outcome = await env.extractor().run_window(SCOPE, "s1", TURNS, [turn("m0", "my name is Ana", minutes=-5)])
    assert outcome.status == "extracted" and outcome.fallback == reason
    assert outcome.consumed == ("m1", "m2", "m3") and outcome.kept == ()
    assert fallbacks(reason) == before + 1
    assert all("NEW TURNS" in r["messages"][1]["content"] for r in env.fake.chat.requests)  # no judgment
    events = await env.project()
    memories = added(events)
    assert sorted((m.content, m.source_message_ids) for m in memories) == [
        ("Ana: I live in Porto", ("m3",)),
        ("Ana: I love green tea", ("m1",)),
    ]
    for m in memories:
        p = m.provenance
        assert p is not None and (p.method, p.status) == ("heuristic", "fallback")
        assert p.input_refs == m.source_message_ids and p.output_refs == (m.memory_id,)
        (entry,) = [d for d in p.decisions if "fallback" in d]
        assert entry["fallback"] == reason and entry["run"] == outcome.correlation_id
        assert entry["window"] == ["m1", "m2", "m3"] and entry["background"] == ["m0"]
        assert entry["error"]
    row = env.store.get_memory(SCOPE, memories[0].memory_id)
    assert row is not None and row["provenance"]["status"] == "fallback"


async def test_retryable_failures_fall_back_only_on_the_last_attempt(env: Env) -> None:
    extractor = env.extractor()
    env.fake.chat.push(Reply(status=500), Reply(status=503))
    (first,) = await extractor.run_windows([WindowInput(SCOPE, "s1", TURNS, attempt=1)])
    assert first.status == "failed" and first.kept == ("m1", "m2", "m3") and first.fallback is None
    env.fake.chat.push(Reply(status=500), Reply(status=503))
    (last,) = await extractor.run_windows([WindowInput(SCOPE, "s1", TURNS, attempt=5, final=True)])
    assert last.status == "extracted" and last.fallback == "attempts"
    assert {m.source_message_ids for m in last.memories} == {("m1",), ("m3",)}
    (entry,) = [d for d in last.memories[0].provenance.decisions if "fallback" in d]  # type: ignore[union-attr]
    assert entry["attempts"] == 5 and "500" in entry["error"]


async def test_the_retry_budget_cuts_a_hanging_call_short(env: Env) -> None:
    env.fake.chat.push(Reply(delay=5.0), Reply(delay=5.0))
    (outcome,) = await env.extractor().run_windows([WindowInput(SCOPE, "s1", TURNS, budget_s=0.2)])
    assert outcome.status == "extracted" and outcome.fallback == "budget"
    env.fake.chat.push(Reply(status=500))
    (spent,) = await env.extractor().run_windows([WindowInput(SCOPE, "s1", TURNS, budget_s=0.0, final=True)])
    assert spent.fallback == "budget" and spent.llm_calls == 0


async def test_a_window_declared_empty_although_it_states_facts_is_flagged_and_falls_back(env: Env) -> None:
    env.fake.chat.push_json({"scenes": []})
    before = fallbacks("declared_empty")
    (outcome,) = await env.extractor().run_windows([WindowInput(SCOPE, "s1", TURNS)])
    assert outcome.status == "extracted" and outcome.fallback == "declared_empty"
    assert fallbacks("declared_empty") == before + 1
    issues = {item.get("issue") for item in outcome.record}
    assert {"nothing_to_remember", "declared_empty_with_facts"} <= issues
    assert {m.source_message_ids for m in outcome.memories} == {("m1",), ("m3",)}
    assert all(m.provenance is not None and m.provenance.status == "fallback" for m in outcome.memories)


async def test_with_the_fallback_off_a_declared_empty_window_is_only_counted(env: Env) -> None:
    env.fake.chat.push_json({"scenes": []})
    trusting = Extractor(
        env.settings.model_copy(update={"extract_declared_empty_fallback": False}),
        env.llm, env.embedder, env.store, env.producer,
    )
    (outcome,) = await trusting.run_windows([WindowInput(SCOPE, "s1", TURNS)])
    assert outcome.fallback is None and outcome.memories == ()
    assert outcome.consumed == ("m1", "m2", "m3")
    assert "declared_empty_with_facts" in {item.get("issue") for item in outcome.record}


async def test_small_talk_declared_empty_is_not_flagged(env: Env) -> None:
    env.fake.chat.push_json({"scenes": []})
    chat = [turn("m1", "hello there!"), turn("m2", "how are you today?", minutes=1)]
    (outcome,) = await env.extractor().run_windows([WindowInput(SCOPE, "s1", chat)])
    assert outcome.fallback is None and outcome.memories == ()
    assert "declared_empty_with_facts" not in {item.get("issue") for item in outcome.record}


# --- the buffer ---------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_buffer_makes_the_last_allowed_attempt_final() -> None:
    clock = Clock()
    buf = TurnBuffer(
        min_new=1, idle_seconds=1, max_new=5, max_background=0, clock=clock,
        backoff=lambda n: 1.0, max_attempts=3, retry_budget_s=100.0,
    )
    buf.add(turn("a1", "x"), _at(0))
    attempts = []
    for _ in range(3):
        (job,) = buf.due()
        attempts.append((job.attempt, job.final))
        buf.complete(job, _failed(job))
        clock.now += 1.0
    assert attempts == [(1, False), (2, False), (3, True)]


def test_the_buffer_never_waits_past_the_retry_budget() -> None:
    clock = Clock()
    buf = TurnBuffer(
        min_new=1, idle_seconds=1, max_new=5, max_background=0, clock=clock,
        backoff=lambda n: 1_000.0, max_attempts=10, retry_budget_s=120.0,
    )
    buf.add(turn("a1", "x"), _at(0))
    (job,) = buf.due()
    assert (job.attempt, job.final, job.budget_s) == (1, False, 120.0)
    clock.now += 30.0
    buf.complete(job, _failed(job))
    clock.now += 89.0
    assert buf.due() == []  # backing off ...
    clock.now += 1.0
    (last,) = buf.due()  # ... but never past the budget, which is then spent
    assert (last.attempt, last.final, last.budget_s) == (2, True, 0.0)
    buf.complete(last, _done(last))
    buf.add(turn("a2", "x"), _at(1))
    (fresh,) = buf.due()  # the next window has a budget of its own
    assert (fresh.attempt, fresh.final, fresh.budget_s) == (1, False, 120.0)


def _at(offset: int) -> Any:
    from memstream.domain.log import LogPosition

    return LogPosition(topic="msgs", partition=0, offset=offset)


def _failed(job: Any) -> Any:
    from memstream.services.extraction.run import ExtractionOutcome

    return ExtractionOutcome("failed", "llm", kept=tuple(m.message_id for m in job.turns), failure="down")


def _done(job: Any) -> Any:
    from memstream.services.extraction.run import ExtractionOutcome

    return ExtractionOutcome("extracted", "llm", consumed=tuple(m.message_id for m in job.turns))


# --- the runner ---------------------------------------------------------------------------------


def refusing(body: dict[str, Any]) -> Reply:
    """The scripted model, refusing every window that holds a turn about poison."""
    if "poison" in body["messages"][1]["content"] and "NEW TURNS" in body["messages"][1]["content"]:
        return Reply(status=400, error_message="flagged by the content policy")
    return responder(body)


async def test_a_window_the_model_always_refuses_never_stalls_its_partition(env: Env) -> None:
    env.fake.chat.responder = refusing
    runner = ExtractorRunner(env.settings, env.topics, llm=env.llm, embedder=env.embedder, store=env.store, producer=env.producer)
    await runner.start()
    try:
        turns = [
            turn("p1", "how to make poison ivy ointment", session="bad"),
            turn("p2", "the poison ivy rash is spreading", session="bad", minutes=1),
            turn("p3", "more about the rash on my arm", session="bad", minutes=2),
            turn("g1", "I adopted a dog called Rex", session="good"),
            turn("g2", "I work as a nurse in Leeds", session="good", minutes=1),
            turn("g3", "my sister lives in Oslo", session="good", minutes=2),
        ]
        await produce_turns(env, turns)
        await wait_until(lambda: runner.stats.memories_added == 6, what="every turn stored")
        assert runner.stats.extractions_failed == 0
        assert dict(runner.stats.fallbacks) == {"refused": 1} and runner.stats.fallback_turns == 3
        await wait_until(lambda: sum(runner.committed().values()) == 6, what="the commit past the refused window")
    finally:
        await runner.stop()
    assert sum((await committed(env.settings, env.topics.messages)).values()) == 6
    memories = added(await env.project())
    bad = [m for m in memories if m.session_id == "bad"]
    assert sorted(m.source_message_ids for m in bad) == [("p1",), ("p2",), ("p3",)]
    assert {m.provenance.status for m in bad} == {"fallback"}  # type: ignore[union-attr]
    assert {m.provenance.status for m in memories if m.session_id == "good"} == {"ok"}  # type: ignore[union-attr]


async def test_retry_failed_redoes_fallback_windows_add_only_and_links_them(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from memstream.cli import app
    from memstream.settings.model import get_settings, settings_env

    turns = [turn("m1", "I love green tea"), turn("m2", "I live in Porto", minutes=1)]
    await produce_turns(env, turns)  # the L0 turns, projected below
    env.fake.chat.responder = lambda body: Reply(status=400, error_message="flagged by the content policy")
    outcome = await env.extractor().run_window(SCOPE, "s1", turns)
    assert outcome.fallback == "refused"
    fallback_ids = {m.memory_id for m in outcome.memories}
    await env.project()
    messages = await read_topic(env.settings, env.topics.messages)
    await asyncio.to_thread(Projector(env.store, env.embedder).apply, messages)

    for key, value in settings_env(env.settings).items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    env.fake.chat.responder = responder
    cli = CliRunner()
    try:
        result = await asyncio.to_thread(cli.invoke, app, ["extract", "--retry-failed", "--since", "1h"])
        assert result.exit_code == 0, result.output
        assert "1 fallback window(s): 1 redone, 2 memories" in result.output
        events = await env.project()
        new = added(events)
        assert sorted(m.content for m in new) == ["Ana said: I live in Porto", "Ana said: I love green tea"]
        for m in new:
            assert m.provenance is not None and m.provenance.method == "llm"
            assert {"retry_of": outcome.correlation_id} in [dict(d) for d in m.provenance.decisions]
        links = [link for link in linked(events) if link.relation is LinkRelation.supersedes]
        assert {link.to_memory_id for link in links} == fallback_ids
        assert {link.from_memory_id for link in links} == {m.memory_id for m in new}
        for memory_id in fallback_ids:
            row = env.store.get_memory(SCOPE, memory_id)
            assert row is not None and row["superseded_by"] in {m.memory_id for m in new}

        again = await asyncio.to_thread(cli.invoke, app, ["extract", "--retry-failed"])
        assert again.exit_code == 0 and "no fallback window to retry" in again.output
        bad = await asyncio.to_thread(cli.invoke, app, ["extract", "--retry-failed", "--since", "yesterday"])
        assert bad.exit_code != 0 and "--since 'yesterday' is neither" in str(bad.exception)
    finally:
        get_settings.cache_clear()


# --- restarts -----------------------------------------------------------------------------------

_LINE = re.compile(r"^\[t\d+\] [^|]*\| \w+(?: [^:]*)?: (.*)$", re.MULTILINE)


def windows_seen(fake: FakeOpenAI) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(background, new) turn texts of every extraction call the model received."""
    out = []
    for body in fake.chat.requests:
        user = body["messages"][1]["content"]
        if "NEW TURNS" not in user:
            continue
        background, new = user.split("NEW TURNS", 1)
        out.append((tuple(_LINE.findall(background)), tuple(_LINE.findall(new))))
    return out


async def project_messages(env: Env) -> None:
    messages = await read_topic(env.settings, env.topics.messages)
    result = await asyncio.to_thread(Projector(env.store, env.embedder).apply, messages)
    assert not result.failed


def runner_for(env: Env, **overrides: Any) -> ExtractorRunner:
    settings = env.settings.model_copy(update={"extract_background_turns": 2, "extract_max_new_turns": 3, **overrides})
    return ExtractorRunner(settings, env.topics, llm=env.llm, embedder=env.embedder, store=env.store, producer=env.producer)


def said(i: int) -> str:
    return f"fact number {i} about the garden"


async def test_after_a_restart_earlier_background_turns_come_from_the_projection(env: Env) -> None:
    env.fake.chat.responder = responder
    first = runner_for(env)
    await first.start()
    try:
        await produce_turns(env, [turn(f"m{i}", said(i), minutes=i) for i in range(1, 4)])
        await wait_until(lambda: first.stats.memories_added == 3, what="the first window")
    finally:
        await first.stop()
    await project_messages(env)  # the worker's projector, caught up
    second = runner_for(env)
    await second.start()
    try:
        await produce_turns(env, [turn(f"m{i}", said(i), minutes=i) for i in range(4, 7)])
        await wait_until(lambda: second.stats.memories_added == 3, what="the window after the restart")
    finally:
        await second.stop()
    assert windows_seen(env.fake) == [
        ((), (said(1), said(2), said(3))),
        ((said(2), said(3)), (said(4), said(5), said(6))),  # as without the restart
    ]


async def test_turns_extracted_after_the_commit_are_not_extracted_again_after_a_restart(env: Env) -> None:
    env.fake.chat.responder = responder
    # "slow" has two turns and waits (no idle trigger): it holds the partition's commit
    # while "fast" has two windows extracted after it
    first = runner_for(env, extract_idle_seconds=600.0)
    await first.start()
    try:
        await produce_turns(
            env,
            [turn("w1", "waiting turn one", session="slow"), turn("w2", "waiting turn two", session="slow")]
            + [turn(f"m{i}", said(i), minutes=i) for i in range(1, 8)],
        )
        await wait_until(lambda: first.stats.memories_added == 6, what="two windows of the fast session")
    finally:
        await first.stop()
    assert sum((await committed(env.settings, env.topics.messages)).values()) == 0  # pinned by "slow"
    await project_messages(env)
    second = runner_for(env)
    await second.start()
    try:
        await produce_turns(env, [turn(f"m{i}", said(i), minutes=i) for i in range(8, 10)])
        await wait_until(lambda: second.stats.memories_added == 5, what="the rest after the restart")
        await wait_until(lambda: sum(second.committed().values()) == 11, what="the commit of every turn")
    finally:
        await second.stop()
    seen = windows_seen(env.fake)
    assert sorted(seen) == sorted(
        [
            ((), (said(1), said(2), said(3))),
            ((said(2), said(3)), (said(4), said(5), said(6))),
            ((said(5), said(6)), (said(7), said(8), said(9))),  # m1-m6 were not extracted again
            ((), ("waiting turn one", "waiting turn two")),
        ]
    )
