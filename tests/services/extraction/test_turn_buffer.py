"""The extractor's scheduling (:mod:`memstream.services.extraction.turn_buffer`), pure: the trigger
rules, the windows a job takes, the turns kept after a failure, and the offsets that
are safe to commit."""

from __future__ import annotations

from typing import Any

from tests.services.extraction.test_extractor import turn

from memstream.domain.log import LogPosition
from memstream.services.extraction.run import ExtractionOutcome
from memstream.services.extraction.turn_buffer import TurnBuffer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def at(offset: int, partition: int = 0) -> LogPosition:
    return LogPosition(topic="msgs", partition=partition, offset=offset)


def outcome_for(job: Any, ok: bool) -> ExtractionOutcome:
    ids = tuple(m.message_id for m in job.turns)
    if ok:
        return ExtractionOutcome("extracted", "llm", consumed=ids)
    return ExtractionOutcome("failed", "llm", kept=ids, failure="down")


def test_buffer_triggers_on_enough_turns_or_idle() -> None:
    clock = Clock()
    buf = TurnBuffer(min_new=3, idle_seconds=10, max_new=4, max_background=2, clock=clock)
    buf.add(turn("a1", "x"), at(0))
    buf.add(turn("a2", "x"), at(1))
    buf.add(turn("b1", "x", session="s2"), at(2))
    assert buf.due() == []
    buf.add(turn("a3", "x"), at(3))
    (job,) = buf.due()
    assert job.trigger == "turns" and [m.message_id for m in job.turns] == ["a1", "a2", "a3"]
    assert buf.due() == []  # one job per session at a time
    buf.complete(job, outcome_for(job, ok=True))
    clock.now += 10
    (idle,) = buf.due()
    assert idle.trigger == "idle" and [m.message_id for m in idle.turns] == ["b1"]


def test_buffer_takes_at_most_max_new_and_passes_background() -> None:
    clock = Clock()
    buf = TurnBuffer(min_new=2, idle_seconds=10, max_new=3, max_background=2, clock=clock)
    for i in range(5):
        buf.add(turn(f"a{i}", "x"), at(i))
    (job,) = buf.due()
    assert [m.message_id for m in job.turns] == ["a0", "a1", "a2"] and job.background == ()
    buf.complete(job, outcome_for(job, ok=True))
    (job,) = buf.due()
    assert [m.message_id for m in job.turns] == ["a3", "a4"]
    assert [m.message_id for m in job.background] == ["a1", "a2"]


def test_buffer_batches_sessions_up_to_max_turns() -> None:
    clock = Clock()
    buf = TurnBuffer(min_new=1, idle_seconds=10, max_new=3, max_background=0, clock=clock)
    for i, session in enumerate(["s1", "s1", "s1", "s1", "s2", "s2", "s3"]):
        buf.add(turn(f"{session}-{i}", "x", session=session), at(i))
        clock.now += 1
    first = buf.due(max_turns=4)
    # the longest-waiting sessions first, until the jobs hold max_turns new turns
    assert [[m.message_id for m in j.turns] for j in first] == [["s1-0", "s1-1", "s1-2"], ["s2-4", "s2-5"]]
    (rest,) = buf.due(max_turns=4)
    assert [m.message_id for m in rest.turns] == ["s3-6"]
    assert buf.due(max_turns=4) == [] and buf.due(flush=True, max_turns=1) == []  # all in flight


def test_buffer_keeps_failed_turns_backs_off_and_never_commits_past_them() -> None:
    clock = Clock()
    buf = TurnBuffer(min_new=2, idle_seconds=5, max_new=10, max_background=0, clock=clock, backoff=lambda n: 30.0 * n)
    s1 = TurnBuffer.key_of(turn("a1", "x"))
    other = TurnBuffer.key_of(turn("z1", "x", session="other"))
    buf.add(turn("a1", "x"), at(10))
    buf.add(turn("a2", "x"), at(11))
    buf.observe(at(12))  # a record that is not a turn
    buf.add(turn("z1", "x", session="other"), at(5, partition=1))
    assert buf.safe_offsets() == {("msgs", 0): 10, ("msgs", 1): 5}
    (job,) = buf.due()
    assert job.key == s1
    buf.complete(job, outcome_for(job, ok=False))
    assert buf.failing_sessions() == {s1: (1, "down")}
    assert buf.safe_offsets() == {("msgs", 0): 10, ("msgs", 1): 5}
    clock.now += 29
    buf.add(turn("a3", "x"), at(13))
    assert [j.key for j in buf.due()] == [other]  # s1 is still backing off; "other" went idle
    clock.now += 2
    (retry,) = buf.due()
    assert retry.key == s1 and [m.message_id for m in retry.turns] == ["a1", "a2", "a3"]
    buf.complete(retry, outcome_for(retry, ok=True))
    assert buf.failing_sessions() == {}
    assert buf.safe_offsets() == {("msgs", 0): 14, ("msgs", 1): 5}


def test_buffer_ignores_a_turn_sent_twice_and_forgets_revoked_partitions() -> None:
    clock = Clock()
    buf = TurnBuffer(min_new=5, idle_seconds=5, max_new=10, max_background=3, clock=clock)
    assert buf.add(turn("a1", "x"), at(0))
    assert not buf.add(turn("a1", "x"), at(1))  # producer retry
    (job,) = buf.due(flush=True)
    buf.complete(job, outcome_for(job, ok=True))
    assert not buf.add(turn("a1", "x"), at(2))  # already extracted
    assert buf.add(turn("a2", "x"), at(3))
    (job,) = buf.due(flush=True)
    assert buf.drop_partitions([("msgs", 0)]) == 1
    buf.complete(job, outcome_for(job, ok=True))  # stale: ignored
    assert buf.pending_count == 0 and buf.safe_offsets() == {}
    assert buf.add(turn("a2", "x"), at(3))  # re-read after the rebalance


def test_a_forgotten_subject_leaves_the_buffer_and_its_stale_job_completes_into_nothing() -> None:
    clock = Clock()
    buf = TurnBuffer(min_new=1, idle_seconds=10, max_new=4, max_background=2, clock=clock)
    buf.add(turn("a1", "x"), at(0), kid=b"k1" * 8)
    (stale,) = buf.due()
    assert stale.source_kids == {b"k1" * 8}
    buf.add(turn("a2", "x"), at(1), kid=b"k1" * 8)  # pending behind the job in flight
    assert buf.drop_subject("acme", "ana") == 2  # the one in flight too
    assert buf.pending_count == 0 and buf.safe_offsets() == {("msgs", 0): 2}
    # the subject writes again (a new life, a new key): the old job must not touch it
    buf.add(turn("a3", "y"), at(2), kid=b"k2" * 8)
    buf.complete(stale, outcome_for(stale, ok=True))
    (fresh,) = buf.due()
    assert [m.message_id for m in fresh.turns] == ["a3"] and fresh.source_kids == {b"k2" * 8}
    assert fresh.background == ()  # nothing of the forgotten life as context either
