"""Shared helpers of the evidence benchmarks (LoCoMo, Mem0, chaos).

Why one module: every benchmark here runs memstream *through its real path* (a Faust
worker process reading a real broker, LanceDB on disk) and reports figures the same
way, so the plumbing lives once:

* timing and percentiles (:func:`percentile`, :class:`LatencyLog`) computed the same
  way for every system compared;
* :class:`WorkerProcess`: ``python -m memstream.services.worker`` as a child process
  configured only through ``MEMSTREAM_*`` variables built from a :class:`Settings`
  (:func:`settings_env`), in its own working directory so no ``.env`` leaks in; it can
  be stopped gracefully, SIGKILLed and restarted (the chaos benchmark does);
* log offsets (:func:`group_offsets`, the end offsets a wait reads) and
  :func:`wait_caught_up`: "ingest is done" means the extractor has committed every turn
  and the projector's *stored* positions reached the end of both source topics;
* rich output: tables to stdout, progress bars to stderr (the JSON summary the CLI
  prints last stays the last line of stdout).

The scripted OpenAI-compatible model server the benchmarks (and the tests) share is
:mod:`memstream.bench.openai_fake`.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from memstream.services.extraction import consumer_group
from memstream.settings import Settings, settings_env
from memstream.streams.clients import create_admin, create_consumer
from memstream.streams.topics import Topics

__all__ = [
    "console",
    "err_console",
    "percentile",
    "LatencyLog",
    "progress_bar",
    "free_port",
    "table",
    "fmt",
    "settings_env",
    "WorkerProcess",
    "delete_topics",
    "group_offsets",
    "wait_caught_up",
    "CatchUp",
    "LogWatch",
]

console = Console(highlight=False, soft_wrap=False, width=120)
"""Tables and figures: stdout, where the CLI also prints the final JSON line."""
err_console = Console(stderr=True, highlight=False)
"""Progress bars and chatter: stderr, so stdout stays tables + one JSON line."""


# ------------------------------------------------------------------------------ figures
def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks
    (numpy's default "linear" method); ``nan`` for no values."""
    if not 0.0 <= q <= 100.0:
        raise ValueError("q must be within [0, 100]")
    if not values:
        return math.nan
    ordered = sorted(float(v) for v in values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class LatencyLog:
    """Wall-clock durations of repeated calls, in milliseconds."""

    samples_ms: list[float] = field(default_factory=list)

    @contextmanager
    def measure(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.samples_ms.append((time.perf_counter() - start) * 1000.0)

    def p(self, q: float) -> float:
        return percentile(self.samples_ms, q)

    @property
    def p50(self) -> float:
        return self.p(50)

    @property
    def p95(self) -> float:
        return self.p(95)


def fmt(value: Any, digits: int = 3) -> str:
    """A table cell: floats rounded, ``None``/``nan`` as a dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    """A rich table; numbers right-aligned."""
    t = Table(title=title, title_justify="left", show_lines=False)
    for i, name in enumerate(columns):
        t.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*(fmt(v) for v in row))
    return t


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def progress_bar() -> Progress:
    """A progress bar on stderr (stdout keeps only the tables and the JSON line), with
    the time left: these phases take minutes. Transient: it disappears when done."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    )


# ------------------------------------------------------------------------------ worker
class WorkerProcess:
    """One memstream worker (``python -m memstream.services.worker``) as a child process.

    The child gets a clean ``MEMSTREAM_*`` environment from ``settings`` and runs in
    ``workdir`` (its stdout and stderr go to ``workdir/worker.log``, appended across
    restarts), so benchmarks can kill and restart it and read what it said.
    """

    def __init__(
        self,
        settings: Settings,
        workdir: Path,
        *,
        services: Sequence[str] | None = None,
        loglevel: str = "warning",
        python: str | None = None,
    ) -> None:
        self.settings = settings
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.services = list(services) if services else None
        self.loglevel = loglevel
        self.python = python or sys.executable
        self.log_path = self.workdir / "worker.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.kills = 0

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")}
        env.update(settings_env(self.settings))
        env["PYTHONUNBUFFERED"] = "1"
        return env

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the worker (no-op while one runs)."""
        if self.alive():
            return
        cmd = [self.python, "-m", "memstream.services.worker", "--loglevel", self.loglevel]
        if self.services:
            cmd += ["--services", ",".join(self.services)]
        with open(self.log_path, "ab") as out:
            out.write(f"\n--- start {self.starts + 1} at {time.strftime('%H:%M:%S')}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                cmd, cwd=self.workdir, env=self._env(), stdout=out, stderr=subprocess.STDOUT
            )
        self.starts += 1

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (the crash the worker must survive)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.kills += 1

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout``); returns the exit code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._proc = None
        return proc.returncode

    def exit_code(self) -> int | None:
        """The exit code if the worker died by itself, else ``None``."""
        return self._proc.poll() if self._proc is not None else None

    def wait_log(self, needle: str, timeout: float = 120.0) -> None:
        """Wait until the worker's log (this start's part) contains ``needle``."""
        marker = f"--- start {self.starts} at"
        deadline = time.monotonic() + timeout
        while True:
            text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            if needle in text[text.rfind(marker):]:
                return
            if not self.alive():
                raise RuntimeError(f"the worker exited ({self.exit_code()}) before logging {needle!r}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the worker did not log {needle!r} within {timeout:g} s:\n{self.tail()}")
            time.sleep(0.1)

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


# ------------------------------------------------------------------------------ offsets
async def group_offsets(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """The offsets consumer group ``group`` committed (``{}`` if it has none)."""
    # raw on purpose: given only an address (the bench broker, plaintext)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {(tp.topic, tp.partition): int(meta.offset) for tp, meta in offsets.items() if meta.offset >= 0}


async def delete_topics(bootstrap: str, topics: Topics, app_id: str | None = None) -> list[str]:
    """Delete a private run's topics: every topic under ``topics.prefix`` and, with
    ``app_id``, Faust's internal topics of that app (``<app_id>-...``)."""
    # raw on purpose: given only an address (the bench broker, plaintext)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [
            t
            for t in await admin.list_topics()
            if t.startswith(topics.prefix) or (app_id is not None and t.startswith(f"{app_id}-"))
        ]
        if names:
            await admin.delete_topics(names)
        return names
    finally:
        await admin.close()


