"""Replay: rebuild every table from offset 0 into a fresh set, verify, swap.

Real broker, real LanceDB directories under ``tmp_path``. What must hold:

* a replay covers the whole log (positions equal the end offsets, dead letters
  included), reports progress against the end offsets, and two replays of one log
  are identical (the projection is a pure function of the log);
* ``dry_run`` builds and compares, leaves the live set alone and removes what it built;
  a real replay points ``CURRENT`` at the new set, reports how the old live set
  differed, and the next replay removes the replaced set;
* one replay at a time (tests/services/replay/test_serving.py: while a worker runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from memstream.domain.events import MemoryAdded, MemoryLinked, MessageObserved, Scope
from memstream.services.replay.rebuild import PHASE_COMPACT, PHASE_SWAP, PHASE_VECTOR_INDEX, PHASE_VERIFY, ReplayError, replay
from memstream.services.replay.report import PHASE_TIMES, ReplayProgress
from memstream.projections.store.lance_store import LanceStore
from memstream.projections.store.table_sets import TableSets
from memstream.settings.model import Settings, child_env
from memstream.streams.producers.producer import MemstreamProducer
from memstream.projections.store.dir_lock import LanceDirBusyError, LanceDirLock
from memstream.streams.topics import Topics

pytestmark = [pytest.mark.kafka]

ALICE = Scope(team_id="acme", user_id="alice")
BOB = Scope(team_id="acme", user_id="bob")


async def produce_log(settings: Settings, start: int, count: int) -> None:
    """``count`` turns and memories per user, a supersede link, then a poison record
    last on the events partition of Alice's space (its position must still be covered)."""
    events = []
    for scope in (ALICE, BOB):
        for i in range(start, start + count):
            events.append(MessageObserved(scope=scope, message_id=f"m{i}", content=f"turn {i} of {scope.user_id}"))
            events.append(
                MemoryAdded(
                    scope=scope,
                    memory_id=f"mem{i}",
                    content=f"{scope.user_id} fact number {i}",
                    source_message_ids=(f"m{i}",),
                )
            )
        events.append(
            MemoryLinked(
                scope=scope,
                from_memory_id=f"mem{start + count - 1}",
                to_memory_id=f"mem{start}",
                relation="supersedes",
            )
        )
    async with MemstreamProducer(settings.streams) as producer:
        await producer.send_many(events)
    raw = AIOKafkaProducer(bootstrap_servers=settings.broker.bootstrap_servers)
    await raw.start()
    try:
        await raw.send_and_wait(Topics.from_settings(settings.broker).events, value=b"{oops", key=b"acme/alice")
    finally:
        await raw.stop()


def clock(second: int):  # type: ignore[no-untyped-def]
    """Distinct replay directory names per call, without reading the wall clock."""
    return lambda: datetime(2025, 1, 2, 3, 4, second, tzinfo=timezone.utc)


