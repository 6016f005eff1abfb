"""Deferred reflection: the state machine, the retry runner, the writers, the price-file
provider, and the Faust reflector on the real broker (including a SIGKILL between
settling and reflecting)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from tests.fakes.openai_server import FakeOpenAI, Reply, fake_llm  # noqa: F401 - fixture

from memstream.domain.events import (
    DecisionExpired,
    DecisionRecorded,
    EventBase,
    MemoryAdded,
    MemoryReflected,
    OutcomeObserved,
    Rating,
    Scope,
    utcnow,
)
from memstream.domain.prompts import PromptLibrary
from memstream.domain.reflection import (
    decision_key,
    expiry_event_id,
    provider_outcome_id,
    reflection_event_id,
    reflection_id_for,
)
from memstream.llm.client import LLMClient, LLMError
from memstream.settings.model import Settings
from memstream.services.reflection import agent as reflector_agent
from memstream.services.app import build_app
from memstream.services.reflection.outcomes import OutcomeProviderError, PriceFileProvider, load_price_file
from memstream.streams.producers.producer import MemstreamProducer
from memstream.services.reflection.reflector import DecisionState, ReflectorCore, ReflectorPolicy, SettledDecision
from memstream.services.reflection.runner import Backoff, ReflectionRunner
from memstream.services.reflection.writers import LLMReflectionWriter, TemplateReflectionWriter
from memstream.services.reflection.agent import ReflectorHandle, register_reflector
from memstream.streams.dead_letters.publisher import is_dead_letter, parse_dead_letter
from memstream.codec.wire import DecodeError, decode_record
from memstream.streams.topics import Topics

T0 = datetime(2024, 3, 4, 21, 0, tzinfo=timezone.utc)
ACME = Scope(team_id="acme", user_id="ana", agent_id="trader")
GLOBEX = Scope(team_id="globex", user_id="ana")


def decision(did: str = "d1", subject: str = "AAPL", *, scope: Scope = ACME, **kw: Any) -> DecisionRecorded:
    fields: dict[str, Any] = {
        "scope": scope,
        "occurred_at": T0,
        "decision_id": did,
        "subject": subject,
        "rating": Rating.buy,
        "decision_text": f"Buy {subject}: the product cycle is turning up.",
        "horizon_days": 5,
        "deadline": T0 + timedelta(days=14),
    }
    fields.update(kw)
    return DecisionRecorded(**fields)


def outcome(oid: str = "o1", subject: str = "AAPL", *, scope: Scope = ACME, **kw: Any) -> OutcomeObserved:
    fields: dict[str, Any] = {
        "scope": scope,
        "occurred_at": T0 + timedelta(days=8),
        "outcome_id": oid,
        "decision_id": "d1",
        "subject": subject,
        "raw_return": 0.05,
        "benchmark_return": 0.02,
        "alpha": 0.03,
        "horizon_days": 5,
    }
    fields.update(kw)
    return OutcomeObserved(**fields)


def new_core(**policy: Any) -> ReflectorCore:
    return ReflectorCore({}, {}, {}, policy=ReflectorPolicy(**policy))


# ======================================================================= state machine


def test_decision_then_covering_outcome_settles_once() -> None:
    core = new_core()
    assert core.on_decision(decision(), 0, T0) == []
    assert core.pending(0)[0].decision_id == "d1"
    settled = core.on_outcome(outcome(), 0, T0)
    assert [s.decision.decision_id for s in settled] == ["d1"]
    assert core.state(decision_key(ACME, "d1")) is DecisionState.settled
    assert core.on_outcome(outcome(), 0, T0) == []  # the same outcome again
    assert core.on_outcome(outcome("o2"), 0, T0) == []  # another one: already settled
    assert [s.outcome.outcome_id for s in core.settled(0)] == ["o1"]
    assert core.settled(1) == []  # another partition's tick sees nothing


def test_duplicate_decision_is_one_decision() -> None:
    core = new_core()
    core.on_decision(decision(), 0, T0)
    changed = decision(decision_text="A different text for the same id.")
    assert core.on_decision(changed, 0, T0) == []
    assert core.counts()["pending"] == 1
    assert core.pending()[0].decision_text.startswith("Buy AAPL")


def test_outcome_before_decision_is_kept_and_applied() -> None:
    core = new_core()
    assert core.on_outcome(outcome(), 0, T0) == []
    assert core.counts()["early_outcomes"] == 1
    settled = core.on_decision(decision(), 0, T0)
    assert [s.outcome.outcome_id for s in settled] == ["o1"]
    assert core.counts()["early_outcomes"] == 0  # an outcome naming its decision is used up


def test_partial_horizon_outcome_does_not_settle() -> None:
    core = new_core()
    core.on_decision(decision(horizon_days=5), 0, T0)
    assert core.on_outcome(outcome("o-short", horizon_days=1), 0, T0) == []
    assert core.state(decision_key(ACME, "d1")) is DecisionState.pending
    assert [s.outcome.outcome_id for s in core.on_outcome(outcome("o-full"), 0, T0)] == ["o-full"]


def test_subject_wide_outcome_settles_every_pending_decision_of_its_agent() -> None:
    core = new_core()
    other_agent = Scope(team_id="acme", user_id="ana", agent_id="other")
    core.on_decision(decision("d1"), 0, T0)
    core.on_decision(decision("d0"), 0, T0)
    core.on_decision(decision("d2", scope=other_agent), 0, T0)
    core.on_decision(decision("d3", scope=GLOBEX), 1, T0)
    core.on_decision(decision("d4", "MSFT"), 2, T0)
    wide = outcome("o-wide", decision_id=None)
    settled = core.on_outcome(wide, 0, T0)
    assert sorted(s.decision.decision_id for s in settled) == ["d0", "d1"]
    assert core.state(decision_key(other_agent, "d2")) is DecisionState.pending
    assert core.state(decision_key(GLOBEX, "d3")) is DecisionState.pending
    assert core.state(decision_key(ACME, "d4")) is DecisionState.pending
    # kept for a later decision of the subject, and a duplicate changes nothing
    assert core.on_outcome(wide, 0, T0) == []
    late = core.on_decision(decision("d5", occurred_at=T0 - timedelta(hours=1)), 0, T0)
    assert [s.outcome.outcome_id for s in late] == ["o-wide"]


def test_reflection_is_accepted_once_and_only_for_its_outcome() -> None:
    core = new_core()
    core.on_decision(decision(), 0, T0)
    (settled,) = core.on_outcome(outcome(), 0, T0)
    reflection = asyncio.run(TemplateReflectionWriter().write(settled, T0))
    wrong_outcome = reflection.model_copy(update={"outcome_id": "o-other"})
    assert not core.accept_reflection(wrong_outcome)
    assert core.accept_reflection(reflection)
    core.mark_reflected(reflection, T0)
    assert core.state(decision_key(ACME, "d1")) is DecisionState.reflected
    assert not core.accept_reflection(reflection)  # never twice
    assert core.on_decision(decision(), 0, T0) == []  # a late duplicate is still recognised
    assert core.subjects == {}  # nothing open remains in the subject index


def test_the_first_candidate_is_stored_before_it_is_sent() -> None:
    core = new_core()
    core.on_decision(decision(), 0, T0)
    (settled,) = core.on_outcome(outcome(), 0, T0)
    first = asyncio.run(TemplateReflectionWriter().write(settled, T0))
    second = first.model_copy(update={"content": "Another text for the same decision. Lesson: none."})
    assert core.begin_reflection(first, T0)
    assert core.state(decision_key(ACME, "d1")) is DecisionState.emitting
    assert not core.begin_reflection(second, T0)  # the choice is made
    assert core.settled() == []  # nothing to write any more
    # after a restart this exact event (same bytes, same id) is what gets sent again
    (stored,) = core.emitting(0)
    assert stored == first
    assert core.emitting(0, skip={decision_key(ACME, "d1")}) == []
    core.mark_reflected(first, T0)
    assert core.state(decision_key(ACME, "d1")) is DecisionState.reflected
    assert core.emitting(0) == []


def test_expiry_at_the_deadline_and_never_after_settling() -> None:
    core = new_core()
    core.on_decision(decision("d1", deadline=T0 + timedelta(days=3)), 0, T0)
    core.on_decision(decision("d2", deadline=T0 + timedelta(days=3)), 0, T0)
    core.on_outcome(outcome("o2", decision_id="d2"), 0, T0)
    assert core.due_expiries(0, T0 + timedelta(days=2)) == []
    due = core.due_expiries(0, T0 + timedelta(days=3))
    assert [e.decision_id for e in due] == ["d1"]
    assert due[0].event_id == expiry_event_id(ACME, "d1")
    assert due[0].deadline == T0 + timedelta(days=3)
    core.mark_expired(due[0], T0 + timedelta(days=3))
    assert core.due_expiries(0, T0 + timedelta(days=30)) == []
    assert core.on_outcome(outcome("late"), 0, T0) == []  # an expired decision stays expired
    assert core.state(decision_key(ACME, "d1")) is DecisionState.expired


def test_sweep_drops_only_finished_markers_and_stale_early_outcomes() -> None:
    core = new_core(done_retention=timedelta(days=10), early_outcome_ttl=timedelta(days=5))
    core.on_decision(decision("d1", deadline=T0 + timedelta(days=1)), 0, T0)
    core.on_decision(decision("d2", deadline=T0 + timedelta(days=100)), 0, T0)
    core.on_outcome(outcome("orphan", decision_id="d9"), 0, T0)
    (expired,) = core.due_expiries(0, T0 + timedelta(days=1))
    core.mark_expired(expired, T0 + timedelta(days=1))
    assert core.sweep(0, T0 + timedelta(days=4)) == 0
    assert core.sweep(0, T0 + timedelta(days=12)) == 2
    assert core.state(decision_key(ACME, "d1")) is None
    assert core.state(decision_key(ACME, "d2")) is DecisionState.pending  # pending is never dropped
    assert core.counts()["early_outcomes"] == 0


# ============================================================================ runner


def settled_pair() -> SettledDecision:
    core = new_core()
    core.on_decision(decision(), 0, T0)
    return core.on_outcome(outcome(), 0, T0)[0]


class FlakyWriter:
    method = "template"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def write(self, settled: SettledDecision, now: datetime) -> MemoryReflected:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError(f"LLM down (call {self.calls})")
        return await TemplateReflectionWriter().write(settled, now)


async def test_runner_retries_with_backoff_and_delivers_once() -> None:
    writer = FlakyWriter(failures=2)
    delivered: list[MemoryReflected] = []

    async def deliver(reflection: MemoryReflected, settled: SettledDecision) -> None:
        delivered.append(reflection)

    runner = ReflectionRunner(writer, deliver, backoff=Backoff(initial=0.01, maximum=0.05))
    item = settled_pair()
    try:
        assert runner.submit(item)
        assert not runner.submit(item)  # already in flight
        for _ in range(500):
            if delivered:
                break
            await asyncio.sleep(0.01)
        assert len(delivered) == 1 and writer.calls == 3 and runner.failures == 2
        assert not runner.submit(item)  # delivered, awaiting confirmation
        runner.finished(item.key)
        assert item.key not in runner.in_flight
    finally:
        await runner.stop()


async def test_a_delivered_reflection_never_confirmed_is_written_again_later() -> None:
    """Its partition moved to another worker, say: after ``redeliver_after`` the decision
    may be submitted again (the state machine drops the extra candidate if the first
    one made it after all); before that, and once confirmed, it may not."""
    writer = FlakyWriter(failures=0)
    delivered: list[MemoryReflected] = []

    async def deliver(reflection: MemoryReflected, settled: SettledDecision) -> None:
        delivered.append(reflection)

    async def until(count: int) -> None:
        for _ in range(500):
            if len(delivered) >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{count} deliveries expected, got {len(delivered)}")

    runner = ReflectionRunner(writer, deliver, redeliver_after=0.2)
    item = settled_pair()
    try:
        assert runner.submit(item)
        await until(1)
        assert not runner.submit(item)  # delivered moments ago, not confirmed yet
        await asyncio.sleep(0.3)
        assert runner.submit(item)  # still unconfirmed after redeliver_after: again
        await until(2)
        assert writer.calls == 2 and delivered[0].decision_id == delivered[1].decision_id
        runner.finished(item.key)  # confirmed
        assert item.key not in runner.in_flight
    finally:
        await runner.stop()


def test_backoff_grows_and_is_capped() -> None:
    backoff = Backoff(initial=1.0, factor=2.0, maximum=10.0, jitter=0.0)
    assert [backoff.delay(n) for n in (1, 2, 3, 4, 5, 6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


# =========================================================================== writers


async def test_template_writer_marks_the_reflection_as_templated() -> None:
    reflection = await TemplateReflectionWriter().write(settled_pair(), T0)
    assert reflection.templated is True
    assert reflection.provenance is not None and reflection.provenance.method == "template"
    assert reflection.provenance.input_refs == ("decision:d1", "outcome:o1")
    assert reflection.reflection_id == reflection_id_for(ACME, "d1")
    assert reflection.event_id == reflection_event_id(ACME, "d1")
    assert reflection.correct is True and reflection.alpha == pytest.approx(0.03)


async def test_llm_writer_records_prompt_model_and_usage(fake_llm: FakeOpenAI) -> None:  # noqa: F811
    fake_llm.chat.push_json(
        {
            "reflection": "The buy was right: AAPL beat the benchmark by +3.0%. The product-cycle call held.",
            "lesson": "Lesson: trust a turning product cycle when margins confirm it.",
        }
    )
    client = LLMClient(base_url=fake_llm.base_url, api_key=None, model="fake-model", timeout_s=10)
    writer = LLMReflectionWriter(client, retries=0)
    reflection = await writer.write(settled_pair(), T0)
    await client.close()
    prompt = PromptLibrary().get("reflection")
    assert reflection.templated is False
    assert reflection.content.endswith("Lesson: trust a turning product cycle when margins confirm it.")
    assert reflection.lesson == "trust a turning product cycle when margins confirm it."
    prov = reflection.provenance
    assert prov is not None and prov.method == "llm" and prov.model == "fake-model"
    assert (prov.prompt_id, prov.prompt_version, prov.prompt_sha256) == ("reflection", prompt.version, prompt.sha256)
    assert prov.token_usage["total_tokens"] > 0
    (request,) = fake_llm.chat.requests
    user = request["messages"][1]["content"]
    assert "alpha +3.0%" in user and "Buy AAPL: the product cycle" in user
    assert request["response_format"]["type"] == "json_schema"


async def test_llm_writer_raises_when_the_model_cannot_be_reached(fake_llm: FakeOpenAI) -> None:  # noqa: F811
    fake_llm.chat.push_error(500).push_error(503)
    client = LLMClient(base_url=fake_llm.base_url, api_key=None, model="fake-model", timeout_s=10)
    with pytest.raises(LLMError):
        await LLMReflectionWriter(client, retries=1).write(settled_pair(), T0)
    await client.close()
    assert fake_llm.chat.count == 2


async def test_llm_writer_templates_when_the_model_never_answers_usably(fake_llm: FakeOpenAI) -> None:  # noqa: F811
    fake_llm.chat.push_error(500).push_text("Sorry, I cannot help.")
    client = LLMClient(base_url=fake_llm.base_url, api_key=None, model="fake-model", timeout_s=10)
    reflection = await LLMReflectionWriter(client, retries=1).write(settled_pair(), T0)
    await client.close()
    assert fake_llm.chat.count == 2
    assert reflection.templated and reflection.provenance.method == "template"
    assert "fake-model gave no usable reflection (parse after 2 attempt(s)" in (reflection.provenance.note or "")


# =========================================================================== provider


def trading_days(start: date, n: int) -> list[date]:
    days, d = [], start
    while len(days) < n:
        if d.weekday() < 5:
            days.append(d)
        d += timedelta(days=1)
    return days


def write_prices(path: Path, closes: dict[str, list[float]], start: date) -> list[date]:
    days = trading_days(start, max(len(v) for v in closes.values()))
    rows = [(d.isoformat(), sym, c) for sym, series in closes.items() for d, c in zip(days, series)]
    if path.suffix == ".parquet":
        table = pa.table({"date": [date.fromisoformat(r[0]) for r in rows], "symbol": [r[1] for r in rows], "close": [r[2] for r in rows]})
        pq.write_table(table, path)
    else:
        tmp = path.with_suffix(".tmp")
        tmp.write_text("date,symbol,close\n" + "".join(f"{d},{s},{c}\n" for d, s, c in rows))
        tmp.replace(path)
    return days


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
async def test_price_file_provider_computes_return_and_alpha(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"prices{suffix}"
    days = write_prices(
        path,
        {"AAPL": [100, 101, 102, 103, 104, 110, 111], "SPY": [400, 401, 402, 403, 404, 408, 409]},
        date(2024, 3, 4),
    )
    provider = PriceFileProvider(path, "SPY")
    d = decision(occurred_at=datetime(2024, 3, 4, 21, 0, tzinfo=timezone.utc), horizon_days=5)
    (found,) = await provider.resolve([d], T0)
    assert found.raw_return == pytest.approx(110 / 100 - 1)
    assert found.benchmark_return == pytest.approx(408 / 400 - 1)
    assert found.alpha == pytest.approx(0.10 - 0.02)
    assert found.window_start.date() == days[0] and found.window_end.date() == days[5]
    assert found.decision_id == "d1" and found.outcome_id == provider_outcome_id("prices", ACME, "d1")
    assert (await provider.resolve([d], T0))[0].event_id == found.event_id  # idempotent


async def test_price_file_provider_waits_for_the_whole_horizon(tmp_path: Path) -> None:
    path = tmp_path / "prices.csv"
    write_prices(path, {"AAPL": [100, 101, 102], "SPY": [400, 401, 402, 403, 404, 405, 406]}, date(2024, 3, 4))
    provider = PriceFileProvider(path, "SPY")
    assert await provider.resolve([decision(horizon_days=5)], T0) == []
    # the file grows: now it covers the horizon (re-read because it changed)
    write_prices(path, {"AAPL": [100, 101, 102, 103, 104, 99], "SPY": [400, 401, 402, 403, 404, 405, 406]}, date(2024, 3, 4))
    (found,) = await provider.resolve([decision(horizon_days=5)], T0)
    assert found.raw_return == pytest.approx(-0.01)


async def test_price_file_provider_waits_for_the_benchmark(tmp_path: Path) -> None:
    path = tmp_path / "prices.csv"
    write_prices(path, {"AAPL": [100, 101, 102, 103, 104, 105], "SPY": [400, 401]}, date(2024, 3, 4))
    assert await PriceFileProvider(path, "SPY").resolve([decision()], T0) == []
    # without any benchmark rows the outcome is judged against cash
    (found,) = await PriceFileProvider(path, "QQQ").resolve([decision()], T0)
    assert found.alpha is None and found.benchmark_return is None


async def test_price_file_provider_resolves_every_pending_subject(tmp_path: Path) -> None:
    path = tmp_path / "prices.csv"
    symbols = [f"S{i:02d}" for i in range(12)]
    write_prices(path, {**{s: [50.0 + i + k for k in range(8)] for i, s in enumerate(symbols)}, "SPY": [400.0] * 8}, date(2024, 3, 4))
    pending = [decision(f"d{i}", s) for i, s in enumerate(symbols)]
    found = await PriceFileProvider(path, "SPY").resolve(pending, T0)
    assert sorted(o.subject for o in found) == symbols


def test_price_file_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(OutcomeProviderError, match="no such price file"):
        load_price_file(tmp_path / "missing.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("day,ticker,px\n2024-01-02,A,1\n")
    with pytest.raises(OutcomeProviderError, match="no 'date' column"):
        load_price_file(bad)


# ================================================================ the Faust reflector


class TopicReader:
    """Reads a topic from the beginning and keeps every decoded event."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        self.events: list[EventBase] = []
        self.raw: list[Any] = []
        self.letters: list[Any] = []

    async def __aenter__(self) -> "TopicReader":
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()

    async def poll(self, timeout_ms: int = 200) -> None:
        batch = await self.consumer.getmany(timeout_ms=timeout_ms)
        for records in batch.values():
            for rec in records:
                self.raw.append(rec)
                if is_dead_letter(rec.headers):
                    self.letters.append(parse_dead_letter(rec.key, rec.value, rec.headers))
                    continue
                with contextlib.suppress(DecodeError):
                    self.events.append(decode_record(rec.value, rec.headers))

    async def until(self, predicate: Callable[[list[EventBase]], bool], timeout: float = 45.0) -> list[EventBase]:
        deadline = time.monotonic() + timeout
        while not predicate(self.events):
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout}s; events: {[e.type for e in self.events]}")
            await self.poll()
        return self.events

    def of(self, cls: type[EventBase]) -> list[Any]:
        return [e for e in self.events if isinstance(e, cls)]


