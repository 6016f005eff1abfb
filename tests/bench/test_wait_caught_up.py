"""How the benchmarks find the end of an ingest: coarse polls while extraction is
behind, finer ones once only projection is left, and the first caught-up state of a
confirmed streak as the figure."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from memstream.bench import _common
from memstream.bench._common import CatchUp, wait_caught_up
from memstream.settings.model import Settings

M, E = ("memstream.messages", 0), ("memstream.events", 0)


def state(at: float, *, extracted: int, projected: tuple[int, int], events: int = 8) -> CatchUp:
    return CatchUp(
        message_ends={M: 10}, event_ends={E: events},
        projected={M: projected[0], E: projected[1]}, extracted={M: extracted}, observed_at=at,
    )


class ScriptedWatch:
    """Stands in for the Kafka and LanceDB reads: the states a run goes through."""

    def __init__(self, states: list[CatchUp]) -> None:
        self.states = states
        self.reads = 0

    async def read(self, positions: Any, *, extraction: bool = False) -> CatchUp:
        self.reads += 1
        return self.states.pop(0)


def test_polls_finer_once_extraction_is_done_and_reports_the_first_caught_up_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(_common.asyncio, "sleep", sleep)
    watch = ScriptedWatch([
        state(1.0, extracted=4, projected=(4, 0), events=3),    # extracting
        state(2.0, extracted=10, projected=(10, 5)),             # extracted, projecting
        state(3.0, extracted=10, projected=(10, 8)),             # caught up: the figure
        state(4.0, extracted=10, projected=(10, 8)),             # confirmed (no new event)
    ])
    done = asyncio.run(wait_caught_up(
        Settings(), lambda: {}, poll=0.05, settle_poll=0.01, watch=watch,  # type: ignore[arg-type]
    ))
    assert done.observed_at == 3.0
    assert slept == [0.05, 0.01, 0.01]
    assert watch.reads == 4


def test_a_new_event_after_catching_up_restarts_the_streak(monkeypatch: pytest.MonkeyPatch) -> None:
    async def sleep(seconds: float) -> None:
        return None

    monkeypatch.setattr(_common.asyncio, "sleep", sleep)
    watch = ScriptedWatch([
        state(1.0, extracted=10, projected=(10, 8)),
        state(2.0, extracted=10, projected=(10, 8), events=9),  # one more memory appeared
        state(3.0, extracted=10, projected=(10, 9), events=9),
        state(4.0, extracted=10, projected=(10, 9), events=9),
    ])
    done = asyncio.run(wait_caught_up(Settings(), lambda: {}, settle_poll=0.01, watch=watch))  # type: ignore[arg-type]
    assert done.observed_at == 3.0


def test_without_a_settle_poll_the_interval_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(_common.asyncio, "sleep", sleep)
    watch = ScriptedWatch([state(1.0, extracted=10, projected=(10, 5)), state(2.0, extracted=10, projected=(10, 8)),
                           state(3.0, extracted=10, projected=(10, 8))])
    asyncio.run(wait_caught_up(Settings(), lambda: {}, poll=0.05, watch=watch))  # type: ignore[arg-type]
    assert slept == [0.05, 0.05]
