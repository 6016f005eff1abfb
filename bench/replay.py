"""``memstream bench replay``: rebuild throughput of ``memstream replay`` against the
raw ceiling.

The data and the ceilings are those of ``memstream bench projector`` (see
:mod:`memstream.bench.projector`), at 1,000,000 events (``--quick``: 100,000). The
product side is :func:`memstream.services.replay.rebuild.replay` itself, the function
behind ``memstream replay``: read both source topics from offset 0 with a plain
aiokafka consumer, decode and project every batch (10,000 records) through the same
path as the worker into a fresh table set, then optimise, fold the rows into the
FTS and scalar indexes, verify positions and digests, and swap the new set in. The
IVF_PQ vector index due at 100,000 memories is not trained by the replay: the worker's
maintenance trains it after the swap (searches are exact meanwhile), as on a live set
that crosses the threshold. ``phase_s``: the wall time split into the report's phases
(:data:`memstream.services.replay.report.PHASE_TIMES`), medians over the runs.

Two figures, both from the same call:

* ``replay_eps``: records / the build phase (first fetch to last batch written, the
  report's ``phase_s["read_project"]``): every row is queryable at its end, as for
  ``projector_eps``; its ``ratio`` to min(raw consume, raw LanceDB add) has the
  target >= 0.5;
* ``replay_end_to_end_eps``: records / the whole call (connect, build, optimise,
  index folds, digests of the new set, verification, swap): what an operator waits.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from typing import Any

from memstream.bench._events import (
    BenchWorkdir,
    bench_settings,
    machine_info,
    median,
    print_table,
    produce_log,
    progress_bar,
    status,
)
from memstream.bench.projector import cpu_figures, cpu_rows, measure_ceilings
from memstream.gc_tuning import tune_gc
from memstream.services.replay import PHASE_TIMES, ReplayProgress, replay
from memstream.settings import Settings

__all__ = ["run", "TARGET_RATIO", "DEFAULT_EVENTS", "QUICK_EVENTS", "measure_replay"]

TARGET_RATIO = 0.5
DEFAULT_EVENTS = 1_000_000
QUICK_EVENTS = 100_000


def measure_replay(settings: Settings, n: int, *, repeat: int) -> dict[str, Any]:
    """One real replay of the whole log into a fresh directory (then removed)."""
    base = settings.local_lance_dir.parent / f"replay-{repeat}"
    run_settings = settings.model_copy(update={"storage.root": base / "lance"})
    try:
        with progress_bar() as bar:
            task = bar.add_task(f"replay run {repeat + 1}", total=n)

            cpu_marks: list[float] = []

            def on_progress(p: ReplayProgress) -> None:
                # Called once before the first batch and after every batch: the CPU
                # time between the first and the last call is the build phase's.
                cpu_marks.append(time.process_time())
                bar.update(task, completed=p.done, total=max(p.total, 1))

            tune_gc()  # what `memstream replay` does first
            started = time.perf_counter()
            report = asyncio.run(replay(run_settings, on_progress=on_progress))
            wall = time.perf_counter() - started
        if report.records != n or report.applied != n or not report.swapped:
            raise RuntimeError(f"replay read {report.records}, applied {report.applied} of {n} events: {report.summary()}")
        memories = report.replay_digest.get("memories", (0, ""))[0]
        if memories != n:
            raise RuntimeError(f"replay built {memories} memories for {n} events")
        build_s = report.phase_s["read_project"]
        return {
            "eps": report.records / build_s,
            "end_to_end_eps": report.records / wall,
            "build_s": build_s,
            "phase_s": dict(report.phase_s),
            "wall_s": wall,
            "cpu_us": (cpu_marks[-1] - cpu_marks[0]) / n * 1e6,
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run(
    quick: bool = False,
    events: int | None = None,
    *,
    repeats: int | None = None,
    spaces: int = 16,
    keep: bool = False,
) -> dict[str, Any]:
    """Produce once, then measure the ceilings (3 samples each) and the replay
    (``repeats`` runs: 3 with ``--quick``, else 1) interleaved; print and return."""
    n = int(events or (QUICK_EVENTS if quick else DEFAULT_EVENTS))
    runs_wanted = int(repeats or (3 if quick else 1))
    if n < 1 or runs_wanted < 1:
        raise ValueError("events and repeats must be positive")
    machine = machine_info()
    with BenchWorkdir("replay", keep=keep) as wd:
        settings = wd.track(bench_settings(wd.path))
        log_ = produce_log(settings, n, spaces=spaces)
        corpus, produced, rows = log_.corpus, log_.produced, log_.rows
        del log_  # the unpacked names alone keep the rows alive (freed with `del rows`)
        ceilings: list[dict[str, float]] = []
        runs: list[dict[str, Any]] = []
        for r in range(max(3, runs_wanted)):
            status(f"round {r + 1}: raw consume, raw LanceDB add" + (", replay" if r < runs_wanted else ""))
            ceilings.append(measure_ceilings(settings, corpus, wd.path, repeat=r, rows=rows))
            if r < runs_wanted:
                runs.append(measure_replay(settings, n, repeat=r))
        del rows, corpus
    consume = [c["consume_eps"] for c in ceilings]
    add = [c["add_eps"] for c in ceilings]
    consume_eps, add_eps = median(consume), median(add)
    cpu_us = cpu_figures(ceilings, [x["cpu_us"] for x in runs], "replay")
    replay_eps = median(x["eps"] for x in runs)
    end_to_end = median(x["end_to_end_eps"] for x in runs)
    ceiling = min(consume_eps, add_eps)
    phases = {p: median(x["phase_s"].get(p, 0.0) for x in runs) for p in PHASE_TIMES if any(p in x["phase_s"] for x in runs)}
    ratio = replay_eps / ceiling
    result: dict[str, Any] = {
        "benchmark": "replay",
        "quick": quick,
        "events": n,
        "spaces": spaces,
        "dim": settings.embeddings.dim,
        "partitions": settings.broker.partitions,
        "repeats": runs_wanted,
        "record_bytes_avg": produced.bytes / produced.events,
        "produce_eps": produced.eps,
        "raw_consume_eps": consume_eps,
        "raw_lance_add_eps": add_eps,
        "replay_eps": replay_eps,
        "ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO,
        "replay_end_to_end_eps": end_to_end,
        "ratio_end_to_end": end_to_end / ceiling,
        "replay_build_s": median(x["build_s"] for x in runs),
        "replay_wall_s": median(x["wall_s"] for x in runs),
        "cpu_us_per_event": cpu_us,
        "phase_s": phases,
        "samples": {
            "raw_consume_eps": consume,
            "raw_lance_add_eps": add,
            "replay_eps": [x["eps"] for x in runs],
            "replay_end_to_end_eps": [x["end_to_end_eps"] for x in runs],
        },
        "machine": {**machine, "load_1m_end": machine_info()["load_1m"]},
    }
    print_table(
        f"memstream bench replay: {n:,} events, {spaces} spaces, {settings.embeddings.dim}-d "
        f"(ceilings: medians of {len(consume)}; replay: median of {runs_wanted})",
        [
            ("raw_consume_eps", f"{consume_eps:,.0f}", "aiokafka from offset 0, no decoding"),
            ("raw_lance_add_eps", f"{add_eps:,.0f}", "one LanceDB add of the same rows"),
            ("replay_eps", f"{replay_eps:,.0f}", "memstream replay, build phase (all rows written)"),
            ("ratio", f"{ratio:.3f}", f"target >= {TARGET_RATIO} ({'met' if ratio >= TARGET_RATIO else 'NOT met'})"),
            ("replay_end_to_end_eps", f"{end_to_end:,.0f}", "incl. optimise, index builds, digests, swap"),
            ("replay_wall_s", f"{result['replay_wall_s']:.1f}", f"read and project {result['replay_build_s']:.1f}s; phases:"),
            *((f"  {p}_s", f"{s:.2f}", "phase of the wall time (median)") for p, s in phases.items()),
            *cpu_rows(cpu_us, "replay"),
            ("produce_eps", f"{produced.eps:,.0f}", f"durable SDK producer, {result['record_bytes_avg']:,.0f} B/record"),
            ("load_1m", f"{machine['load_1m']} -> {result['machine']['load_1m_end']}", f"{machine['cores']} cores, shared"),
        ],
    )
    return result
