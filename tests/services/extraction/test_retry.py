"""``memstream extract --retry-failed`` reads only the window's own agent's turns: a
fallback memory is a client event like any other, so whoever writes one names the
turn ids of its window, and the retry must not look them up in another agent's
conversation. Real broker and LanceDB; the model is the scripted fake."""

from __future__ import annotations

import asyncio

from tests.fakes.openai_server import fake_llm  # noqa: F401 - the fixture
from tests.services.extraction.test_extractor import (  # noqa: F401 - env is a fixture
    Env,
    env,
    read_topic,
    turn,
)

from memstream.domain.events import MemoryAdded, Provenance
from memstream.domain.extraction.fallback import FALLBACK_STATUS, FallbackReason, fallback_record
from memstream.projections.projector.projector import Projector
from memstream.services.extraction.retry import find_windows, retry_windows


class _Sink:
    def __init__(self) -> None:
        self.events: list[object] = []

    async def send_many(self, events: list[object]) -> list[object]:
        self.events.extend(events)
        return []


async def test_a_retry_never_reads_another_agents_turn(env: Env) -> None:
    secret = turn("m-b1", "my social security number is 078-05-1120")
    theirs = secret.model_copy(update={"scope": secret.scope.model_copy(update={"agent_id": "agent-b"})})
    mine = secret.scope.model_copy(update={"agent_id": "agent-a"})
    record = fallback_record(FallbackReason.refused, "flagged", run_id="run-a1", attempts=1,
                             window=["m-b1"], background=[])
    bait = MemoryAdded(
        scope=mine, session_id="s1", memory_id="fallback-a1", content="a note of agent a",
        source_message_ids=("m-b1",),
        provenance=Provenance(method="heuristic", status=FALLBACK_STATUS, decisions=(record,)),
    )
    await env.producer.send_many([theirs])
    await env.producer.send_many([bait])
    events = await read_topic(env.settings, env.topics.messages) + await env.new_events()
    result = await asyncio.to_thread(Projector(env.store, env.embedder).apply, events)
    assert not result.failed, result.failed

    (window,) = [w for w in find_windows(env.store) if w.run_id == "run-a1"]
    assert window.scope.agent_id == "agent-a" and window.window == ("m-b1",)
    sink = _Sink()
    report = await retry_windows(env.settings, env.store, [window], llm=env.llm, embedder=env.embedder, producer=sink)
    assert report.missing_turns == ["run-a1"] and report.redone == 0
    assert env.fake.chat.count == 0 and sink.events == []  # B's turn never reached the model
