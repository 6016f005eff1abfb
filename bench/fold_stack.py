"""The fold machine's stack: the real broker, a sealed log, worker processes projecting
into LanceDB, and the API's read path, driven step by step and compared, after each
step, with the reference model (:mod:`memstream.domain.fold`).

:class:`FoldStack` owns the parts and one method per step (write a memory, a turn, a
link, a decision or an outcome as one of several agents, users and teams; forget a
user or a team; replay; kill, start or add a worker; a ``min_position`` read under
concurrent writes). It keeps the log it wrote in the order the broker acknowledged
it, which is the model's input (the steps run one at a time, so a space's events are
in its partition's order and a turn lands where it was written relative to them).
:meth:`FoldStack.check` waits until the worker has projected the whole log, then
reads every space through every read scope and lists each answer that differs
from the model's. The stateful test (``tests/bench/test_fold.py``) lets hypothesis
choose the steps; ``memstream bench fold`` (:mod:`memstream.bench.fold`) chooses
them at random for a given time.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

from memstream.bench._common import WorkerProcess
from memstream.domain.access import ReadScope
from memstream.domain.events import (
    DecisionRecorded,
    EventBase,
    MemoryAdded,
    MemoryLinked,
    MessageObserved,
    OutcomeObserved,
    Scope,
    SubjectForgotten,
    build_event,
)
from memstream.domain.fold import Folded, MemoryAnswer, fold
from memstream.domain.log import LogPosition, PositionedEvent
from memstream.interfaces.service import MemoryService
from memstream.projections.search import SearchFilters
from memstream.services.replay import ReplayError, replay
from memstream.settings import Settings
from memstream.streams.admin import ensure_topics
from memstream.streams.clients import KafkaConsumer, create_consumer
from memstream.streams.sealing.forget import forget
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.records.codec import read_record
from memstream.streams.sealing.sealed_records import RecordOpener
from memstream.streams.topics import Topics, topic_for

__all__ = ["TEAMS", "USERS", "AGENTS", "SPACES", "MEMORY_IDS", "TURN_IDS", "LINK_IDS", "DECISION_IDS", "ENTITIES",
           "RELATIONS", "FoldStack", "Mismatch", "stack_settings"]

TEAMS = ("t1", "t2")
USERS = ("u1", "u2")
AGENTS = ("a1", "a2")
SPACES = tuple((t, u) for t in TEAMS for u in USERS)
MEMORY_IDS = ("m0", "m1", "m2", "m3")
TURN_IDS = ("c0", "c1", "c2")
LINK_IDS = ("l0", "l1", "l2")
DECISION_IDS = ("d0", "d1")
ENTITIES = ("Ada Lovelace", "Bo")
RELATIONS = ("supersedes", "contradicts", "duplicates", "same_entity")
"""Small id pools on purpose: ids collide across agents, spaces and teams, so
ownership, isolation and rewrites are exercised on every run."""

CATCH_UP_S = 120.0
"""Upper bound of a wait for the worker to project the log (a hung stack fails the
step instead of hanging it; nothing is asserted about time)."""


def stack_settings(base: Settings, root: Path, **overrides: Any) -> Settings:
    """The machine's settings: sealed (forget needs keys), a small local embedder,
    short batches, the readers' grace short enough for shredding to happen, and (for a
    sharded group) the broker's shortest session timeout, so that a worker's shards
    move soon after it left."""
    values: dict[str, Any] = dict(
        sealing=True, embedder="local", embedding_dim=32, projector_batch_seconds=0.05,
        optimize_every_s=2.0, reader_grace_s=2.0, read_wait_max_s=60.0, reflection_poll_seconds=0.5,
        worker_session_timeout_s=6.0, lance_dir=root / "lance", home=root / "home",
    )
    values.update(overrides)
    return base.model_copy(update=values)


@dataclass(frozen=True)
class Mismatch:
    """One read that differs from the model's answer."""

    step: int
    read: str
    expected: Any
    got: Any

    def __str__(self) -> str:
        return f"step {self.step}: {self.read}: expected {self.expected!r}, got {self.got!r}"