async def wait_for(condition: Callable[[], bool], timeout: float = 45.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout}s")
        await asyncio.sleep(0.05)


async def quiet_ticks(handle: ReflectorHandle, partitions: int, rounds: int = 3) -> None:
    """Let the reflector handle a few more tick rounds (a duplicate would show by then)."""
    start = handle.stats.get("ticks", 0)
    await wait_for(lambda: handle.stats.get("ticks", 0) >= start + rounds * partitions, what="more ticks")


@contextlib.asynccontextmanager
async def reflector_app(settings: Settings, **kwargs: Any) -> AsyncIterator[ReflectorHandle]:
    """A worker in this process running only the reflector (with injectable parts)."""
    app = build_app(settings, services=[])
    handle = register_reflector(app, settings, Topics.from_settings(settings.broker), **kwargs)
    await app.start()
    try:
        yield handle
    finally:
        await app.stop()


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.mark.kafka
async def test_decision_outcome_one_reflection_projected_and_injected(
    fresh_topics: Topics, settings_for: Callable[..., Settings], kafka_bootstrap: str
) -> None:
    from memstream.projections.reads.reflections import context_for
    from memstream.projections.store.lance_store import LanceStore

    settings = settings_for(fresh_topics, reflection_poll_seconds=0.3)
    app = build_app(settings, services=["projector", "reflector"])
    await app.start()
    try:
        handle: ReflectorHandle = app.reflector  # type: ignore[attr-defined]
        async with MemstreamProducer(streams=settings.streams) as producer, TopicReader(kafka_bootstrap, fresh_topics.events) as log:
            await producer.record_decision(ACME, "d1", "AAPL", "buy", "Buy AAPL: services keep compounding.", utcnow() + timedelta(days=30))
            await producer.observe_outcome(ACME, "o1", "AAPL", 0.05, 5, decision_id="d1", benchmark_return=0.02, alpha=0.03)
            await log.until(lambda evs: any(isinstance(e, MemoryReflected) for e in evs))
            await quiet_ticks(handle, fresh_topics.partitions)
            await log.poll()
            (reflection,) = log.of(MemoryReflected)
        assert reflection.reflection_id == reflection_id_for(ACME, "d1")
        assert reflection.templated is True and reflection.provenance.method == "template"
        assert reflection.decision_id == "d1" and reflection.outcome_id == "o1"
        assert handle.core.state(decision_key(ACME, "d1")) is DecisionState.reflected

        def projected() -> bool:
            store = LanceStore.from_settings(settings.storage, settings.embeddings.dim, read_consistency_interval=timedelta(0))
            return store.count("reflections") == 1

        await wait_for(projected, what="the reflection projected")
        store = LanceStore.from_settings(settings.storage, settings.embeddings.dim, read_consistency_interval=timedelta(0))
        ctx = context_for(store, ACME, "AAPL", 600)
        assert [r.reflection_id for r in ctx.same_subject] == [reflection.reflection_id]
        assert "Buy AAPL: services keep compounding." in ctx.text
        assert reflection.content in ctx.text
        assert context_for(store, GLOBEX, "AAPL", 600).empty  # another tenant sees nothing
    finally:
        await app.stop()


