"""Outcome providers: where the reflector gets outcomes that no producer sends.

Outcomes normally arrive as ``OutcomeObserved`` events from any producer. A provider
is the other path: the reflector polls it on a timer with *every* pending decision
(not only the subject some agent happens to run, the anchor's fault), and the provider
answers with the outcomes it can compute now. The reflector writes each one to the
outcomes topic, so every outcome that settles a decision is an event in the log.

One provider ships: :class:`PriceFileProvider`, closing prices from a CSV or Parquet
file with the columns ``date``, ``symbol``, ``close``:

* the entry is the first row of the subject dated on or after the decision's day
  (UTC); the exit is ``horizon_days`` rows later, horizons counting trading days,
  which are the rows of the file;
* an outcome is produced only when the exit row exists: a 5-day horizon is never
  settled on 1 day of data;
* the raw return is ``close[exit] / close[entry] - 1``; the benchmark's return is
  taken over the same dates (its last close on or before each), and the alpha is the
  difference. A benchmark not yet priced up to the exit date means "wait". A file with
  no benchmark rows at all gives outcomes without alpha (judged against cash);
* outcome ids are derived from the decision (:func:`provider_outcome_id`), so polling
  again yields the same outcome, never a second one.

The file is read off the event loop and re-read only when its size or modification
time changes.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timezone
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memstream.domain.events import DecisionRecorded, OutcomeObserved, build_event
from memstream.domain.reflection import provider_outcome_event_id, provider_outcome_id
from memstream.settings import Settings

__all__ = [
    "OutcomeProvider",
    "OutcomeProviderError",
    "PriceSeries",
    "PriceFileProvider",
    "load_price_file",
    "build_outcome_provider",
]


class OutcomeProviderError(RuntimeError):
    """A provider cannot answer (unreadable file, missing columns); one-line reason."""


@runtime_checkable
class OutcomeProvider(Protocol):
    """Computes outcomes for pending decisions.

    ``resolve`` receives every pending decision the reflector holds for a partition and
    returns the outcomes it can compute now (each naming its ``decision_id``); a
    decision it cannot settle yet is simply left out. It must be idempotent: asked
    twice, it returns the same outcome ids.
    """

    name: str

    async def resolve(
        self, decisions: Sequence[DecisionRecorded], now: datetime
    ) -> list[OutcomeObserved]: ...


@dataclass(frozen=True)
class PriceSeries:
    """One symbol's closes, sorted by date (``days`` are proleptic ordinals)."""

    symbol: str
    days: np.ndarray
    closes: np.ndarray

    def index_on_or_after(self, day: date) -> int:
        return int(np.searchsorted(self.days, day.toordinal(), side="left"))

    def close_as_of(self, day: date) -> float | None:
        """The last close dated on or before ``day``."""
        i = int(np.searchsorted(self.days, day.toordinal(), side="right")) - 1
        return float(self.closes[i]) if i >= 0 else None

    @property
    def last_day(self) -> date:
        return date.fromordinal(int(self.days[-1]))


def _column(table: pa.Table, name: str, path: Path) -> pa.ChunkedArray:
    for column in table.column_names:
        if column.strip().lower() == name:
            return table.column(column)
    raise OutcomeProviderError(
        f"{path}: no {name!r} column (need date, symbol, close; found {', '.join(table.column_names)})"
    )


def _as_dates(values: pa.ChunkedArray, path: Path) -> pa.ChunkedArray:
    kind = values.type
    try:
        if pa.types.is_date(kind):
            return values.cast(pa.date32())
        if pa.types.is_timestamp(kind):
            return pc.cast(values, pa.date32())
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            head = pc.utf8_slice_codeunits(values, 0, 10)
            return pc.cast(pc.strptime(head, format="%Y-%m-%d", unit="s"), pa.date32())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise OutcomeProviderError(f"{path}: cannot read the date column as YYYY-MM-DD: {exc}") from None
    raise OutcomeProviderError(f"{path}: the date column has type {kind}, expected a date or text")


