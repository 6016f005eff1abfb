"""The retry budget bounds a partition's standstill, and survives restarts.

* a window that holds back its partition's commit spends its budget while it waits
  for an extraction slot, and falls back (reason ``budget``, no model call) once it is
  spent, without waiting for the slot: a stalled window on one slot never holds
  another partition's turns back longer than the budget;
* a window queued behind others of its own partition does not spend its budget (the
  commit moves meanwhile);
* a window's failed attempts and the start of its budget ride on the commit's resume
  mark, so a restarted runner goes on with them instead of starting afresh.

The runner tests use the real broker, real LanceDB and the scripted OpenAI-compatible
server behind the real ``openai`` client.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from tests.fakes.openai_server import Reply, fake_llm  # noqa: F401 - the fixture
from tests.services.extraction.test_extractor import (  # noqa: F401 - env is a fixture
    SCOPE,
    Env,
    committed,
    env,
    produce_turns,
    responder,
    turn,
)
from tests.support import wait_until

from memstream.codec.wire import record_key
from memstream.domain.events import MessageObserved, Scope
from memstream.domain.log import LogPosition
from memstream.domain.extraction.resume_marks import decode_mark
from memstream.llm.client import LLMClient
from memstream.services.extraction.run import ExtractionOutcome
from memstream.services.extraction.service import ExtractorRunner
from memstream.services.extraction.turn_buffer import TurnBuffer, WindowJob
from memstream.streams.rerouting import home_partition


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _at(offset: int, partition: int = 0) -> LogPosition:
    return LogPosition(topic="msgs", partition=partition, offset=offset)


def _done(job: WindowJob) -> ExtractionOutcome:
    return ExtractionOutcome("extracted", "llm", consumed=tuple(m.message_id for m in job.turns))


def _failed(job: WindowJob) -> ExtractionOutcome:
    return ExtractionOutcome("failed", "llm", kept=tuple(m.message_id for m in job.turns), failure="down")


def _buffer(clock: Clock, wall: Clock | None = None, **overrides: Any) -> TurnBuffer:
    kwargs: dict[str, Any] = dict(
        min_new=1, idle_seconds=1, max_new=5, max_background=0, clock=clock,
        backoff=lambda n: 1_000.0, max_attempts=5, retry_budget_s=100.0,
    )
    kwargs.update(overrides)
    return TurnBuffer(**kwargs, wall=wall or Clock(1_700_000_000.0))


# --- the buffer ---------------------------------------------------------------------------------


def test_a_window_holding_its_partitions_commit_spends_its_budget_waiting_for_a_slot() -> None:
    clock = Clock()
    buf = _buffer(clock)
    buf.add(turn("a1", "x", session="a"), _at(0))  # holds partition 0's commit
    buf.add(turn("b1", "x", session="b"), _at(1))  # queued behind it, same partition
    buf.add(turn("c1", "x", session="c"), _at(0, partition=1))  # holds partition 1's
    assert buf.expired() == []  # ready, and every slot is taken: their budgets start
    clock.now += 99.0
    assert buf.expired() == []
    clock.now += 1.0
    spent = buf.expired()
    assert sorted(j.session_id for j in spent) == ["a", "c"]  # not b: the commit was not its
    assert all((j.final, j.budget_s, j.attempt) == (True, 0.0, 1) for j in spent)
    assert buf.expired() == []  # in flight now
    for job in spent:
        buf.complete(job, _done(job))
    assert buf.expired() == []  # b holds partition 0 now: its budget starts here
    clock.now += 100.0
    (b,) = buf.expired()
    assert (b.session_id, b.final, b.budget_s) == ("b", True, 0.0)


def test_a_window_that_is_not_ready_spends_no_budget() -> None:
    clock = Clock()
    buf = _buffer(clock, min_new=3, idle_seconds=50.0)
    buf.add(turn("a1", "x", session="a"), _at(0))
    clock.now += 40.0
    assert buf.expired() == []  # not ready (neither 3 turns nor 50 s idle)
    clock.now += 10.0
    assert buf.expired() == []  # ready now: the budget starts
    clock.now += 99.0
    assert buf.expired() == []
    (job,) = buf.due()  # a slot: the rest of the budget goes with the job
    assert (job.attempt, job.final, job.budget_s) == (1, False, 1.0)


def test_attempts_and_budget_go_on_after_a_restart_through_the_commit_mark() -> None:
    clock, wall = Clock(), Clock(1_700_000_000.0)
    first = _buffer(clock, wall)
    first.add(turn("a1", "x", session="a"), _at(5))
    (job,) = first.due()
    clock.now += 30.0
    wall.now += 30.0
    first.complete(job, _failed(job))
    text = first.commit_marks({("msgs", 0): 5})[("msgs", 0)]
    mark = decode_mark(5, text)
    assert mark is not None and mark.budgets[5].failures == 1
    assert mark.budgets[5].started_at == pytest.approx(1_700_000_000.0)

    wall.now += 20.0  # down for 20 s; the new process's monotonic clock starts elsewhere
    second = _buffer(Clock(5.0), wall)
    second.resume(("msgs", 0), mark)
    assert decode_mark(5, second.commit_marks({("msgs", 0): 5})[("msgs", 0)]) == mark  # not read yet: kept
    second.add(turn("a1", "x", session="a"), _at(5))
    (again,) = second.due()
    assert (again.attempt, again.final) == (2, False)
    assert again.budget_s == pytest.approx(50.0)  # 100 s from the first attempt, 50 s ago


# --- the runner ---------------------------------------------------------------------------------


def _other_scope(partitions: int) -> Scope:
    """A memory space whose turns go to another partition than ``SCOPE``'s."""
    home = home_partition(record_key(SCOPE), partitions)
    for i in range(100):
        scope = Scope(team_id=SCOPE.team_id, user_id=f"other{i}", agent_id=SCOPE.agent_id)
        if home_partition(record_key(scope), partitions) != home:
            return scope
    raise AssertionError("no space on another partition")


