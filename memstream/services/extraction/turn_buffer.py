"""The scheduling half of the extractor, without Kafka: turns grouped per session, the
trigger rules (enough new turns, or idle; every turn due at once when no LLM is
configured), the turns kept after a failure (with back-off), and the offsets that are
safe to commit (never past a turn that has not been extracted)."""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from memstream.domain.events import MessageObserved, Scope
from memstream.domain.log import LogPosition
from memstream.domain.extraction.resume_marks import ResumeMark, WindowBudget, encode_mark
from memstream.services.extraction.run import ExtractionOutcome

__all__ = ["RECENT_IDS", "SessionKey", "TurnBuffer", "WindowJob"]


RECENT_IDS = 1_000
"""Turn ids remembered per session after extraction, to drop a turn sent twice."""


SessionKey = tuple[str, str, str, str]
"""``(team_id, user_id, agent_id, session_id or "")``: one conversation."""


@dataclass
class _Pending:
    message: MessageObserved
    position: LogPosition
    arrived: float
    kid: bytes | None = None


@dataclass
class _Session:
    key: SessionKey
    scope: Scope
    session_id: str | None
    pending: list[_Pending] = field(default_factory=list)
    history: deque[MessageObserved] = field(default_factory=deque)
    last_seen: float = 0.0
    in_flight: bool = False
    failures: int = 0
    retry_at: float = 0.0
    last_failure: str | None = None
    clock_from: float | None = None
    """When the retry budget of the window now at the head of ``pending`` began: its
    first attempt, or earlier, the moment it was ready while holding back its
    partition's commit (see :meth:`TurnBuffer.expired`)."""
    history_loaded: bool = False
    """Whether the turns before this buffer first saw the session were read from the
    projection into ``history`` (see :meth:`TurnBuffer.load_history`)."""
    pending_ids: set[str] = field(default_factory=set)
    recent_ids: dict[str, None] = field(default_factory=dict)
    kids: set[bytes] = field(default_factory=set)
    """The data keys the turns held here (pending and history) were sealed under."""
    serial: int = field(default_factory=itertools.count().__next__)
    """Tells this session from a later one of the same key (after a forget)."""


@dataclass(frozen=True)
class WindowJob:
    """One scheduled extraction: the session, its new turns (with their log positions)
    and the background turns. ``generation`` ties it to the partition assignment it was
    made under (a job of a revoked partition is not completed into the buffer)."""

    key: SessionKey
    scope: Scope
    session_id: str | None
    turns: tuple[MessageObserved, ...]
    positions: tuple[LogPosition, ...]
    background: tuple[MessageObserved, ...]
    generation: int
    trigger: Literal["turns", "idle", "flush"]
    attempt: int = 1
    final: bool = False
    """The last attempt (``max_attempts`` reached or the budget spent): the extractor
    falls back to the heuristic rather than fail."""
    budget_s: float | None = None
    """What is left of the window's retry budget."""
    load_history: bool = False
    """The session's earlier turns are not in memory yet (its first window since this
    buffer saw it): the caller may read them from the projection."""
    source_kids: frozenset[bytes] = frozenset()
    """The data keys of every turn the job shows the model (new and background): what
    it writes must not outlive them (:mod:`memstream.services.extraction.sources`)."""
    serial: int = -1