@pytest.mark.kafka
async def test_outcome_before_decision_and_duplicates(
    fresh_topics: Topics, settings_for: Callable[..., Settings], kafka_bootstrap: str
) -> None:
    settings = settings_for(fresh_topics, reflection_poll_seconds=0.3)
    async with reflector_app(settings, provider=None) as handle:
        async with MemstreamProducer(streams=settings.streams) as producer, TopicReader(kafka_bootstrap, fresh_topics.events) as log:
            # unusable input first: it is dead-lettered and the rest still flows
            raw = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
            await raw.start()
            try:
                await raw.send_and_wait(fresh_topics.pending_reflections, b"{not json", key=b"acme/ana")
            finally:
                await raw.stop()
            memory = MemoryAdded(scope=ACME, memory_id="m1", content="A memory on the wrong topic.")
            await producer.send(memory, topic=fresh_topics.outcomes)
            await producer.observe_outcome(ACME, "o-early", "NVDA", 0.08, 5, decision_id="d-late", benchmark_return=0.01)
            await wait_for(lambda: handle.core.counts()["early_outcomes"] == 1, what="the early outcome kept")
            for _ in range(2):  # the same decision twice, then the same outcome again
                await producer.record_decision(ACME, "d-late", "NVDA", "Rating: Overweight", "Data-centre demand.", utcnow() + timedelta(days=30))
            await producer.observe_outcome(ACME, "o-early", "NVDA", 0.08, 5, decision_id="d-late", benchmark_return=0.01)
            await log.until(lambda evs: any(isinstance(e, MemoryReflected) for e in evs))
            await wait_for(lambda: handle.stats.get("forwarded_decisions", 0) == 2 and handle.stats.get("forwarded_outcomes", 0) == 2)
            await quiet_ticks(handle, fresh_topics.partitions)
            await log.poll()
            (reflection,) = log.of(MemoryReflected)
    assert reflection.outcome_id == "o-early" and reflection.rating is Rating.overweight
    assert reflection.alpha == pytest.approx(0.07)
    assert handle.stats["dead_letters"] == 2
    async with TopicReader(kafka_bootstrap, fresh_topics.dead_letter) as dead:
        await dead.until(lambda evs: len(dead.raw) >= 2)
    reasons = sorted((d.stage, d.source_topic) for d in dead.letters)
    assert reasons == [("decode", fresh_topics.pending_reflections), ("reflect", fresh_topics.outcomes)]