def _in(scope: Scope, message: MessageObserved) -> MessageObserved:
    return message.model_copy(update={"scope": scope})


def _new_turns(body: dict[str, Any]) -> str:
    user = body["messages"][1]["content"]
    return user.split("NEW TURNS", 1)[1] if "NEW TURNS" in user else ""


def _runner(env: Env, llm: LLMClient, outcomes: list[tuple[str | None, ExtractionOutcome]], **overrides: Any) -> ExtractorRunner:
    settings = env.settings.model_copy(update=overrides)
    return ExtractorRunner(
        settings, env.topics, llm=llm, embedder=env.embedder, store=env.store, producer=env.producer,
        on_outcome=lambda job, outcome: outcomes.append((job.session_id, outcome)),
    )


async def test_a_window_queued_behind_a_stalled_one_falls_back_when_its_own_budget_is_spent(env: Env) -> None:
    def model(body: dict[str, Any]) -> Reply:
        new = _new_turns(body)
        if "hanging" in new:
            return Reply(delay=120.0)  # never answers in time: cut by the budget
        if "slow" in new:
            return replace(responder(body), delay=2.0)
        return responder(body)

    env.fake.chat.responder = model
    settings = env.settings.model_copy(update={"llm_timeout_s": 60.0, "extract_retry_budget_s": 4.0})
    llm = LLMClient.from_settings(settings)
    outcomes: list[tuple[str | None, ExtractionOutcome]] = []
    runner = ExtractorRunner(
        settings, env.topics, llm=llm, embedder=env.embedder, store=env.store, producer=env.producer,
        concurrency=1, on_outcome=lambda job, outcome: outcomes.append((job.session_id, outcome)),
    )
    other = _other_scope(settings.broker.partitions)
    await runner.start()
    try:
        # one slot: "first" takes it (a 2 s answer) and holds SCOPE's partition; "stuck",
        # behind it on that partition, takes the slot next and hangs; "queued", alone on
        # another partition, is ready at once but never gets the slot
        await produce_turns(
            env,
            [turn(f"f{i}", f"slow answer number {i}", session="first") for i in range(3)]
            + [turn(f"h{i}", f"hanging question number {i}", session="stuck") for i in range(3)],
        )
        # read before "queued" (partitions are fetched apart): "stuck" is next in line for the slot
        await wait_until(lambda: runner.stats.turns_read == 6, what="first and stuck read")
        await produce_turns(env, [_in(other, turn("q1", "I keep bees on the roof", session="queued"))])
        await wait_until(lambda: len(outcomes) == 3, timeout=60, what="every window finished")
        await wait_until(lambda: sum(runner.committed().values()) == 7, what="the commit past every turn")
    finally:
        await runner.stop()
        await llm.close()
    by_session = {session: outcome for session, outcome in outcomes}
    queued = by_session["queued"]
    assert [s for s, _ in outcomes] == ["first", "queued", "stuck"]  # not behind "stuck"
    assert (queued.status, queued.fallback, queued.llm_calls) == ("extracted", "budget", 0)
    assert queued.consumed == ("q1",) and [m.source_message_ids for m in queued.memories] == [("q1",)]
    assert {m.provenance.status for m in queued.memories} == {"fallback"}  # type: ignore[union-attr]
    assert not any("bees" in _new_turns(body) for body in env.fake.chat.requests)  # never sent
    assert by_session["first"].fallback is None and by_session["stuck"].fallback == "budget"