@dataclass(frozen=True)
class CatchUp:
    """Where a worker stands against the log at one moment."""

    message_ends: Mapping[tuple[str, int], int]
    event_ends: Mapping[tuple[str, int], int]
    projected: Mapping[tuple[str, int], int]
    extracted: Mapping[tuple[str, int], int]
    observed_at: float = 0.0
    """``time.perf_counter()`` when this state was read (the start of the reads)."""

    def behind(self, *, extraction: bool) -> int:
        """Records not yet projected (both topics), plus, with ``extraction``, turns
        not yet committed by the extractor."""
        lag = sum(max(0, end - self.projected.get(tp, 0)) for tp, end in {**self.message_ends, **self.event_ends}.items())
        if extraction:
            lag += self.extraction_lag()
        return lag

    def extraction_lag(self) -> int:
        """Turns not yet committed by the extractor."""
        return sum(max(0, end - self.extracted.get(tp, 0)) for tp, end in self.message_ends.items())


class LogWatch:
    """One consumer (end offsets) and one admin client (the extractor's commits), kept
    open across polls: connecting per poll took longer than the poll interval."""

    def __init__(self, settings: Settings) -> None:
        self.topics = Topics.from_settings(settings.broker)
        self.group = consumer_group(settings)
        self.consumer = create_consumer(settings.broker, client_id="memstream-bench-watch", enable_auto_commit=False)
        self.admin = create_admin(settings.broker, client_id="memstream-bench-watch")

    async def __aenter__(self) -> "LogWatch":
        await self.consumer.start()
        await self.admin.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()
        await self.admin.close()

    async def read(
        self, positions: Callable[[], Mapping[tuple[str, int], int]], *, extraction: bool = False
    ) -> CatchUp:
        """The log's ends, the extractor's commits and, unless extraction is still
        behind (then the work cannot be done yet), the stored positions: reading the
        LanceDB positions table is most of a poll's CPU, which the benchmark's process
        (its embedding server included) would otherwise take from the run it measures."""
        observed = time.perf_counter()
        tps: list[TopicPartition] = []
        for name in (self.topics.messages, self.topics.events):
            parts = self.consumer.partitions_for_topic(name)
            if not parts:
                await self.consumer._client.force_metadata_update()  # noqa: SLF001 - fresh topics
                parts = self.consumer.partitions_for_topic(name) or set()
            tps.extend(TopicPartition(name, p) for p in sorted(parts))
        ends = await self.consumer.end_offsets(tps) if tps else {}
        committed = await self.admin.list_consumer_group_offsets(self.group)
        state = CatchUp(
            message_ends={(tp.topic, tp.partition): int(o) for tp, o in ends.items() if tp.topic == self.topics.messages},
            event_ends={(tp.topic, tp.partition): int(o) for tp, o in ends.items() if tp.topic == self.topics.events},
            projected={},
            extracted={(tp.topic, tp.partition): int(m.offset) for tp, m in committed.items() if m.offset >= 0},
            observed_at=observed,
        )
        if extraction and state.extraction_lag():
            return state
        return replace(state, projected=dict(await asyncio.to_thread(positions)))


