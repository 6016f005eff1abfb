"""``memstream bench projector``: how close the real worker gets to the raw ceiling.

One run, one data set: ``N`` ``MemoryAdded`` events (default 200,000; ``--quick``
20,000) carrying 384-d embeddings of the configured model (so nothing is re-embedded)
are produced to a fresh topic prefix over 16 memory spaces. Then, interleaved
``repeats`` times on that same topic:

* ``raw_consume_eps``: aiokafka reading the topic from offset 0 to its end, decoding
  nothing (:func:`memstream.bench._events.raw_consume`);
* ``raw_lance_add_eps``: one LanceDB bulk ``add`` of the very rows the projector
  writes for these events into a fresh table;
* ``projector_eps``: the real worker (``python -m memstream.services.worker --services
  projector``, a subprocess with the product's default batch size, batch time and
  maintenance cadence) on a fresh LanceDB directory and consumer group, from the
  moment it has sought its partitions to offset 0 until a separate reader counts all
  ``N`` rows in ``memories``. Its start-up (imports, group join) is reported apart as
  ``projector_startup_s``, and ``projector_eps_incl_startup`` includes it.

``ratio`` = median ``projector_eps`` / min(median ``raw_consume_eps``, median
``raw_lance_add_eps``); the target is >= 0.5. On two cores that share the broker the
projector has to both consume and write, so the honest ceiling is the serial one:
``serial_ceiling_eps`` = 1 / (1 / ``raw_consume_eps`` + 1 / ``raw_lance_add_eps``), and
``serial_ratio`` = ``projector_eps`` / ``serial_ceiling_eps`` (long-term target 0.5).
Every sample is in the JSON too.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import lancedb

from memstream.bench._events import (
    BenchWorkdir,
    Corpus,
    WorkerProcess,
    bench_settings,
    machine_info,
    median,
    print_table,
    produce_log,
    progress_bar,
    raw_consume,
    raw_lance_add,
    status,
    wait_for_count,
)
from memstream.services.projector.service import BATCH_SIZE as PROJECTOR_BATCH_SIZE
from memstream.settings import Settings

__all__ = [
    "run",
    "TARGET_RATIO",
    "DEFAULT_EVENTS",
    "QUICK_EVENTS",
    "measure_projector",
    "measure_ceilings",
    "cpu_figures",
    "cpu_rows",
]

TARGET_RATIO = 0.5
DEFAULT_EVENTS = 200_000
QUICK_EVENTS = 20_000


def measure_ceilings(settings: Settings, corpus: Corpus, workdir: Path, *, repeat: int, rows: Any) -> dict[str, float]:
    """One sample of each raw ceiling: events/s and CPU microseconds per event of the
    consume and of the LanceDB add."""
    n = len(corpus)
    topic = f"{settings.broker.topic_prefix}events"
    consumed = asyncio.run(raw_consume(settings, topic, n))
    target = workdir / f"raw-add-{repeat}"
    try:
        seconds, cpu = raw_lance_add(rows, target)
    finally:
        shutil.rmtree(target, ignore_errors=True)
    return {
        "consume_eps": consumed.eps,
        "consume_cpu_us": consumed.cpu_s / n * 1e6,
        "add_eps": n / seconds,
        "add_cpu_us": cpu / n * 1e6,
    }


def cpu_figures(ceilings: list[dict[str, float]], product_cpu_us: list[float], name: str) -> dict[str, float | None]:
    """CPU microseconds per event (medians): a load-independent view of the same
    comparison, since on a shared machine wall-clock rates follow the neighbours."""
    consume = median(c["consume_cpu_us"] for c in ceilings)
    add = median(c["add_cpu_us"] for c in ceilings)
    measured = [x for x in product_cpu_us if x > 0]  # 0: below the CPU clock's resolution
    product = median(measured) if measured else None
    return {
        "raw_consume": consume,
        "raw_lance_add": add,
        name: product,
        "cpu_ratio": None if product is None else max(consume, add) / product,
    }


def cpu_rows(cpu_us: dict[str, float | None], name: str) -> list[tuple[str, str, str]]:
    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:,.1f}"

    return [
        (
            "cpu_us_per_event",
            f"{fmt(cpu_us[name])}",
            f"{name}; raw consume {fmt(cpu_us['raw_consume'])}, raw add {fmt(cpu_us['raw_lance_add'])}",
        ),
        (
            "cpu_ratio",
            "-" if cpu_us["cpu_ratio"] is None else f"{cpu_us['cpu_ratio']:.3f}",
            "max(raw CPU/event) / product CPU/event (load-independent)",
        ),
    ]


def measure_projector(settings: Settings, workdir: Path, n: int, *, repeat: int) -> dict[str, Any]:
    """One run of the real worker over the whole topic into a fresh table set."""
    run_settings = settings.model_copy(
        update={
            "lance_dir": workdir / f"lance-{repeat}",
            "home": workdir / f"home-{repeat}",
            "app_id": f"{settings.worker.app_id}-r{repeat}",
        }
    )
    worker = WorkerProcess(run_settings, workdir / f"worker-{repeat}")
    worker.start()
    try:
        ready = worker.wait_ready()
        cpu_ready = worker.cpu_seconds()
        with progress_bar() as bar:
            task = bar.add_task(f"worker run {repeat + 1}", total=n)
            done = wait_for_count(
                run_settings.storage.root,
                n,
                alive=worker.check_alive,
                on_count=lambda c: bar.update(task, completed=c),
            )
        cpu = worker.cpu_seconds()
    finally:
        worker.stop()

    final = lancedb.connect(str(run_settings.storage.root)).open_table("memories").count_rows()
    if final != n:
        raise RuntimeError(f"the worker wrote {final} memories for {n} events")
    shutil.rmtree(run_settings.local_lance_dir, ignore_errors=True)
    shutil.rmtree(run_settings.home, ignore_errors=True)
    busy = None if cpu is None or cpu_ready is None else cpu - cpu_ready
    if busy is not None and busy <= 0:
        busy = None  # shorter than the CPU clock's tick (a small smoke run): not measured
    return {
        "eps": n / (done - ready),
        "eps_incl_startup": n / (done - worker.started_at),
        "startup_s": ready - worker.started_at,
        "cpu_s": busy,
        "cpu_us": None if busy is None else busy / n * 1e6,
        "wall_s": done - ready,
    }


def run(
    quick: bool = False,
    events: int | None = None,
    *,
    repeats: int = 3,
    spaces: int = 16,
    keep: bool = False,
) -> dict[str, Any]:
    """Produce, measure the ceilings and the worker ``repeats`` times (interleaved, so
    every sample sees similar machine load), print a table, return the figures."""
    n = int(events or (QUICK_EVENTS if quick else DEFAULT_EVENTS))
    if n < 1 or repeats < 1:
        raise ValueError("events and repeats must be positive")
    machine = machine_info()
    with BenchWorkdir("projector", keep=keep) as wd:
        settings = wd.track(bench_settings(wd.path))
        log_ = produce_log(settings, n, spaces=spaces)
        corpus, produced, rows = log_.corpus, log_.produced, log_.rows
        del log_  # the unpacked names alone keep the rows alive (freed with `del rows`)
        ceilings, runs = [], []
        for r in range(repeats):
            status(f"round {r + 1}/{repeats}: raw consume, raw LanceDB add, worker")
            ceilings.append(measure_ceilings(settings, corpus, wd.path, repeat=r, rows=rows))
            runs.append(measure_projector(settings, wd.path, n, repeat=r))
        del rows
    result = _result(quick, n, spaces, repeats, settings, produced, ceilings, runs, machine)
    _print(result, settings, spaces, repeats)
    return result


def _result(
    quick: bool, n: int, spaces: int, repeats: int, settings: Settings, produced: Any,
    ceilings: list[dict[str, float]], runs: list[dict[str, Any]], machine: dict[str, Any],
) -> dict[str, Any]:
    """The benchmark's JSON figures from its samples."""
    consume = [c["consume_eps"] for c in ceilings]
    add = [c["add_eps"] for c in ceilings]
    consume_eps, add_eps = median(consume), median(add)
    cpu_us = cpu_figures(ceilings, [x["cpu_us"] for x in runs if x["cpu_us"] is not None], "projector")
    projector_eps = median(x["eps"] for x in runs)
    ratio = projector_eps / min(consume_eps, add_eps)
    serial_ceiling = 1 / (1 / consume_eps + 1 / add_eps)
    serial_ratio = projector_eps / serial_ceiling
    cpu_per_wall = [c / x["wall_s"] for x in runs if (c := x["cpu_s"]) is not None and x["wall_s"]]
    return {
        "benchmark": "projector",
        "quick": quick,
        "events": n,
        "spaces": spaces,
        "dim": settings.embeddings.dim,
        "partitions": settings.broker.partitions,
        "repeats": repeats,
        "record_bytes_avg": produced.bytes / produced.events,
        "produce_eps": produced.eps,
        "raw_consume_eps": consume_eps,
        "raw_lance_add_eps": add_eps,
        "projector_eps": projector_eps,
        "ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO,
        "serial_ceiling_eps": serial_ceiling,
        "serial_ratio": serial_ratio,
        "projector_startup_s": median(x["startup_s"] for x in runs),
        "projector_eps_incl_startup": median(x["eps_incl_startup"] for x in runs),
        "worker_cpu_per_wall": median(cpu_per_wall) if cpu_per_wall else None,
        "cpu_us_per_event": cpu_us,
        "samples": {
            "raw_consume_eps": consume,
            "raw_lance_add_eps": add,
            "projector_eps": [x["eps"] for x in runs],
        },
        "settings": {
            "projector_batch_size": PROJECTOR_BATCH_SIZE,
            "projector_batch_seconds": settings.worker.projector_batch_seconds,
            "optimize_every_s": settings.storage.optimize_every_s,
        },
        "machine": {**machine, "load_1m_end": machine_info()["load_1m"]},
    }