def _flaky(body: dict[str, Any]) -> Reply:
    if "flaky" in _new_turns(body):
        return Reply(status=503, error_message="the model is overloaded")
    return responder(body)


async def _fail_once_then_stop(env: Env, **overrides: Any) -> None:
    """A runner fails the window once (503s), commits and stops."""
    llm = LLMClient.from_settings(env.settings)
    outcomes: list[tuple[str | None, ExtractionOutcome]] = []
    first = _runner(env, llm, outcomes, **overrides)
    await first.start()
    try:
        await produce_turns(env, [turn(f"k{i}", f"flaky topic number {i}") for i in range(3)])
        await wait_until(lambda: len(outcomes) == 1, what="the first failed attempt")
        assert outcomes[0][1].status == "failed"
    finally:
        await first.stop()  # commits the mark with the window's budget
        await llm.close()
    marks = [decode_mark(0, m) for m in first.commits.marks.values() if m]
    assert [b.failures for mark in marks if mark is not None for b in mark.budgets.values()] == [1]


async def test_a_restarted_runner_goes_on_with_a_failing_windows_attempts(env: Env) -> None:
    env.fake.chat.responder = _flaky
    await _fail_once_then_stop(env, extract_max_attempts=2)
    llm = LLMClient.from_settings(env.settings)
    outcomes: list[tuple[str | None, ExtractionOutcome]] = []
    second = _runner(env, llm, outcomes, extract_max_attempts=2)
    await second.start()
    try:
        await wait_until(lambda: len(outcomes) == 1, what="the window after the restart")
    finally:
        await second.stop()
        await llm.close()
    (outcome,) = [o for _, o in outcomes]
    # attempt 2 of 2, not attempt 1 of a fresh count: the last, so it falls back
    assert (outcome.status, outcome.fallback) == ("extracted", "attempts")
    (entry,) = [r for r in outcome.record if "fallback" in r]
    assert entry["attempts"] == 2
    assert sum((await committed(env.settings, env.topics.messages)).values()) == 3


async def test_a_restarted_runner_does_not_give_a_failing_window_a_fresh_budget(env: Env) -> None:
    env.fake.chat.responder = _flaky
    budget = 3.0
    await _fail_once_then_stop(env, extract_retry_budget_s=budget)
    await asyncio.sleep(budget)  # down until the budget of the first attempt is spent
    llm = LLMClient.from_settings(env.settings)
    outcomes: list[tuple[str | None, ExtractionOutcome]] = []
    second = _runner(env, llm, outcomes, extract_retry_budget_s=budget)
    requests = env.fake.chat.count
    await second.start()
    try:
        await wait_until(lambda: len(outcomes) == 1, what="the window after the restart")
    finally:
        await second.stop()
        await llm.close()
    (outcome,) = [o for _, o in outcomes]
    assert (outcome.status, outcome.fallback, outcome.llm_calls) == ("extracted", "budget", 0)
    assert env.fake.chat.count == requests  # no call: the budget was spent before the restart