@dataclass
class FoldStack:
    """The stack under test and the log it wrote (see the module docstring)."""

    settings: Settings
    workdir: Path
    service: MemoryService | None = None
    workers: list[WorkerProcess] = field(default_factory=list)
    log: list[tuple[EventBase, LogPosition | None]] = field(default_factory=list)
    """What the machine wrote, in the order the broker acknowledged it (turns have no
    place in the events topic's order: ``None`` for a position the merge ignores)."""
    worker_log: dict[tuple[int, int], EventBase] = field(default_factory=dict)
    """What the workers wrote to the events topic (lessons, expiries), by (partition, offset)."""
    keys: SubjectKeys | None = None
    _consumer: KafkaConsumer | None = None
    _read_to: dict[int, int] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)
    reads: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _counter: itertools.count = field(default_factory=itertools.count)  # type: ignore[type-arg]

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.keys = SubjectKeys(self.settings.streams, client_id="fold-machine-keys")
        await self.keys.start()
        self._consumer = create_consumer(self.settings.broker, client_id="fold-machine", group_id=None,
                                         enable_auto_commit=False)
        await self._consumer.start()
        self.workers.append(self._worker("w0"))
        self.workers[0].start()
        # the service opens the table set the worker makes
        deadline = time.monotonic() + CATCH_UP_S
        while True:
            service = MemoryService(self.settings, client_id="fold-machine")
            try:
                await service.start()
            except Exception:  # noqa: BLE001 - the worker has not made its tables yet
                self._alive_or_raise()
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.3)
                continue
            if service.has_store:
                self.service = service
                return
            await service.stop()
            await asyncio.sleep(0.3)

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.stop()
            self.service = None
        for w in self.workers:
            w.stop()
        if self._consumer is not None:
            await self._consumer.stop()
        if self.keys is not None:
            await self.keys.stop()

    def _worker(self, instance: str) -> WorkerProcess:
        settings = self.settings
        if settings.storage.sharded:
            settings = settings.model_copy(update={"worker.instance": instance})
        return WorkerProcess(settings, self.workdir / instance, services=["projector", "reflector"])

    def _alive_or_raise(self) -> None:
        for w in self.workers:
            if w.exit_code() not in (None, 0) and w.starts:
                raise RuntimeError(f"worker exited with {w.exit_code()}:\n{w.tail()}")

    @property
    def serving(self) -> bool:
        """Whether a worker projects (reads are only compared then)."""
        return any(w.alive() for w in self.workers)

    def _svc(self) -> MemoryService:
        assert self.service is not None
        return self.service

    # ------------------------------------------------------------------ writes
    def _scope(self, space: int, agent: str) -> Scope:
        team, user = SPACES[space]
        return Scope(team_id=team, user_id=user, agent_id=agent)

    async def _write(self, event: EventBase) -> LogPosition:
        position = await self._svc().append(event, interface="api")
        self.log.append((event, position))
        return position

    async def memory(self, space: int, agent: str, memory_id: str, entity: str | None = None,
                     evidence: str | None = None) -> LogPosition:
        n = next(self._counter)
        scope = self._scope(space, agent)
        self.steps.append(f"memory {scope.space}/{agent} {memory_id} #{n}")
        event = build_event(
            MemoryAdded, scope=scope, memory_id=memory_id,
            content=f"{agent} of {scope.space} noted fact {n} about {entity or 'nothing'}",
            entities=[{"name": entity, "kind": "person"}] if entity else [],
            source_message_ids=[evidence] if evidence else [],
        )
        return await self._write(event)

    async def turn(self, space: int, agent: str, message_id: str) -> None:
        n = next(self._counter)
        scope = self._scope(space, agent)
        self.steps.append(f"turn {scope.space}/{agent} {message_id} #{n}")
        await self._write(build_event(MessageObserved, scope=scope, message_id=message_id, content=f"{agent} said {n}"))

    async def link(self, space: int, agent: str, link_id: str, frm: str, to: str, relation: str) -> None:
        if frm == to:
            return
        scope = self._scope(space, agent)
        self.steps.append(f"link {scope.space}/{agent} {link_id} {frm} -{relation}-> {to}")
        await self._write(build_event(
            MemoryLinked, scope=scope, link_id=link_id, from_memory_id=frm, to_memory_id=to, relation=relation
        ))

    async def decision(self, space: int, agent: str, decision_id: str) -> None:
        scope = self._scope(space, agent)
        self.steps.append(f"decision {scope.space}/{agent} {decision_id}")
        await self._write(build_event(
            DecisionRecorded, scope=scope, decision_id=decision_id, subject="ACME", rating="buy",
            decision_text=f"{agent} buys ACME", deadline=datetime.now(timezone.utc) + timedelta(days=30),
        ))

    async def outcome(self, space: int, agent: str, decision_id: str) -> None:
        n = next(self._counter)
        scope = self._scope(space, agent)
        self.steps.append(f"outcome {scope.space}/{agent} {decision_id}")
        await self._write(build_event(
            OutcomeObserved, scope=scope, outcome_id=f"o{n}", decision_id=decision_id, subject="ACME",
            raw_return=0.01 * (n % 7), horizon_days=5,
        ))

    async def forget(self, space: int, whole_team: bool) -> None:
        team, user = SPACES[space]
        self.steps.append(f"forget {team}/{'*' if whole_team else user}")
        report = await forget(self.settings.streams, team, None if whole_team else user)
        for subject, position in zip(report.forgotten, report.positions):
            event = SubjectForgotten(scope=Scope(team_id=subject.team_id, user_id=subject.user_id), whole_team=whole_team)
            self.log.append((event, position))

    # ------------------------------------------------------------------ the stack's life
    def kill_worker(self, index: int = 0) -> None:
        self.steps.append(f"kill worker {index}")
        self.workers[index].kill()
        self.workers[index].stop()  # reaped: a killed worker is no worker that died by itself

    def start_worker(self, index: int = 0) -> None:
        self.steps.append(f"start worker {index}")
        self.workers[index].start()

    def add_worker(self) -> None:
        """A second worker of the group (the partitions rebalance); sharded sets only."""
        assert self.settings.storage.sharded, "a second worker needs a sharded set"
        self.steps.append(f"add worker {len(self.workers)}")
        self.workers.append(self._worker(f"w{len(self.workers)}"))
        self.workers[-1].start()

    def rebalance(self) -> None:
        """The group changes while it projects (sharded sets only): a second worker
        joins (the partitions are shared out again), leaves (SIGTERM: its shards go
        back to the first after the session timeout) or joins again."""
        if len(self.workers) < 2:
            self.add_worker()
        elif self.workers[1].alive():
            self.steps.append("stop worker 1")
            self.workers[1].stop()
        else:
            self.start_worker(1)

    async def replay(self) -> None:
        """``memstream replay`` while the worker projects and the service serves (a
        sharded group is stopped first: replay refuses to run beside it)."""
        self.steps.append("replay")
        running = [w for w in self.workers if w.alive()]
        if self.settings.storage.sharded:
            for w in running:
                w.stop()
        try:
            report = await replay(self.settings, batch_size=200)
            self.notes.append(f"replay: {report.summary()}")
        except ReplayError as exc:
            self.notes.append(f"replay refused: {exc}")
        finally:
            if self.settings.storage.sharded:
                for w in running:
                    w.start()

    async def read_at_position(self, space: int, agent: str, memory_id: str) -> None:
        """Write a memory, then read it with its position as ``min_position`` while
        more writes of the space arrive: the answer must be the model's at some
        position at or after the write's."""
        svc = self._svc()
        position = await self.memory(space, agent, memory_id)
        self.steps[-1] += " (read with min_position)"
        written = self.log[-1][0]
        other = MEMORY_IDS[(MEMORY_IDS.index(memory_id) + 1) % len(MEMORY_IDS)]
        concurrent = asyncio.ensure_future(self._concurrent(space, agent, memory_id, other))
        scope = ReadScope(*SPACES[space])
        try:
            await svc.wait_for([position])
            got = _memory_answer(await svc.get_memory(scope, memory_id))
        finally:
            await concurrent
        log = await self.model_log(await self._ends())
        answers = _prefix_answers(log, next(i for i, e in enumerate(log) if e is written) + 1, scope, memory_id)
        self.reads += 1
        if got not in answers:
            self._mismatch(f"get_memory {scope.space} {memory_id} with min_position={position.offset}", answers[0], got)

    async def _concurrent(self, space: int, agent: str, memory_id: str, other: str) -> None:
        await self.memory(space, agent, other)
        await self.link(space, agent, "l0", other, memory_id, "supersedes")

    # ------------------------------------------------------------------ the model's input
    async def _ends(self) -> dict[tuple[str, int], int]:
        topics = self._svc().topics
        return await self._svc().end_offsets([topics.events, topics.messages], refresh=True)

    async def model_log(self, ends: dict[tuple[str, int], int]) -> list[EventBase]:
        """The log the model folds: the machine's writes that the projections apply (a
        decision or outcome feeds the reflector, not a view) and what the workers
        wrote to the events topic up to ``ends``, each after the machine's last write
        before it in its partition."""
        await self._read_worker_events(ends)
        projected = {self._svc().topics.events, self._svc().topics.messages}
        keyed: list[tuple[int, int, EventBase]] = []
        for i, (event, pos) in enumerate(self.log):
            if topic_for(event, self._svc().topics) in projected:
                keyed.append((i, -1, event))
        mine = sorted(
            (pos.partition, pos.offset, i) for i, (_, pos) in enumerate(self.log)
            if pos is not None and pos.topic == self._svc().topics.events
        )
        for (partition, offset), event in sorted(self.worker_log.items()):
            before = [i for p, o, i in mine if p == partition and o < offset]
            keyed.append((max(before, default=-1), offset, event))
        return [event for _, _, event in sorted(keyed, key=lambda k: (k[0], k[1]))]

    async def _read_worker_events(self, ends: dict[tuple[str, int], int]) -> None:
        assert self._consumer is not None and self.keys is not None
        topic = self._svc().topics.events
        mine = {event.event_id for event, _ in self.log}
        await self.keys.sync()
        opener = RecordOpener(self.keys.keyring)
        for (t, partition), end in ends.items():
            start = self._read_to.get(partition, 0)
            if t != topic or end <= start:
                continue
            tp = TopicPartition(topic, partition)
            self._consumer.assign([tp])
            self._consumer.seek(tp, start)
            while (await self._consumer.position(tp)) < end:
                for rec in (await self._consumer.getmany(tp, timeout_ms=1000)).get(tp, ()):
                    if rec.offset >= end:
                        break
                    got = read_record(opener, topic, partition, rec.offset, rec.key, rec.value, rec.headers)
                    if not isinstance(got, PositionedEvent):
                        continue  # None: sealed under a forgotten key, its subject's earlier life
                    if got.event.event_id not in mine:
                        self.worker_log[(partition, rec.offset)] = got.event
            self._read_to[partition] = end

    # ------------------------------------------------------------------ the comparison
    def _mismatch(self, read: str, expected: Any, got: Any) -> None:
        self.mismatches.append(Mismatch(len(self.steps), read, expected, got))

    async def caught_up(self) -> dict[tuple[str, int], int]:
        """Until the stored positions reach both topics' end offsets (and the ends did
        not move while they were read); returns the ends."""
        svc = self._svc()
        deadline = time.monotonic() + CATCH_UP_S
        while True:
            ends = await self._ends()
            stored = await svc.stored_positions()
            if all(stored.get(tp, 0) >= end for tp, end in ends.items() if end):
                if await self._ends() == ends:
                    return ends
            self._alive_or_raise()
            if time.monotonic() > deadline:
                tails = "\n".join(w.tail(15) for w in self.workers)
                raise TimeoutError(f"the workers did not project the log: stored {stored}, ends {ends}\n{tails}")
            await asyncio.sleep(0.1)

    async def check(self, attempts: int = 5) -> int:
        """Compare every read of every space and read scope with the model; returns the
        reads compared (0 while no worker projects). A worker that writes (a lesson)
        while the reads run moves the log on: the round is discarded and read again."""
        if not self.serving:
            return 0
        for _ in range(attempts):
            ends = await self.caught_up()
            model = fold(await self.model_log(ends))
            found, before = len(self.mismatches), self.reads
            for team, user in SPACES:
                for agent in (None, *AGENTS):
                    await self._check_scope(model, ReadScope(team, user, agent))
            if await self._ends() == ends:
                return self.reads - before
            del self.mismatches[found:]
            self.reads = before
        raise TimeoutError(f"the log kept moving during {attempts} rounds of reads")

    async def _check_scope(self, model: Folded, scope: ReadScope) -> None:
        svc = self._svc()
        where = f"{scope.team_id}/{scope.user_id}" + (f" agent {scope.agent_id}" if scope.agent_id else "")
        expected = {mid: _listed(a) for mid, a in model.memories(scope).items()}
        for current_only in (False, True):
            filters = SearchFilters(agent_id=scope.agent_id, include_superseded=not current_only)
            listed = await svc.search(scope, "", 100, filters, interface="api")
            got = {r.memory_id: (r.agent_id, r.content, r.status, r.superseded_by, r.canonical_id) for r in listed}
            want = {m: v for m, v in expected.items() if not current_only or v[2] == "active"}
            self._compare(f"list {where}" + (" current" if current_only else ""), want, got)
        hits = await svc.search(scope, "noted fact about Ada Lovelace", 20, SearchFilters(agent_id=scope.agent_id),
                                interface="api")
        stray = {r.memory_id: (r.agent_id, r.content, r.status, r.superseded_by, r.canonical_id) for r in hits}
        self._compare(f"search {where} (every hit as the model has it)", {m: expected.get(m) for m in stray}, stray)
        for mid in MEMORY_IDS:
            got_one = await svc.get_memory(scope, mid)
            self._compare(f"get_memory {where} {mid}", _memory_answer_of(model.memory(scope, mid)), _memory_answer(got_one))
        store = svc.store_for(scope)
        turns = await asyncio.to_thread(store.get_messages, scope, list(TURN_IDS))
        self._compare(f"turns {where}", model.turns(scope), {t["message_id"]: t["content"] for t in turns})
        decisions = await asyncio.to_thread(store.decisions_for, scope)
        self._compare(f"decisions {where}", model.decisions(scope),
                      {(d["agent_id"], d["decision_id"]): d["status"] for d in decisions})
        lessons = await asyncio.to_thread(store.reflections_for, scope, subject="ACME", limit=1000)
        self._compare(f"lessons {where}", model.lessons(scope, "ACME"), {r["reflection_id"]: r["content"] for r in lessons})
        for name in ENTITIES:
            got_ids = await asyncio.to_thread(store.memories_for_entity, scope, name)
            self._compare(f"entity {name!r} {where}", model.entity(scope, name), got_ids)

    def _compare(self, read: str, expected: Any, got: Any) -> None:
        self.reads += 1
        if expected != got:
            self._mismatch(read, expected, got)