def load_price_file(path: Path) -> dict[str, PriceSeries]:
    """Read a CSV (``.csv``, ``.csv.gz``) or Parquet (``.parquet``, ``.pq``) price file.

    Rows with an empty symbol, date or close, or a close that is not a positive finite
    number, are skipped; when a symbol has two rows for one date the later row in the
    file wins (a corrected price appended at the end replaces the old one).
    """
    name = path.name.lower()
    try:
        if name.endswith((".parquet", ".pq")):
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        elif name.endswith((".csv", ".csv.gz", ".txt")):
            import pyarrow.csv as pacsv

            table = pacsv.read_csv(
                path,
                convert_options=pacsv.ConvertOptions(
                    column_types={"symbol": pa.string(), "date": pa.string()},
                    strings_can_be_null=True,
                ),
            )
        else:
            raise OutcomeProviderError(f"{path}: unknown price file type (use .csv or .parquet)")
    except FileNotFoundError:
        raise OutcomeProviderError(f"{path}: no such price file") from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise OutcomeProviderError(f"{path}: cannot read prices: {exc}".splitlines()[0]) from None
    dates = _as_dates(_column(table, "date", path), path)
    symbols = _column(table, "symbol", path).cast(pa.string())
    try:
        closes = _column(table, "close", path).cast(pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise OutcomeProviderError(f"{path}: the close column is not numeric: {exc}") from None
    day_values = np.asarray(dates.cast(pa.int32()).to_numpy(zero_copy_only=False), dtype="float64")
    close_values = np.asarray(closes.to_numpy(zero_copy_only=False), dtype="float64")
    symbol_values = symbols.to_pylist()
    # date32 counts days since 1970-01-01; ordinals count from 0001-01-01.
    epoch = date(1970, 1, 1).toordinal()
    rows: dict[str, dict[int, float]] = {}
    for sym, day, close in zip(symbol_values, day_values, close_values):
        if sym is None or not sym.strip() or not math.isfinite(day):
            continue
        if not math.isfinite(close) or close <= 0:
            continue
        rows.setdefault(sym.strip(), {})[int(day) + epoch] = float(close)
    series: dict[str, PriceSeries] = {}
    for sym, by_day in rows.items():
        ordered = sorted(by_day)
        series[sym] = PriceSeries(
            symbol=sym,
            days=np.asarray(ordered, dtype=np.int64),
            closes=np.asarray([by_day[d] for d in ordered], dtype=np.float64),
        )
    return series


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time(0, 0), tzinfo=timezone.utc)


class PriceFileProvider:
    """Outcomes from a file of closing prices (see the module docstring)."""

    def __init__(
        self,
        path: Path | str,
        benchmark_symbol: str | None = "SPY",
        *,
        name: str = "prices",
        producer: str = "memstream.reflector",
    ) -> None:
        self.path = Path(path)
        self.benchmark_symbol = benchmark_symbol or None
        self.name = name
        self.producer = producer
        self._stamp: tuple[int, int] | None = None
        self._series: dict[str, PriceSeries] = {}
        self._lock = asyncio.Lock()

    async def prices(self) -> dict[str, PriceSeries]:
        """The file's series, re-read (in a thread) only when the file changed."""
        async with self._lock:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                raise OutcomeProviderError(f"{self.path}: no such price file") from None
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                self._series = await asyncio.to_thread(load_price_file, self.path)
                self._stamp = stamp
            return self._series

    def outcome_for(
        self, decision: DecisionRecorded, series: dict[str, PriceSeries], now: datetime
    ) -> OutcomeObserved | None:
        """The outcome of one decision, or ``None`` while the horizon is not covered."""
        prices = series.get(decision.subject)
        if prices is None or len(prices.days) == 0:
            return None
        entry = prices.index_on_or_after(decision.occurred_at.astimezone(timezone.utc).date())
        exit_ = entry + decision.horizon_days
        if exit_ >= len(prices.days):
            return None
        entry_day = date.fromordinal(int(prices.days[entry]))
        exit_day = date.fromordinal(int(prices.days[exit_]))
        raw = float(prices.closes[exit_] / prices.closes[entry] - 1.0)
        bench_return: float | None = None
        alpha: float | None = None
        bench = series.get(self.benchmark_symbol) if self.benchmark_symbol else None
        if self.benchmark_symbol and decision.subject == self.benchmark_symbol:
            bench_return, alpha = raw, 0.0
        elif bench is not None and len(bench.days):
            if bench.last_day < exit_day:
                return None  # the benchmark is not priced that far yet: wait
            start_close = bench.close_as_of(entry_day)
            end_close = bench.close_as_of(exit_day)
            if start_close is None or end_close is None:
                return None
            bench_return = end_close / start_close - 1.0
            alpha = raw - bench_return
        return build_event(
            OutcomeObserved,
            event_id=provider_outcome_event_id(self.name, decision.scope, decision.decision_id),
            occurred_at=_day_start(exit_day),
            recorded_at=now,
            scope=decision.scope,
            correlation_id=decision.decision_id,
            producer=f"{self.producer}/{self.name}",
            outcome_id=provider_outcome_id(self.name, decision.scope, decision.decision_id),
            decision_id=decision.decision_id,
            subject=decision.subject,
            raw_return=raw,
            benchmark_return=bench_return,
            alpha=alpha,
            horizon_days=decision.horizon_days,
            window_start=_day_start(entry_day),
            window_end=_day_start(exit_day),
            source=f"{self.name}:{self.path.name}"[:512],
        )

    async def resolve(
        self, decisions: Sequence[DecisionRecorded], now: datetime
    ) -> list[OutcomeObserved]:
        if not decisions:
            return []
        series = await self.prices()
        found = []
        for decision in decisions:
            outcome = self.outcome_for(decision, series, now)
            if outcome is not None:
                found.append(outcome)
        return found


def build_outcome_provider(settings: Settings) -> OutcomeProvider | None:
    """The provider the settings ask for: prices from ``outcome_prices_path`` if set."""
    if settings.worker.outcome_prices_path is None:
        return None
    return PriceFileProvider(settings.worker.outcome_prices_path, settings.worker.outcome_benchmark_symbol)
