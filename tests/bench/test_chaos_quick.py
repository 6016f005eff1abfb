"""A short fault-injection run (``memstream bench chaos`` in miniature) on a private
broker: worker SIGKILLs, a broker restart with its data kept, malformed records of
every kind, a scripted LLM that fails 30 % of its calls, several tenants.

It proves the promises the full benchmark measures at scale: every acknowledged event
is in the log exactly once, every bad record is dead-lettered with a reason, the live
projection equals a replay of the log, no qualifying turn is lost and no search ever
crosses a tenant. The broker is the project's own (``memstream broker``) on two free
ports, so the shared development or CI broker is never restarted.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from memstream.bench.chaos import BAD_KINDS, ChaosPlan, FlakyLLM, make_bad_records, run_plan
from memstream.streams.topics import Topics

pytestmark = pytest.mark.timeout(900)


def test_bad_records_cover_every_kind_and_never_decode() -> None:
    from memstream.streams.dead_letters.publisher import DeadLetter
    from memstream.streams.records.codec import read_record

    topics = Topics(prefix="x.")
    records = make_bad_records(70, random.Random(1), topics, tenants=3)
    assert {r.kind for r in records} == set(BAD_KINDS)
    assert {r.topic for r in records} == {topics.messages, topics.events}
    for i, r in enumerate(records):
        verdict = read_record(None, r.topic, 0, i, r.key, r.value, list(r.headers), trusted=lambda v, h: False)
        assert isinstance(verdict, DeadLetter), r.kind
        assert verdict.reason.strip()


def test_flaky_llm_fails_at_its_rate_and_answers_every_turn_otherwise() -> None:
    llm = FlakyLLM(0.3, seed=3, timeout_s=1.0)
    prompt = (
        "BACKGROUND TURNS (context only, already processed):\n(none)\n\n"
        "NEW TURNS (extract memories from these):\n"
        "[t1] 2025-01-06 09:00 UTC (Monday) | user Ana: I planned the trip.\n"
        "[t2] 2025-01-06 09:01 UTC (Monday) | user Ben: I booked the train.\n\n"
        "Return the JSON object now."
    )
    replies = [llm({"messages": [{"role": "user", "content": prompt}]}) for _ in range(400)]
    failed = [r for r in replies if r.status != 200 or r.raw is not None or r.drop or r.delay > 1.0
              or not (r.content or "").startswith("{")]
    assert 0.2 < len(failed) / len(replies) < 0.4
    assert set(llm.failures) == set(FlakyLLM.FAILURES)
    ok = next(r for r in replies if r not in failed)
    assert '"source_ids": ["t1"]' in (ok.content or "") and '"source_ids": ["t2"]' in (ok.content or "")


def test_short_chaos_run_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Sealed, as the product runs by default: the log is verified through its keys.
    monkeypatch.setenv("MEMSTREAM_SECURITY_SEALING", "true")
    plan = ChaosPlan(
        events=1_500,
        worker_kills=3,
        broker_restarts=1,
        bad_inputs=140,
        tenants=5,
        searches=200,
        produce_seconds=40.0,
        settle_timeout_s=300.0,
        seed=11,
    )
    result = run_plan(plan, workdir=tmp_path / "chaos")

    assert result["worker_kills"] == 3 and result["broker_restarts"] == 1
    assert result["acked"] == 1_500 and result["in_log"] == 1_500
    assert result["lost"] == 0 and result["duplicated"] == 0
    # forged forget orders (one per data key) join the bad inputs: dead-lettered too
    assert result["forged_forgets"] > 0 and result["bad_inputs"] == 140 + result["forged_forgets"]
    assert result["dead_lettered"] == result["bad_inputs"]
    # forged tombstones and a bogus key record: ignored, every subject keeps its keys
    assert result["subjects_keyed_after_forgery"] == result["subjects_keyed"] > 0
    assert result["valid_dead_lettered"] == 0, result["valid_dead_letter_reasons"]
    assert result["valid_not_projected"] == 0
    assert result["projection_matches_replay"] is True, result["replay_differences"]
    assert result["llm_failures"] > 0
    assert result["turns"] > 0 and result["turns_lost"] == 0
    assert result["turns_extracted"] + result["turns_pending"] == result["turns"]
    assert result["searches"] == 200 and result["search_results"] > 0
    assert result["cross_tenant_results"] == 0
    assert result["cross_agent_results"] == 0 and result["agents_per_tenant"] >= 2