@pytest.mark.kafka
async def test_partial_horizon_waits_then_full_outcome_settles(
    fresh_topics: Topics, settings_for: Callable[..., Settings], kafka_bootstrap: str
) -> None:
    settings = settings_for(fresh_topics, reflection_poll_seconds=0.3)
    async with reflector_app(settings, provider=None) as handle:
        key = decision_key(ACME, "d-msft")
        async with MemstreamProducer(streams=settings.streams) as producer, TopicReader(kafka_bootstrap, fresh_topics.events) as log:
            await producer.record_decision(ACME, "d-msft", "MSFT", "sell", "Cloud growth is slowing.", utcnow() + timedelta(days=30), horizon_days=5)
            await producer.observe_outcome(ACME, "o-1day", "MSFT", -0.01, 1, decision_id="d-msft", benchmark_return=0.0)
            await wait_for(lambda: handle.stats.get("forwarded_outcomes", 0) == 1)
            await quiet_ticks(handle, fresh_topics.partitions, rounds=2)
            assert handle.core.state(key) is DecisionState.pending
            await log.poll()
            assert log.of(MemoryReflected) == []
            await producer.observe_outcome(ACME, "o-5day", "MSFT", 0.04, 5, decision_id="d-msft", benchmark_return=0.01)
            await log.until(lambda evs: any(isinstance(e, MemoryReflected) for e in evs))
            (reflection,) = log.of(MemoryReflected)
    assert reflection.outcome_id == "o-5day" and reflection.correct is False


