"""What a replay reports: progress while it reads, the verified outcome when it is done
(counts, positions, digests of the new and the live set, their differences), and a
rich progress bar for the CLI."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from memstream.services.replay.diff import SpaceDiff

__all__ = ["ReplayProgress", "ReplayReport", "RichProgress", "TableDiff", "PHASE_TIMES"]

PHASE_TIMES = (
    "connect", "read_project", "compare", "catch_up", "wait_pause", "optimize",
    "base_indexes", "vector_index", "digests", "verify", "swap", "close",
)
"""Where a replay's wall time goes (``ReplayReport.phase_s``), in order: open the
consumer, keys and new set; read and project the log; compare with the live set at its
positions; catch up with a running worker; wait for it to pause; compact; the FTS and
scalar indexes; the IVF_PQ index (when one is due and the replay builds it); digests of
the new and live sets; verification; the swap; closing the clients."""


@dataclass(frozen=True)
class ReplayProgress:
    done: int
    total: int
    elapsed_s: float

    @property
    def rate(self) -> float:
        return self.done / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True)
class TableDiff:
    table: str
    live: tuple[int, str] | None
    replay: tuple[int, str] | None


@dataclass
class ReplayReport:
    live_dir: Path
    replay_dir: Path
    old_dir: Path | None = None
    swapped: bool = False
    dry_run: bool = False
    records: int = 0
    expected_records: int = 0
    applied: int = 0
    skipped: int = 0
    dead_decode: int = 0
    dead_project: int = 0
    misrouted: int = 0
    """Records off their key's partition: not projected where they are (their copy on
    the right partition is); re-published by the replay when the live worker had not
    reached them yet (``rerouted``)."""
    rerouted: int = 0
    unreadable: int = 0
    """Sealed records under a forgotten key: skipped (their subject was forgotten)."""
    end_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    positions: dict[tuple[str, int], int] = field(default_factory=dict)
    replay_digest: dict[str, tuple[int, str]] = field(default_factory=dict)
    live_digest: dict[str, tuple[int, str]] | None = None
    live_positions: dict[tuple[str, int], int] | None = None
    elapsed_s: float = 0.0
    vector_index_due: bool = False
    """The new set is big enough for its IVF_PQ index and has none yet: the worker's
    maintenance trains it (or the replay did, after the swap, when asked to)."""
    phase_s: dict[str, float] = field(default_factory=dict)
    """Seconds per phase of :data:`PHASE_TIMES` (those that ran), summing to about ``elapsed_s``."""
    forced: bool = False
    """``--force``: swap in even a set that diverges from live (``diverged``)."""
    compared: bool = False
    """Whether the new set was compared with the live one at the same positions."""
    diverged: list[SpaceDiff] = field(default_factory=list)
    """Where the two differ at the same positions: what the log does not explain."""

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Add the time the block takes to ``phase_s[phase]``."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.phase_s[phase] = self.phase_s.get(phase, 0.0) + time.monotonic() - started

    @property
    def swappable(self) -> bool:
        return not self.diverged or self.forced

    @property
    def ok(self) -> bool:
        """What the exit code says: no divergence from live, or one swapped in by force."""
        return not self.diverged or (self.forced and self.swapped)

    @property
    def differences(self) -> list[TableDiff]:
        """Tables whose row count or digest differ between live and replay."""
        if self.live_digest is None:
            return []
        tables = sorted(set(self.live_digest) | set(self.replay_digest))
        return [
            TableDiff(t, self.live_digest.get(t), self.replay_digest.get(t))
            for t in tables
            if self.live_digest.get(t) != self.replay_digest.get(t)
        ]

    @property
    def live_matches(self) -> bool | None:
        """True when the live set equals the replay, None when there is no live set."""
        return None if self.live_digest is None else not self.differences

    @property
    def rate(self) -> float:
        return self.records / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> str:
        """One line for people."""
        if self.live_digest is None:
            compare = "no live set to compare"
        elif not self.differences:
            compare = "live set identical"
        else:
            parts = []
            for d in self.differences:
                live = d.live[0] if d.live else "-"
                new = d.replay[0] if d.replay else "-"
                parts.append(f"{d.table} {live}->{new}")
            compare = "differs from live: " + ", ".join(parts)
        dead = self.dead_decode + self.dead_project
        if self.diverged:
            where = ", ".join(str(d) for d in self.diverged[:8]) + (", ..." if len(self.diverged) > 8 else "")
            compare += f"; DIVERGES from live at the same positions: {where}"
        if self.swapped:
            action = ("FORCED: " if self.diverged else "") + (
                f"swapped in (the replaced set {self.old_dir} is removed by the next replay)"
            )
        elif self.dry_run:
            action = "dry run, new set removed"
        else:
            action = "NOT swapped in, new set removed (`--force` swaps a diverging set in)"
        return (
            f"replayed {self.records} records in {self.elapsed_s:.1f}s ({self.rate:.0f}/s): "
            f"{self.applied} applied, {dead} dead letters"
            + (f", {self.unreadable} of forgotten subjects skipped" if self.unreadable else "")
            + f"; verified; {compare}; {action}"
            + ("; the vector index is due: the worker's maintenance trains it" if self.vector_index_due and self.swapped else "")
        )


class RichProgress:
    """A rich progress bar (records/s, time left from the end offsets) as a callback."""

    def __init__(self, description: str = "replay") -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:>8.0f} events/s"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            transient=False,
        )
        self._description = description
        self._task = self._progress.add_task(description, total=None, rate=0.0)

    def __enter__(self) -> "RichProgress":
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def __call__(self, p: ReplayProgress) -> None:
        self._progress.update(self._task, completed=p.done, total=max(p.total, 1), rate=p.rate)

    def phase(self, name: str) -> None:
        """Show the step after the build (the bar is full by then; elapsed time runs on)."""
        self._progress.update(self._task, description=f"{self._description}: {name}")