async def wait_caught_up(
    settings: Settings,
    positions: Callable[[], Mapping[tuple[str, int], int]],
    *,
    extraction: bool = True,
    timeout: float = 600.0,
    poll: float = 0.1,
    alive: Callable[[], bool] | None = None,
    on_poll: Callable[[CatchUp], None] | None = None,
    watch: LogWatch | None = None,
    settle_poll: float | None = None,
) -> CatchUp:
    """Wait until the worker has extracted every turn (its group committed the end of
    ``messages``) and projected everything (stored positions at the end of both
    topics), and a second look finds no new event (the extractor could have produced
    memories in between). Returns the *first* caught-up state of that streak: its
    ``observed_at`` is when the work was seen done; the second look only confirms it.
    Raises ``TimeoutError`` (or ``RuntimeError`` if ``alive()`` turns false) with the
    last state. ``watch``: a :class:`LogWatch` opened before the measured work starts
    (connecting its clients costs CPU the measured run should not share); without
    one, a watch is opened here. ``settle_poll``: the interval once extraction is
    done (with ``extraction``), when only the projection of its last events is left:
    a finer poll there finds the end closer to when it happened, at the cost of a
    few more reads of the positions."""
    if watch is None:
        async with LogWatch(settings) as own:
            return await wait_caught_up(
                settings, positions, extraction=extraction, timeout=timeout, poll=poll,
                alive=alive, on_poll=on_poll, watch=own, settle_poll=settle_poll,
            )
    deadline = time.monotonic() + timeout
    first: CatchUp | None = None
    while True:
        state = await watch.read(positions, extraction=extraction)
        if on_poll is not None:
            on_poll(state)
        if state.behind(extraction=extraction) == 0:
            if first is not None and dict(first.event_ends) == dict(state.event_ends):
                return first
            first = state
        else:
            first = None
        if alive is not None and not alive():
            raise RuntimeError(f"the worker died while catching up ({state.behind(extraction=extraction)} behind)")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the worker is still {state.behind(extraction=extraction)} records behind")
        interval = poll
        if settle_poll is not None and extraction and not state.extraction_lag():
            interval = settle_poll  # only the projection of extraction's last events is left
        await asyncio.sleep(interval)