def _print(result: dict[str, Any], settings: Settings, spaces: int, repeats: int) -> None:
    n, machine, cpu_us = result["events"], result["machine"], result["cpu_us_per_event"]
    consume_eps, add_eps = result["raw_consume_eps"], result["raw_lance_add_eps"]
    projector_eps, ratio = result["projector_eps"], result["ratio"]
    serial_ceiling, serial_ratio = result["serial_ceiling_eps"], result["serial_ratio"]
    produced_eps = result["produce_eps"]
    print_table(
        f"memstream bench projector: {n:,} events, {spaces} spaces, {settings.embeddings.dim}-d (medians of {repeats})",
        [
            ("raw_consume_eps", f"{consume_eps:,.0f}", "aiokafka from offset 0, no decoding"),
            ("raw_lance_add_eps", f"{add_eps:,.0f}", "one LanceDB add of the same rows"),
            ("projector_eps", f"{projector_eps:,.0f}", "worker subprocess, seek to all rows counted"),
            ("ratio", f"{ratio:.3f}", f"target >= {TARGET_RATIO} ({'met' if ratio >= TARGET_RATIO else 'NOT met'})"),
            ("serial_ceiling_eps", f"{serial_ceiling:,.0f}", "1 / (1/raw_consume_eps + 1/raw_lance_add_eps)"),
            ("serial_ratio", f"{serial_ratio:.3f}", "projector_eps / serial_ceiling_eps (consume and write on one core)"),
            ("projector_startup_s", f"{result['projector_startup_s']:.1f}", "process start to partitions assigned"),
            ("projector_eps_incl_startup", f"{result['projector_eps_incl_startup']:,.0f}", "from process start"),
            (
                "worker_cpu_per_wall",
                "-" if result["worker_cpu_per_wall"] is None else f"{result['worker_cpu_per_wall']:.2f}",
                "CPU s per s of the worker + its decoder process (1.0 = one core)",
            ),
            *cpu_rows(cpu_us, "projector"),
            ("produce_eps", f"{produced_eps:,.0f}", f"durable SDK producer, {result['record_bytes_avg']:,.0f} B/record"),
            ("load_1m", f"{machine['load_1m']} -> {result['machine']['load_1m_end']}", f"{machine['cores']} cores, shared"),
        ],
    )