async def test_replay_builds_verifies_compares_and_swaps(
    fresh_topics: Topics, settings_for, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    settings = settings_for(fresh_topics, lance_dir=tmp_path / "data" / "lance")
    sets = TableSets(settings.storage.root)
    await produce_log(settings, 0, 30)

    seen: list[ReplayProgress] = []
    phases: list[str] = []
    first = await replay(
        settings, dry_run=True, batch_size=25, on_progress=seen.append, on_phase=phases.append, now=clock(1)
    )
    assert first.dry_run and not first.swapped and not sets.has_projection()
    assert first.replay_dir == sets.path_of("20250102T030401000Z")
    assert not first.replay_dir.exists(), "a dry run removes what it built"
    assert first.live_digest is None and first.live_matches is None
    total = 2 * (30 * 2 + 1) + 1
    assert first.records == first.expected_records == total
    assert first.dead_decode == 1 and first.applied == total - 1
    # Every partition's position reached its end offset, the poison record's included.
    assert first.positions == {k: v for k, v in first.end_offsets.items() if v > 0}
    assert seen[0].done == 0 and seen[-1].done == total and seen[-1].total == total
    assert all(a.done <= b.done for a, b in zip(seen, seen[1:])) and len(seen) > 3
    # The steps after the build are named; a dry run never swaps; 60 memories train no index.
    assert phases == [PHASE_COMPACT, PHASE_VERIFY]
    assert first.replay_digest["memories"][0] == 60 and first.replay_digest["messages"][0] == 60
    assert "dry run" in first.summary() and "\n" not in first.summary()

    # A real replay swaps in; two replays of one log are identical.
    phases.clear()
    second = await replay(settings, on_phase=phases.append, now=clock(2))
    assert phases == [PHASE_COMPACT, PHASE_VERIFY, PHASE_SWAP]
    assert second.swapped and sets.current_name() == "20250102T030402000Z"
    assert second.replay_dir == sets.current() and second.old_dir == Path(settings.storage.root)
    assert second.replay_digest == first.replay_digest
    assert LanceStore.from_settings(settings.storage, settings.embeddings.dim).table_digest() == first.replay_digest
    superseded = LanceStore.from_settings(settings.storage, settings.embeddings.dim).get_memories(ALICE, ["mem0"])[0]
    assert superseded["superseded_by"] == "mem29"

    # The log grows; the live set now lags and the comparison says where.
    await produce_log(settings, 30, 5)
    third = await replay(settings, dry_run=True, now=clock(3))
    assert third.live_matches is False
    changed = {d.table: d for d in third.differences}
    assert changed["memories"].live[0] == 60 and changed["memories"].replay[0] == 70
    assert "positions" in changed
    assert "differs from live" in third.summary()

    fourth = await replay(settings, now=clock(4))
    assert fourth.swapped and fourth.old_dir == second.replay_dir
    assert fourth.replay_digest == third.replay_digest
    assert LanceStore.from_settings(settings.storage, settings.embeddings.dim).table_digest() == third.replay_digest
    # The replaced set is kept, untouched, for readers still on it...
    assert LanceStore.from_settings(settings.storage, settings.embeddings.dim, fourth.old_dir).table_digest() == first.replay_digest
    assert "swapped in" in fourth.summary()
    # ...until the next replay removes it.
    fifth = await replay(settings, now=clock(5))
    assert not second.replay_dir.exists() and fourth.replay_dir.exists() and fifth.replay_dir == sets.current()
    assert sorted(p.name for p in (Path(settings.storage.root) / "sets").iterdir()) == [
        fourth.replay_dir.name, fifth.replay_dir.name
    ]


async def test_the_vector_index_is_trained_after_the_swap_never_before(
    fresh_topics: Topics, settings_for, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    settings = settings_for(
        fresh_topics, lance_dir=tmp_path / "data" / "lance", embedder="local", vector_index_threshold=256
    )
    await produce_log(settings, 0, 130)  # 260 memories: an IVF_PQ index is due

    phases: list[str] = []
    first = await replay(settings, on_phase=phases.append, now=clock(1))
    # Swapped in untrained (searches are exact until the worker's maintenance trains it).
    assert first.swapped and first.vector_index_due
    assert phases == [PHASE_COMPACT, PHASE_VERIFY, PHASE_SWAP]
    assert LanceStore.from_settings(settings.storage, settings.embeddings.dim).vector_index_due()
    assert "vector index is due" in first.summary()
    # Every phase that ran is named and timed; together they are the call's wall time.
    assert {"connect", "read_project", "optimize", "digests", "swap"} <= set(first.phase_s) <= set(PHASE_TIMES)
    assert "vector_index" not in first.phase_s
    assert sum(first.phase_s.values()) <= first.elapsed_s

    phases.clear()
    second = await replay(settings, on_phase=phases.append, now=clock(2), build_vector_index=True)
    assert phases == [PHASE_COMPACT, PHASE_VERIFY, PHASE_SWAP, PHASE_VECTOR_INDEX]
    assert second.swapped and not second.vector_index_due and "vector_index" in second.phase_s
    trained = LanceStore.from_settings(settings.storage, settings.embeddings.dim)
    assert not trained.vector_index_due() and trained.has_vector_index()
    assert second.replay_digest == first.replay_digest


async def test_a_second_replay_is_refused_while_one_runs(
    fresh_topics: Topics, settings_for, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    settings = settings_for(fresh_topics)
    await produce_log(settings, 0, 3)
    held = LanceDirLock(Path(settings.storage.root) / "replay")
    held.acquire("memstream replay")
    try:
        with pytest.raises(ReplayError, match="another replay is running"):
            await replay(settings, now=clock(1))
    finally:
        held.release()
    assert not (Path(settings.storage.root) / "sets").exists() or not any((Path(settings.storage.root) / "sets").iterdir())
    # A replay holds the worker lock only while it runs.
    await replay(settings, now=clock(4))
    again = LanceDirLock(settings.storage.root)
    again.acquire("check")
    again.release()


async def test_lock_excludes_a_second_holder(tmp_path: Path) -> None:
    first = LanceDirLock(tmp_path / "lance")
    first.acquire("first")
    second = LanceDirLock(tmp_path / "lance")
    try:
        with pytest.raises(LanceDirBusyError, match=r"in use by first \(pid \d+\)"):
            second.acquire("second")
    finally:
        first.release()
    second.acquire("second")  # free again once released
    second.release()


async def test_replay_of_missing_topics_is_a_clear_error(settings_for, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = settings_for(Topics(prefix=f"missing{os.getpid()}x.", partitions=3))
    with pytest.raises(ReplayError, match="does not exist"):
        await replay(settings, dry_run=True)


async def test_cli_replay_prints_one_summary_line(
    fresh_topics: Topics, settings_for, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    settings = settings_for(fresh_topics)
    await produce_log(settings, 0, 2)
    done = subprocess.run(
        [sys.executable, "-m", "memstream", "replay", "--dry-run", "--no-progress"],
        cwd=tmp_path,
        env=child_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("replayed 11 records")
    assert "1 dead letters" in lines[0] and "dry run" in lines[0]


async def test_a_replay_that_diverges_from_live_is_listed_by_space_and_never_swapped_silently(
    fresh_topics: Topics, settings_for, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    settings = settings_for(fresh_topics, lance_dir=tmp_path / "lance")
    sets = TableSets(settings.storage.root)
    await produce_log(settings, 0, 10)
    built = await replay(settings, now=clock(1))
    assert built.swapped and not built.diverged
    # The live set loses rows the log still holds (as a forget applied out of order did).
    LanceStore.from_settings(settings.storage, settings.embeddings.dim, sets.current()).table("memories").delete("user_id = 'alice' AND memory_id IN ('mem3', 'mem4')")
    await produce_log(settings, 10, 2)  # the live set now also lags: that part the log explains

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "memstream", "replay", "--no-progress", *args], cwd=tmp_path,
                              env=child_env(settings), capture_output=True, text=True, timeout=180)

    refused = cli()
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "acme/alice memories 8->10" in refused.stdout and "NOT swapped" in refused.stdout
    assert "bob" not in refused.stdout.split("DIVERGES")[1]  # bob's space matches: only alice's is listed
    assert sets.current_name() == built.replay_dir.name
    forced = cli("--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "FORCED: swapped in" in forced.stdout and sets.current_name() != built.replay_dir.name
    memories = LanceStore.from_settings(settings.storage, settings.embeddings.dim, sets.current()).get_memories(ALICE, ["mem3", "mem11"])
    assert sorted(m["memory_id"] for m in memories) == ["mem11", "mem3"]