@pytest.mark.kafka
async def test_no_outcome_expires_at_the_deadline(
    fresh_topics: Topics, settings_for: Callable[..., Settings], kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(utcnow())
    monkeypatch.setattr(reflector_agent, "clock", clock)  # the module-level hook
    settings = settings_for(fresh_topics, reflection_poll_seconds=0.3)
    deadline = clock.now + timedelta(days=5)
    async with reflector_app(settings, provider=None) as handle:
        key = decision_key(ACME, "d-tsla")
        async with MemstreamProducer(streams=settings.streams) as producer, TopicReader(kafka_bootstrap, fresh_topics.events) as log:
            await producer.record_decision(ACME, "d-tsla", "TSLA", "hold", "Wait for the delivery numbers.", deadline)
            await wait_for(lambda: handle.core.state(key) is DecisionState.pending)
            clock.now = deadline - timedelta(seconds=1)
            await quiet_ticks(handle, fresh_topics.partitions, rounds=2)
            assert handle.core.state(key) is DecisionState.pending
            clock.now = deadline
            await log.until(lambda evs: any(isinstance(e, DecisionExpired) for e in evs))
            await quiet_ticks(handle, fresh_topics.partitions)
            await log.poll()
            (expired,) = log.of(DecisionExpired)
            assert handle.core.state(key) is DecisionState.expired
            # an outcome arriving now changes nothing
            await producer.observe_outcome(ACME, "o-late", "TSLA", 0.1, 5, decision_id="d-tsla")
            await wait_for(lambda: handle.stats.get("forwarded_outcomes", 0) == 1)
            await quiet_ticks(handle, fresh_topics.partitions)
            await log.poll()
            assert log.of(MemoryReflected) == []
    assert expired.decision_id == "d-tsla" and expired.deadline == deadline
    assert expired.event_id == expiry_event_id(ACME, "d-tsla")


class RecordingProvider(PriceFileProvider):
    """The price-file provider, recording each poll: (pending given, outcomes found)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.polls: list[tuple[int, int]] = []

    async def resolve(self, decisions: Sequence[DecisionRecorded], now: datetime) -> list[OutcomeObserved]:
        try:
            found = await super().resolve(decisions, now)
        except OutcomeProviderError:
            self.polls.append((len(decisions), -1))
            raise
        self.polls.append((len(decisions), len(found)))
        return found


@pytest.mark.kafka
async def test_many_subjects_settle_in_one_pass(
    fresh_topics: Topics, settings_for: Callable[..., Settings], kafka_bootstrap: str, tmp_path: Path
) -> None:
    symbols = [f"T{i:02d}" for i in range(12)]
    prices = tmp_path / "prices.csv"
    provider = RecordingProvider(prices, "SPY")
    settings = settings_for(fresh_topics, reflection_poll_seconds=0.3)
    decided = datetime(2024, 3, 4, 21, 0, tzinfo=timezone.utc)
    async with reflector_app(settings, provider=provider) as handle:
        async with MemstreamProducer(streams=settings.streams) as producer, TopicReader(kafka_bootstrap, fresh_topics.events) as log:
            for i, sym in enumerate(symbols):
                await producer.record_decision(
                    ACME, f"d-{sym}", sym, "buy" if i % 2 else "sell", f"Call on {sym}.",
                    utcnow() + timedelta(days=30), occurred_at=decided,
                )
            await wait_for(lambda: handle.core.counts()["pending"] == len(symbols), what="all pending")
            # the prices appear only now, so one poll per partition must resolve them all
            write_prices(prices, {**{s: [100.0 + i] * 5 + [105.0 + i] * 3 for i, s in enumerate(symbols)}, "SPY": [400.0] * 8}, decided.date())
            await log.until(lambda evs: len([e for e in evs if isinstance(e, MemoryReflected)]) == len(symbols))
            await quiet_ticks(handle, fresh_topics.partitions)
            await log.poll()
            reflections = log.of(MemoryReflected)
    assert sorted(r.subject for r in reflections) == symbols
    assert all(r.outcome_id == provider_outcome_id("prices", ACME, r.decision_id) for r in reflections)
    resolving = [(given, found) for given, found in provider.polls if found > 0]
    assert all(given == found for given, found in resolving)  # each poll resolved every pending subject
    assert sum(found for _, found in resolving) == len(symbols)  # no subject resolved twice
    assert handle.stats["provider_outcomes"] == len(symbols)


@pytest.mark.kafka
async def test_llm_reflection_after_failures_is_written_once(
    fresh_topics: Topics, settings_for: Callable[..., Settings], kafka_bootstrap: str, fake_llm: FakeOpenAI  # noqa: F811
) -> None:
    fake_llm.chat.push_error(503).push_error(503).push_error(503)
    fake_llm.chat.push_json(
        {"reflection": "The sell was wrong: AMZN beat the benchmark by +2.0%. The margin worry did not play out.",
         "lesson": "Check retail margins against cloud growth before selling AMZN."}
    )
    settings = settings_for(fresh_topics, reflection_poll_seconds=0.3, llm_base_url=fake_llm.base_url, llm_model="fake-model")
    async with reflector_app(settings, provider=None) as handle:
        handle.runner.backoff = Backoff(initial=0.2, maximum=0.5)
        async with MemstreamProducer(streams=settings.streams) as producer, TopicReader(kafka_bootstrap, fresh_topics.events) as log:
            await producer.record_decision(ACME, "d-amzn", "AMZN", "sell", "Retail margins are peaking.", utcnow() + timedelta(days=30))
            await producer.observe_outcome(ACME, "o-amzn", "AMZN", 0.03, 5, decision_id="d-amzn", benchmark_return=0.01)
            await log.until(lambda evs: any(isinstance(e, MemoryReflected) for e in evs))
            await quiet_ticks(handle, fresh_topics.partitions)
            await log.poll()
            (reflection,) = log.of(MemoryReflected)
    assert reflection.templated is False and reflection.provenance.method == "llm"
    assert reflection.lesson == "Check retail margins against cloud growth before selling AMZN."
    assert handle.runner.failures >= 1
    assert fake_llm.chat.count == 4  # three failures, one answer, nothing asked twice


# ============================================================== SIGKILL mid-reflection


def _worker_env(settings: Settings, llm_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "MEMSTREAM_BROKER_BOOTSTRAP_SERVERS": settings.broker.bootstrap_servers,
            "MEMSTREAM_BROKER_TOPIC_PREFIX": settings.broker.topic_prefix,
            "MEMSTREAM_BROKER_PARTITIONS": str(settings.broker.partitions),
            "MEMSTREAM_WORKER_APP_ID": settings.worker.app_id,
            "MEMSTREAM_HOME": str(settings.home),
            "MEMSTREAM_STORAGE_ROOT": str(settings.storage.root),
            "MEMSTREAM_EXTRACTION_LLM_BASE_URL": llm_url,
            "MEMSTREAM_EXTRACTION_LLM_MODEL": "fake-model",
            "MEMSTREAM_EXTRACTION_LLM_TIMEOUT_S": "300",
            "MEMSTREAM_EXTRACTION_LLM_MAX_RETRIES": "0",
            "MEMSTREAM_WORKER_REFLECTION_POLL_SECONDS": "0.5",
            # Faust reads these itself: a killed member leaves the group within seconds
            "BROKER_SESSION_TIMEOUT": "6",
            "BROKER_HEARTBEAT_INTERVAL": "1",
        }
    )
    return env


def _start_worker(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "memstream.services.worker", "--services", "reflector", "--loglevel", "info"],
            env=env,
            cwd=log_path.parent,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@pytest.mark.kafka
@pytest.mark.slow
async def test_sigkill_between_settling_and_reflecting_yields_one_reflection(
    fresh_topics: Topics, settings_for: Callable[..., Settings], kafka_bootstrap: str, fake_llm: FakeOpenAI, tmp_path: Path  # noqa: F811
) -> None:
    settings = settings_for(fresh_topics)
    env = _worker_env(settings, fake_llm.base_url)
    log_path = tmp_path / "worker.log"
    answer = {"reflection": "The buy was right: META beat the benchmark by +4.0%. The ad recovery held.",
              "lesson": "Ad-cycle recoveries deserve conviction."}
    fake_llm.chat.responder = lambda body: Reply(delay=600)  # the model hangs: the kill lands mid-reflection
    worker = _start_worker(env, log_path)
    try:
        async with MemstreamProducer(streams=settings.streams) as producer, TopicReader(kafka_bootstrap, fresh_topics.events) as log:
            await producer.record_decision(ACME, "d-meta", "META", "buy", "Ad spend is recovering.", utcnow() + timedelta(days=30))
            await producer.observe_outcome(ACME, "o-meta", "META", 0.06, 5, decision_id="d-meta", benchmark_return=0.02)
            await wait_for(lambda: fake_llm.chat.count >= 1 or worker.poll() is not None, timeout=90, what="the reflection call")
            assert worker.poll() is None, log_path.read_text()[-3000:]
            worker.send_signal(signal.SIGKILL)  # settled, reflecting, nothing emitted
            worker.wait(timeout=30)
            await log.poll()
            assert log.of(MemoryReflected) == []

            fake_llm.chat.responder = lambda body: Reply(json_value=answer)
            worker = _start_worker(env, log_path)
            await log.until(lambda evs: any(isinstance(e, MemoryReflected) for e in evs), timeout=90)
            requests_then = fake_llm.chat.count
            for _ in range(10):  # a few more seconds of ticks: a duplicate would show
                await log.poll(timeout_ms=300)
            (reflection,) = log.of(MemoryReflected)
            assert fake_llm.chat.count == requests_then == 2  # one hung call, one answered
        assert reflection.reflection_id == reflection_id_for(ACME, "d-meta")
        assert reflection.lesson == "Ad-cycle recoveries deserve conviction."
        assert reflection.provenance.method == "llm"
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()


# =============================================================================== CLI


@pytest.mark.kafka
def test_cli_decide_and_outcome_write_to_the_log(
    kafka_bootstrap: str, topic_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import typer
    from typer.testing import CliRunner

    from memstream.cli import reflect
    from memstream.cli._errors import CLIError
    from memstream.settings.model import get_settings
    from memstream.streams.admin import ensure_topics

    topics = Topics(prefix=topic_prefix, partitions=3)
    asyncio.run(ensure_topics(kafka_bootstrap, topics))
    monkeypatch.setenv("MEMSTREAM_BROKER_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("MEMSTREAM_BROKER_TOPIC_PREFIX", topic_prefix)
    get_settings.cache_clear()
    cli = typer.Typer()
    reflect.register(cli)
    try:
        runner = CliRunner()
        decided = runner.invoke(
            cli,
            ["decide", "--team", "acme", "--user", "ana", "--subject", "AAPL", "--rating", "FINAL PROPOSAL: **Strong Buy**",
             "--text", "Services keep compounding.", "--id", "d-cli", "--horizon", "3", "--deadline", "2031-01-31T16:00:00Z"],
            catch_exceptions=False,
        )
        assert decided.exit_code == 0, decided.output
        observed = runner.invoke(
            cli,
            ["outcome", "--team", "acme", "--user", "ana", "--subject", "AAPL", "--return", "0.05", "--horizon", "3",
             "--decision", "d-cli", "--benchmark-return", "0.02", "--id", "o-cli"],
            catch_exceptions=False,
        )
        assert observed.exit_code == 0, observed.output
        with pytest.raises(CLIError, match="no rating found"):
            runner.invoke(
                cli,
                ["decide", "--team", "acme", "--user", "ana", "--subject", "AAPL", "--rating", "maybe", "--text", "x"],
                catch_exceptions=False,
            )
    finally:
        get_settings.cache_clear()

    async def read() -> tuple[list[Any], list[Any]]:
        async with TopicReader(kafka_bootstrap, topics.pending_reflections) as pending, TopicReader(kafka_bootstrap, topics.outcomes) as outs:
            await pending.until(lambda evs: len(evs) >= 1)
            await outs.until(lambda evs: len(evs) >= 1)
            return pending.of(DecisionRecorded), outs.of(OutcomeObserved)

    (decision_event,), (outcome_event,) = asyncio.run(read())
    assert decision_event.rating is Rating.buy and decision_event.decision_id == "d-cli"
    assert decision_event.horizon_days == 3
    assert decision_event.deadline == datetime(2031, 1, 31, 16, 0, tzinfo=timezone.utc)
    assert outcome_event.decision_id == "d-cli" and outcome_event.alpha == pytest.approx(0.03)