def _listed(a: MemoryAnswer) -> tuple[str, str, str, str | None, str | None]:
    return (a.agent_id, a.content, a.status, a.superseded_by, a.canonical_id)


def _memory_answer_of(a: MemoryAnswer | None) -> tuple[Any, ...] | None:
    if a is None:
        return None
    return (a.memory_id, a.agent_id, a.content, a.status, a.superseded_by, a.canonical_id,
            a.links_out, a.links_in, a.source_messages)


def _memory_answer(found: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """The fields of a ``get_memory`` answer the model answers too, in its shape."""
    if found is None:
        return None
    return (
        found["memory_id"], found["agent_id"], found["content"], found["status"], found.get("superseded_by"),
        found.get("canonical_id"),
        tuple(lk["link_id"] for lk in found["links_out"]), tuple(lk["link_id"] for lk in found["links_in"]),
        tuple((t["message_id"], t["content"]) for t in found["source_messages"]),
    )


def _prefix_answers(log: list[EventBase], start: int, scope: ReadScope, memory_id: str) -> list[tuple[Any, ...] | None]:
    """The model's answers for one memory at every log prefix from ``start`` events on."""
    state = fold(log[:start])
    answers = [_memory_answer_of(state.memory(scope, memory_id))]
    for event in log[start:]:
        fold([event], into=state)
        answers.append(_memory_answer_of(state.memory(scope, memory_id)))
    return answers


async def new_stack(base: Settings, workdir: Path, **overrides: Any) -> FoldStack:
    """Create the topics and start a stack on them."""
    settings = stack_settings(base, workdir, **overrides)
    await ensure_topics(settings.broker.bootstrap_servers, Topics.from_settings(settings.broker))
    stack = FoldStack(settings, workdir)
    await stack.start()
    return stack
