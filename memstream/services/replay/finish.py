"""The steps of a replay after its build: compact the new set, make its indexes, take
the digests of the new and the live set, verify that every record is accounted for
and every position reached, compare with the live set at the same positions; and,
after the swap when asked, train the IVF_PQ vector index (see
:func:`memstream.services.replay.rebuild.replay`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from memstream.services.shards import routing as shard_routing
from memstream.services.replay.diff import space_differences, space_digests
from memstream.services.replay.report import ReplayReport
from memstream.settings import Settings

__all__ = [
    "ReplayError", "PHASES", "PHASE_COMPACT", "PHASE_VECTOR_INDEX", "PHASE_VERIFY", "PHASE_SWAP",
    "finish", "train_vector_index", "open_live", "verify_counts",
]

log = logging.getLogger("memstream.services.replay")

PHASE_COMPACT = "compacting"
PHASE_VECTOR_INDEX = "training the vector index"
PHASE_VERIFY = "verifying"
PHASE_SWAP = "swapping in"
PHASES = (PHASE_COMPACT, PHASE_VERIFY, PHASE_SWAP, PHASE_VECTOR_INDEX)
"""The steps after the build, in order (the vector index only when one is due and
``build_vector_index`` asks for it: after the swap, while the new set serves)."""


class ReplayError(RuntimeError):
    """The replay could not be built, did not verify, or could not be swapped in."""


def open_live(path: Path, settings: Settings) -> Any:
    return shard_routing.open_store(settings, path, create=False)


def verify_counts(report: ReplayReport) -> None:
    """Every position reached its end offset (and the live set's), every record read
    is accounted for; else :class:`ReplayError`."""
    problems = []
    for key, end in sorted(report.end_offsets.items()):
        got = report.positions.get(key, 0)
        if end > 0 and got < end:
            problems.append(f"{key[0]}:{key[1]} position {got} < end offset {end}")
    for key, live in sorted((report.live_positions or {}).items()):
        if not report.dry_run and report.positions.get(key, 0) < live:
            problems.append(f"{key[0]}:{key[1]} position {report.positions.get(key, 0)} behind the live set's {live}")
    accounted = (
        report.applied + report.skipped + report.dead_decode + report.dead_project + report.misrouted + report.unreadable
    )
    if accounted != report.records:
        problems.append(
            f"{report.records} records read but {accounted} accounted for "
            f"(applied {report.applied}, skipped {report.skipped}, dead {report.dead_decode + report.dead_project})"
        )
    if problems:
        raise ReplayError(
            f"replay in {report.replay_dir} is incomplete, not swapped: " + "; ".join(problems[:5])
        )


async def finish(
    store: Any, executor: Executor, report: ReplayReport, live_dir: Path, settings: Settings,
    on_phase: Callable[[str], None],
) -> None:
    """Compact and index the new set (the vector index is left for after the swap),
    take the digests, then verify and compare it with the live set."""

    def steps() -> None:
        on_phase(PHASE_COMPACT)
        with report.timed("optimize"):
            store.optimize()
        with report.timed("base_indexes"):
            store.ensure_base_indexes()
            report.vector_index_due = store.vector_index_due()  # trained after the swap
        on_phase(PHASE_VERIFY)
        with report.timed("digests"):
            report.positions = {k: int(v) for k, v in store.positions().items()}
            report.replay_digest = dict(store.table_digest())
            if shard_routing.has_projection(live_dir):
                live = open_live(live_dir, settings)
                report.live_digest = dict(live.table_digest())
                report.live_positions = {k: int(v) for k, v in live.positions().items()}

    await asyncio.get_running_loop().run_in_executor(executor, steps)
    with report.timed("verify"):
        await _verify_and_compare(store, executor, report, live_dir, settings)


async def _verify_and_compare(
    store: Any, executor: Executor, report: ReplayReport, live_dir: Path, settings: Settings
) -> None:
    verify_counts(report)
    if report.live_positions is not None and not report.compared:
        same = all(report.positions.get(k, 0) == v for k, v in report.live_positions.items()) and all(
            report.live_positions.get(k, 0) == v for k, v in report.positions.items()
        )
        if same:
            report.compared = True
            if report.differences:
                live = open_live(live_dir, settings)
                report.diverged = await asyncio.get_running_loop().run_in_executor(
                    executor, lambda: space_differences(space_digests(live), space_digests(store))
                )
    if report.diverged:
        log.warning(
            "the replay differs from the live set at the same log positions in %d table(s) of memory spaces%s",
            len(report.diverged), "; swapping it in as forced" if report.forced else "; not swapped",
        )


async def train_vector_index(settings: Settings, report: ReplayReport, on_phase: Callable[[str], None]) -> None:
    """Train the IVF_PQ index of the set just swapped in (readers already serve it)."""
    on_phase(PHASE_VECTOR_INDEX)
    with report.timed("vector_index"):
        store = await asyncio.to_thread(open_live, report.replay_dir, settings)
        await asyncio.to_thread(store.build_vector_index)
    report.vector_index_due = False
