"""The fold machine against the real stack: hypothesis chooses the steps (writes as
several agents, users and teams, forgets, writes after a forget, replays while
serving, kills and restarts of the worker, a second worker joining and leaving the
group of a sharded set, reads with ``min_position`` under concurrent writes) and after each step every read of every space and read scope
must equal the reference model's answer (:mod:`memstream.domain.fold`).

Real broker, sealed log, the worker (projector and reflector) as its own process,
the API's read path in this process. Seeded and bounded (two examples of a dozen
steps, and one on a sharded set); ``memstream bench fold --seconds N`` runs the same steps for longer."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from memstream.bench._common import delete_topics
from memstream.bench.fold_stack import (
    AGENTS,
    DECISION_IDS,
    ENTITIES,
    LINK_IDS,
    MEMORY_IDS,
    RELATIONS,
    SPACES,
    TURN_IDS,
    FoldStack,
    new_stack,
)
from memstream.settings.model import Settings
from memstream.streams.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

spaces = st.integers(0, len(SPACES) - 1)
agents = st.sampled_from(AGENTS)
memory_ids = st.sampled_from(MEMORY_IDS)


def base_settings(bootstrap: str) -> Settings:
    return Settings(
        bootstrap_servers=bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}.", partitions=3,
        app_id=f"app-{uuid.uuid4().hex[:8]}",
    )


class FoldMachine(RuleBasedStateMachine):
    """One stack per example; each rule is one step of :class:`FoldStack`."""

    bootstrap = ""
    root = Path(".")
    sharded = False

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        workdir = self.root / uuid.uuid4().hex[:8]
        self.stack: FoldStack = self.run(new_stack(base_settings(self.bootstrap), workdir, sharded=self.sharded))

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            self.run(self.stack.stop())
            self.run(delete_topics(self.stack.settings.broker.bootstrap_servers, Topics.from_settings(self.stack.settings.broker),
                                   self.stack.settings.worker.app_id))
        finally:
            self.loop.close()

    @rule(space=spaces, agent=agents, memory_id=memory_ids, entity=st.none() | st.sampled_from(ENTITIES),
          evidence=st.none() | st.sampled_from(TURN_IDS))
    def memory(self, space: int, agent: str, memory_id: str, entity: str | None, evidence: str | None) -> None:
        self.run(self.stack.memory(space, agent, memory_id, entity, evidence))

    @rule(space=spaces, agent=agents, message_id=st.sampled_from(TURN_IDS))
    def turn(self, space: int, agent: str, message_id: str) -> None:
        self.run(self.stack.turn(space, agent, message_id))

    @rule(space=spaces, agent=agents, link_id=st.sampled_from(LINK_IDS), frm=memory_ids, to=memory_ids,
          relation=st.sampled_from(RELATIONS))
    def link(self, space: int, agent: str, link_id: str, frm: str, to: str, relation: str) -> None:
        self.run(self.stack.link(space, agent, link_id, frm, to, relation))

    @rule(space=spaces, agent=agents, decision_id=st.sampled_from(DECISION_IDS), settle=st.booleans())
    def decision(self, space: int, agent: str, decision_id: str, settle: bool) -> None:
        self.run(self.stack.decision(space, agent, decision_id))
        if settle:
            self.run(self.stack.outcome(space, agent, decision_id))

    @rule(space=spaces, whole_team=st.booleans())
    def forget(self, space: int, whole_team: bool) -> None:
        self.run(self.stack.forget(space, whole_team))

    @precondition(lambda self: self.stack.serving)
    @rule()
    def kill_worker(self) -> None:
        self.stack.kill_worker()

    @precondition(lambda self: not self.stack.serving)
    @rule()
    def start_worker(self) -> None:
        self.stack.start_worker()

    @rule(space=spaces, agent=agents, memory_id=memory_ids, whole_team=st.booleans())
    def forget_while_down(self, space: int, agent: str, memory_id: str, whole_team: bool) -> None:
        """The worker down across a forget and the subject's next writes (the steps
        above can reach it too; as one rule a short run reaches it surely)."""
        self.run(self.stack.memory(space, agent, memory_id))  # something to forget
        if self.stack.serving:
            self.stack.kill_worker()
        self.run(self.stack.forget(space, whole_team))
        self.run(self.stack.memory(space, agent, memory_id))
        self.run(self.stack.turn(space, agent, "c0"))
        self.stack.start_worker()

    @precondition(lambda self: self.stack.settings.storage.sharded and self.stack.serving)
    @rule()
    def rebalance(self) -> None:
        self.stack.rebalance()

    @precondition(lambda self: self.stack.serving)
    @rule()
    def replay(self) -> None:
        self.run(self.stack.replay())

    @precondition(lambda self: self.stack.serving)
    @rule(space=spaces, agent=agents, memory_id=memory_ids)
    def read_at_position(self, space: int, agent: str, memory_id: str) -> None:
        self.run(self.stack.read_at_position(space, agent, memory_id))
        self._assert_no_mismatch()

    @invariant()
    def reads_equal_the_model(self) -> None:
        self.run(self.stack.check())
        self._assert_no_mismatch()

    def _assert_no_mismatch(self) -> None:
        if self.stack.mismatches:
            steps = "\n".join(f"  {i + 1}. {s}" for i, s in enumerate(self.stack.steps))
            shown = "\n".join(f"  {m}" for m in self.stack.mismatches[:8])
            notes = "\n".join(self.stack.notes)
            raise AssertionError(
                f"{len(self.stack.mismatches)} reads differ from the model:\n{shown}\nsteps:\n{steps}\n{notes}"
            )


class ShardedFoldMachine(FoldMachine):
    """The same on a sharded set whose group starts with two workers, so every example
    projects across a rebalance; the rebalance rule makes more (a worker leaves, joins)."""

    sharded = True

    @initialize()
    def second_worker(self) -> None:
        self.stack.rebalance()


def test_every_read_equals_the_fold_of_the_log(kafka_bootstrap: str, tmp_path: Path) -> None:
    FoldMachine.bootstrap, FoldMachine.root = kafka_bootstrap, tmp_path
    run_state_machine_as_test(
        FoldMachine,
        settings=settings(
            max_examples=2, stateful_step_count=12, deadline=None, derandomize=True, database=None,
            suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
        ),
    )


def test_every_read_equals_the_fold_across_rebalances(kafka_bootstrap: str, tmp_path: Path) -> None:
    ShardedFoldMachine.bootstrap, ShardedFoldMachine.root = kafka_bootstrap, tmp_path
    run_state_machine_as_test(
        ShardedFoldMachine,
        settings=settings(
            max_examples=1, stateful_step_count=10, deadline=None, derandomize=True, database=None,
            suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
        ),
    )


def test_a_write_after_a_forget_made_while_the_worker_was_down_survives(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The issue's reproduction through the same stack: worker stopped, forget, a new
    memory and turn for the subject, worker started: both must read back."""

    async def scenario() -> FoldStack:
        stack = await new_stack(base_settings(kafka_bootstrap), tmp_path / "stack")
        try:
            await stack.turn(0, "a1", "c0")
            await stack.memory(0, "a1", "m0", "Ada Lovelace", "c0")
            await stack.memory(1, "a1", "m0")
            await stack.check()
            stack.kill_worker()
            await stack.forget(0, whole_team=False)
            await stack.memory(0, "a1", "m1")
            await stack.turn(0, "a1", "c1")
            stack.start_worker()
            await stack.check()
            await stack.replay()
            await stack.check()
            return stack
        finally:
            await stack.stop()
            await delete_topics(kafka_bootstrap, Topics.from_settings(stack.settings.broker), stack.settings.worker.app_id)

    stack = asyncio.run(scenario())
    assert stack.reads > 100
    assert not stack.mismatches, "\n".join(map(str, stack.mismatches[:8])) + "\n" + "\n".join(stack.notes)