class TurnBuffer:
    """Turns waiting for extraction, per session, with the trigger rules.

    A session is due when it has ``min_new`` pending turns, or when it has any and no
    new turn arrived for ``idle_seconds``. A job takes at most ``max_new`` of the oldest
    pending turns plus up to ``max_background`` of the session's latest extracted turns.
    One job per session at a time. After a failed job its turns stay pending and the
    session waits ``backoff(failures)`` seconds before it is due again, but never past
    the window's retry budget (``retry_budget_s`` from its first attempt, or from when
    it was ready to run while holding back its partition's commit): the job that
    reaches ``max_attempts`` or the end of the budget is ``final`` (the extractor then
    stores the turns by its fallback instead of failing), and :meth:`expired` hands
    out the windows whose budget ran out while they waited, so no partition's commit
    stands still much longer than that budget.

    :meth:`safe_offsets` gives, per partition, the offset Kafka may commit: the lowest
    offset of any pending (or in-flight) turn, or one past the last record seen when
    nothing is pending. A restart therefore re-reads every turn not yet extracted.
    Each commit's mark also carries the budgets under way (:meth:`commit_marks`), and
    :meth:`resume` hands them back, so a window's attempts and budget survive a
    restart or a partition move. ``clock`` is monotonic seconds and ``wall`` Unix
    seconds (injectable for tests).
    """

    def __init__(
        self,
        *,
        min_new: int,
        idle_seconds: float,
        max_new: int,
        max_background: int,
        clock: Callable[[], float] = time.monotonic,
        backoff: Callable[[int], float] | None = None,
        max_attempts: int | None = None,
        retry_budget_s: float | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if min_new < 1 or max_new < 1:
            raise ValueError("min_new and max_new must be at least 1")
        self.min_new = min(min_new, max_new)
        self.idle_seconds = idle_seconds
        self.max_new = max_new
        self.max_background = max_background
        self.clock = clock
        self.backoff = backoff or (lambda failures: float(min(60.0, 2.0 ** min(failures, 6))))
        self.max_attempts = max_attempts
        self.retry_budget_s = retry_budget_s
        self.forget_after = max(3600.0, 10 * idle_seconds)
        """A session with nothing pending and no turn for this long is forgotten."""
        self.generation = 0
        self._sessions: dict[SessionKey, _Session] = {}
        self._seen: dict[tuple[str, int], int] = {}
        self._resume: dict[tuple[str, int], ResumeMark] = {}
        self._carried: dict[tuple[str, int], dict[int, WindowBudget]] = {}
        """Budgets the last commits carried, by partition and window head offset, until
        their windows are read again."""
        self._wall_offset = wall() - clock()
        """Unix time minus ``clock``: budgets are committed in Unix time."""

    # -- input -----------------------------------------------------------------------------
    @staticmethod
    def key_of(message: MessageObserved) -> SessionKey:
        s = message.scope
        return (s.team_id, s.user_id, s.agent_id, message.session_id or "")

    def observe(self, position: LogPosition) -> None:
        """Note a record that carries no turn (a dead letter, another event type)."""
        tp = (position.topic, position.partition)
        self._seen[tp] = max(self._seen.get(tp, 0), position.offset + 1)

    def add(self, message: MessageObserved, position: LogPosition, kid: bytes | None = None) -> bool:
        """Buffer one turn (``kid``: the data key it was sealed under); ``False`` when
        this turn id is already pending or was among the session's last
        :data:`RECENT_IDS` extracted turns (a producer retry sent it twice), in which
        case it is only observed."""
        self.observe(position)
        key = self.key_of(message)
        session = self._sessions.get(key)
        if session is None:
            session = _Session(
                key,
                message.scope,
                message.session_id,
                history=deque(maxlen=max(self.max_background, 1)),
            )
            self._sessions[key] = session
        mid = message.message_id
        if mid in session.pending_ids or mid in session.recent_ids:
            return False
        mark = self._resume.get((position.topic, position.partition))
        if kid is not None:
            session.kids.add(kid)
        if mark is not None and mark.done(position.offset):
            self._remember(session, message)  # extracted before a restart: background
            return False
        now = self.clock()
        session.pending.append(_Pending(message, position, now, kid))
        session.pending_ids.add(mid)
        session.last_seen = now
        if len(session.pending) == 1:
            self._continue_budget(session, position)
        return True

    def _continue_budget(self, session: _Session, head: LogPosition) -> None:
        """A window whose head turn a commit's mark gave a budget for goes on with it."""
        carried = self._carried.get((head.topic, head.partition))
        budget = carried.pop(head.offset, None) if carried else None
        if budget is not None and session.clock_from is None:
            session.failures = budget.failures
            session.clock_from = budget.started_at - self._wall_offset

    # -- scheduling --------------------------------------------------------------------------
    @property
    def pending_count(self) -> int:
        return sum(len(s.pending) for s in self._sessions.values())

    def sessions(self) -> int:
        return len(self._sessions)

    def due(self, *, flush: bool = False, limit: int | None = None, max_turns: int | None = None) -> list[WindowJob]:
        """Jobs for the sessions that should extract now (marks them in flight), at most
        ``limit`` of them, the longest-waiting first; with ``max_turns``, no further job
        once the jobs taken hold that many new turns (the first is always taken).
        ``flush`` makes every session with pending turns due (shutdown, tests)."""
        now = self.clock()
        jobs: list[WindowJob] = []
        if limit is not None and limit <= 0:
            return jobs
        order = sorted(
            self._sessions.items(),
            key=lambda kv: kv[1].pending[0].arrived if kv[1].pending else 0.0,
        )
        taken = 0
        for key, session in order:
            if limit is not None and len(jobs) >= limit:
                break
            if max_turns is not None and taken >= max_turns:
                break
            if not session.pending and not session.in_flight:
                if now - session.last_seen >= self.forget_after:
                    del self._sessions[key]  # a finished conversation: free its history
                continue
            if session.in_flight:
                continue
            if not flush and now < session.retry_at:
                continue
            trigger = self._trigger(session, now, flush)
            if trigger is None:
                continue
            job = self._take(session, trigger, now)
            taken += len(job.turns)
            jobs.append(job)
        return jobs

    def expired(self) -> list[WindowJob]:
        """Jobs (marked in flight) for the windows whose retry budget is spent although
        they are not running: backing off after a failure, or waiting for an
        extraction slot. Each is ``final`` with no budget left, so the extractor
        stores it by its fallback without a model call, and the caller runs it
        without waiting for a slot.

        A waiting window's budget starts once it is ready and holds back its
        partition's commit (its first pending turn is the partition's oldest): the
        budget then bounds how long any partition's commit stands still, while a
        window queued behind others of its own partition loses nothing by waiting
        (the commit moves meanwhile)."""
        if self.retry_budget_s is None:
            return []
        now = self.clock()
        self._start_holding_clocks(now)
        return [
            self._take(session, "flush", now)
            for session in list(self._sessions.values())
            if session.pending
            and not session.in_flight
            and session.clock_from is not None
            and now >= session.clock_from + self.retry_budget_s
        ]

    def _start_holding_clocks(self, now: float) -> None:
        """Start the budget of each partition's commit-holding window once it is ready."""
        holders: dict[tuple[str, int], tuple[int, _Session]] = {}
        for session in self._sessions.values():
            if session.pending:
                first = session.pending[0].position
                tp = (first.topic, first.partition)
                if tp not in holders or first.offset < holders[tp][0]:
                    holders[tp] = (first.offset, session)
        for _, session in holders.values():
            if session.clock_from is None and not session.in_flight and self._trigger(session, now, False):
                session.clock_from = now

    def _trigger(self, session: _Session, now: float, flush: bool) -> Literal["turns", "idle", "flush"] | None:
        if len(session.pending) >= self.min_new:
            return "turns"
        if now - session.last_seen >= self.idle_seconds:
            return "idle"
        return "flush" if flush else None

    def _take(self, session: _Session, trigger: Literal["turns", "idle", "flush"], now: float) -> WindowJob:
        """The job for ``session``'s head window (the session is then in flight)."""
        take = session.pending[: self.max_new]
        background = tuple(session.history)[-self.max_background :] if self.max_background else ()
        session.in_flight = True
        if session.clock_from is None:
            session.clock_from = now
        budget = None
        if self.retry_budget_s is not None:
            budget = max(0.0, session.clock_from + self.retry_budget_s - now)
        attempt = session.failures + 1
        final = (self.max_attempts is not None and attempt >= self.max_attempts) or budget == 0.0
        return WindowJob(
            key=session.key,
            scope=session.scope,
            session_id=session.session_id,
            turns=tuple(p.message for p in take),
            positions=tuple(p.position for p in take),
            background=background,
            generation=self.generation,
            trigger=trigger,
            attempt=attempt,
            final=final,
            budget_s=budget,
            load_history=not session.history_loaded,
            source_kids=frozenset(session.kids),
            serial=session.serial,
        )

    def complete(self, job: WindowJob, outcome: ExtractionOutcome) -> None:
        """Apply a finished job: consumed turns leave the buffer (and become background),
        kept turns stay pending; a failure schedules the session's retry."""
        session = self._live_session(job)
        if session is None:
            return  # the partition was revoked (the new owner re-reads the turns) or the subject forgotten
        session.in_flight = False
        if not outcome.ok:
            session.failures += 1
            session.last_failure = outcome.failure
            session.retry_at = self.clock() + self.backoff(session.failures)
            if self.retry_budget_s is not None and session.clock_from is not None:
                session.retry_at = min(session.retry_at, session.clock_from + self.retry_budget_s)
            return
        session.clock_from = None
        session.failures = 0
        session.last_failure = None
        session.retry_at = 0.0
        done = set(outcome.consumed)
        remaining: list[_Pending] = []
        for p in session.pending:
            mid = p.message.message_id
            if mid in done:
                session.pending_ids.discard(mid)
                self._remember(session, p.message)
            else:
                remaining.append(p)
        session.pending = remaining
        # A session's pending list may receive turns while its job runs: those stay.

    @staticmethod
    def _remember(session: _Session, message: MessageObserved) -> None:
        """An extracted turn: background for the session's next windows, and an id
        whose repeat is ignored."""
        session.history.append(message)
        session.recent_ids[message.message_id] = None
        if len(session.recent_ids) > RECENT_IDS:
            session.recent_ids.pop(next(iter(session.recent_ids)))

    def load_history(self, job: WindowJob, earlier: Sequence[MessageObserved]) -> tuple[MessageObserved, ...]:
        """Put ``earlier`` (the session's turns before this buffer saw it, read from
        the projection, oldest first) in front of its in-memory history, and return
        the job's background as it would have been had the buffer seen them all."""
        session = self._live_session(job)
        known = {m.message_id for m in job.background} | {m.message_id for m in job.turns}
        merged = [m for m in earlier if m.message_id not in known] + list(job.background)
        background = tuple(merged[-self.max_background :]) if self.max_background else ()
        if session is None:
            return background
        in_memory = list(session.history)
        ids = {m.message_id for m in in_memory}
        session.history.clear()
        for m in [m for m in earlier if m.message_id not in ids] + in_memory:
            session.history.append(m)
        session.history_loaded = True
        return background

    def resume(self, partition: tuple[str, int], mark: ResumeMark | None) -> None:
        """Read ``partition`` from its commit knowing which turns after it were
        extracted already (the mark its commit carried; ``None``: none)."""
        if mark is None:
            self._resume.pop(partition, None)
            self._carried.pop(partition, None)
        else:
            self._resume[partition] = mark
            self._carried[partition] = dict(mark.budgets)

    def commit_marks(self, offsets: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], str]:
        """The :mod:`~memstream.domain.extraction.resume_marks` metadata to commit with each of
        ``offsets``: which turns read after the offset are still pending."""
        pending: dict[tuple[str, int], list[int]] = {}
        budgets: dict[tuple[str, int], dict[int, WindowBudget]] = {}
        for tp, carried in self._carried.items():
            budgets[tp] = dict(carried)
        for session in self._sessions.values():
            for p in session.pending:
                pending.setdefault((p.position.topic, p.position.partition), []).append(p.position.offset)
            if session.pending and session.clock_from is not None and self.retry_budget_s is not None:
                head = session.pending[0].position
                started = round(session.clock_from + self._wall_offset, 3)
                budgets.setdefault((head.topic, head.partition), {})[head.offset] = WindowBudget(session.failures, started)
        marks: dict[tuple[str, int], str] = {}
        for tp, off in offsets.items():
            end, still = self._seen.get(tp, 0), pending.get(tp, [])
            earlier = self._resume.get(tp)
            if earlier is not None and earlier.end > end:
                # Not re-read yet since the restart: what the last mark said still holds.
                still = still + [o for o in earlier.pending if o >= end]
                end = earlier.end
            marks[tp] = encode_mark(off, end, still, budgets.get(tp))
        return marks

    def release(self, job: WindowJob) -> None:
        """A job that never ran (cancelled): its session may be scheduled again."""
        session = self._live_session(job)
        if session is not None:
            session.in_flight = False

    def _live_session(self, job: WindowJob) -> _Session | None:
        """The session ``job`` was taken from, if it is still the one buffered (not
        revoked since, nor forgotten and begun again)."""
        session = self._sessions.get(job.key)
        if session is None or job.generation != self.generation or session.serial != job.serial:
            return None
        return session

    def drop_subject(self, team_id: str, user_id: str) -> int:
        """Forget every session of one memory space (its data key was destroyed): its
        pending turns and history leave memory and are never extracted, jobs in flight
        for it complete into nothing, and the commit moves past its turns. Returns how
        many pending turns were dropped."""
        dropped = 0
        for key in [k for k in self._sessions if k[0] == team_id and k[1] == user_id]:
            dropped += len(self._sessions.pop(key).pending)
        return dropped

    def failing_sessions(self) -> dict[SessionKey, tuple[int, str | None]]:
        """Sessions whose last run failed: ``key -> (failures, last reason)``."""
        return {k: (s.failures, s.last_failure) for k, s in self._sessions.items() if s.failures}

    # -- offsets ----------------------------------------------------------------------------
    def safe_offsets(self) -> dict[tuple[str, int], int]:
        """``(topic, partition) -> offset`` Kafka may commit (see the class docstring)."""
        lowest: dict[tuple[str, int], int] = {}
        for session in self._sessions.values():
            for p in session.pending:
                tp = (p.position.topic, p.position.partition)
                if tp not in lowest or p.position.offset < lowest[tp]:
                    lowest[tp] = p.position.offset
        out = dict(self._seen)
        out.update(lowest)
        return out

    def read_offsets(self) -> dict[tuple[str, int], int]:
        """``(topic, partition) -> `` one past the last record read."""
        return dict(self._seen)

    def drop_partitions(self, partitions: Sequence[tuple[str, int]]) -> int:
        """Forget everything read from these partitions (revoked: their turns will be
        re-read from the committed offset by whoever owns them next). Returns how many
        pending turns were dropped. In-flight jobs become stale (see :meth:`complete`)."""
        gone = set(partitions)
        if not gone:
            return 0
        self.generation += 1
        dropped = 0
        for key in list(self._sessions):
            session = self._sessions[key]
            keep = [p for p in session.pending if (p.position.topic, p.position.partition) not in gone]
            dropped += len(session.pending) - len(keep)
            session.pending = keep
            session.pending_ids = {p.message.message_id for p in keep}
            session.in_flight = False
            if not keep:
                session.clock_from = None
                session.failures = 0
            if not session.pending and not session.history:
                del self._sessions[key]
        for tp in gone:
            self._seen.pop(tp, None)
            self._resume.pop(tp, None)
            self._carried.pop(tp, None)
        return dropped
