"""The console's paged reads over a real LanceDB store (events projected by the real
projector): the timeline walks every event of the window once by its cursor, however
many share a time, and counts them; lessons say where ``/v1/lessons`` injects them,
as ``context_for`` answers. Scope checks of every page against the live stack:
``tests/interfaces/console/test_console_scope.py``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from tests.projections.projection_helpers import T0, memory, positioned
from tests.projections.reads.test_reflections import reflected

from memstream.domain.access import ReadScope
from memstream.domain.events import Scope
from memstream.projections.reads.console import Cursor, lessons_page, timeline_window
from memstream.projections.projector.projector import Projector
from memstream.projections.reads.reflections import context_for
from memstream.projections.store.lance_store import LanceStore

ANA = Scope(team_id="acme", user_id="ana", agent_id="trader")
RISK = Scope(team_id="acme", user_id="ana", agent_id="risk")
OTHER = Scope(team_id="globex", user_id="ana", agent_id="trader")


@pytest.fixture
def loaded(store: LanceStore, projector: Projector) -> LanceStore:
    events = (
        # many lessons share a time: the cursor, not the time, must tell them apart
        [reflected(ANA, n, "AAPL", day=n // 4) for n in range(13)]
        + [reflected(RISK, n, "MSFT", day=n // 4) for n in range(5)]
        + [reflected(ANA, n, f"X{n}", day=10 + n) for n in range(3)]
        + [reflected(OTHER, n, "AAPL", day=n) for n in range(6)]
        + [memory(ANA, f"m{n}", f"memory {n}", occurred_at=T0 + timedelta(days=n // 3)) for n in range(8)]
    )
    assert not projector.apply(positioned(events)).failed
    return store


def _walk(store: LanceStore, scope: ReadScope, limit: int) -> list[tuple[str, str]]:
    seen, cursor = [], None
    for _ in range(100):
        w = timeline_window(store, scope, T0 - timedelta(days=1), T0 + timedelta(days=60), limit=limit, cursor=cursor)
        seen += [(e["kind"], e["id"]) for e in w.events]
        if w.next is None:
            return seen
        cursor = Cursor.parse(str(w.next))  # as the page's link carries it
    raise AssertionError("the cursor never reached the end")


@pytest.mark.parametrize("limit", [1, 4, 7, 100])
def test_the_timeline_walks_every_event_of_the_space_once_newest_first(loaded: LanceStore, limit: int) -> None:
    scope = ReadScope("acme", "ana", None)
    walked = _walk(loaded, scope, limit)
    # 21 lessons and their 21 settled decisions, 8 memories; never globex's
    assert len(walked) == len(set(walked)) == 21 + 21 + 8
    assert {k for k, _ in walked} == {"lesson", "decision", "memory"}
    first = timeline_window(loaded, scope, T0 - timedelta(days=1), T0 + timedelta(days=60), limit=limit)
    assert sum(sum(b.values()) for b in first.buckets) == 50 and not first.capped
    pinned = _walk(loaded, ReadScope("acme", "ana", "risk"), limit)
    assert len(pinned) == 5 + 5  # the pinned agent's only


def test_a_capped_count_says_so(loaded: LanceStore) -> None:
    w = timeline_window(loaded, ReadScope("acme", "ana", None), T0 - timedelta(days=1), T0 + timedelta(days=60),
                        count_cap=10)
    assert w.capped and sum(b["lesson"] for b in w.buckets) == 10


def test_a_bad_cursor_is_refused() -> None:
    for text in ("nope", "2026-01-01T00:00:00|memory|m1", "2026-01-01T00:00:00+00:00|bogus|m1"):
        with pytest.raises(ValueError):
            Cursor.parse(text)


@pytest.mark.parametrize("agent", [None, "trader"])
@pytest.mark.parametrize("limit, offset", [(100, 0), (5, 0), (4, 6)])
def test_where_a_lesson_is_injected_is_what_context_for_answers(
    loaded: LanceStore, agent: str | None, limit: int, offset: int
) -> None:
    scope = ReadScope("acme", "ana", agent)
    rows = lessons_page(loaded, scope, None, limit=limit, offset=offset)[:limit]
    everything = lessons_page(loaded, scope, None, limit=100, offset=0)
    assert len(everything) == (21 if agent is None else 16)  # never globex's, the pinned agent's only
    assert rows == everything[offset : offset + limit]
    for r in rows:
        ctx = context_for(loaded, scope, r["subject"], 20_000)
        same = [x.reflection_id for x in ctx.same_subject]
        assert (r["same_rank"] is not None) == (r["reflection_id"] in same), r["reflection_id"]
        if r["same_rank"]:
            assert same[r["same_rank"] - 1] == r["reflection_id"]
        elsewhere = context_for(loaded, scope, "NOT-A-SUBJECT", 20_000)
        assert r["other_subjects"] == (r["reflection_id"] in [x.reflection_id for x in elsewhere.other_subjects])
