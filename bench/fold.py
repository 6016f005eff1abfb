"""``memstream bench fold --seconds N``: the fold machine of the stateful test, run for
longer with seeded random steps.

The steps are :class:`~memstream.bench.fold_stack.FoldStack`'s (writes of memories,
turns, links, decisions and outcomes as several agents, users and teams; forgets of a
user or a team; replays while serving; kills and restarts of the worker; reads with
``min_position`` under concurrent writes; on a sharded set, a second worker joining
and leaving the group), and after each step every read of every space and read
scope is compared with the reference model. A run is cut into episodes of at most
``EPISODE_STEPS`` steps on fresh topics, the first and every second on a sharded set; an
episode also ends at its first mismatch (the state has diverged; later reads would
repeat it).

Reported: ``steps``, ``reads_checked``, ``mismatches`` (reads that differed),
``episodes`` (``sharded_episodes`` of them sharded), ``rebalances`` and the first
mismatches with the steps that led to them.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

from memstream.bench._events import BenchWorkdir, bench_settings, machine_info, print_table, status
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

__all__ = ["run", "random_step", "EPISODE_STEPS"]

EPISODE_STEPS = 40


async def random_step(stack: FoldStack, rng: random.Random) -> None:
    """One step chosen as the stateful test's rules are (writes most often)."""
    space, agent = rng.randrange(len(SPACES)), rng.choice(AGENTS)
    serving = stack.serving
    choices = ["memory"] * 5 + ["turn"] * 2 + ["link"] * 3 + ["decision", "forget"]
    choices += ["kill", "replay", "read_at_position", "read_at_position"] if serving else ["start"] * 3
    if serving and stack.settings.storage.sharded:
        choices += ["rebalance"] * 2
    step = rng.choice(choices)
    if step == "memory":
        await stack.memory(space, agent, rng.choice(MEMORY_IDS), rng.choice((None, *ENTITIES)),
                           rng.choice((None, *TURN_IDS)))
    elif step == "turn":
        await stack.turn(space, agent, rng.choice(TURN_IDS))
    elif step == "link":
        await stack.link(space, agent, rng.choice(LINK_IDS), rng.choice(MEMORY_IDS), rng.choice(MEMORY_IDS),
                         rng.choice(RELATIONS))
    elif step == "decision":
        decision = rng.choice(DECISION_IDS)
        await stack.decision(space, agent, decision)
        if rng.random() < 0.5:
            await stack.outcome(space, agent, decision)
    elif step == "forget":
        await stack.forget(space, whole_team=rng.random() < 0.3)
    elif step == "kill":
        stack.kill_worker()
    elif step == "start":
        stack.start_worker()
    elif step == "rebalance":
        stack.rebalance()
    elif step == "replay":
        await stack.replay()
    else:
        await stack.read_at_position(space, agent, rng.choice(MEMORY_IDS))


async def _run(root: Path, seconds: float, seed: int, track: Any) -> dict[str, Any]:
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    totals = {"steps": 0, "reads_checked": 0, "mismatches": 0, "episodes": 0, "sharded_episodes": 0, "rebalances": 0}
    first: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        totals["episodes"] += 1
        settings = track(bench_settings(root / f"e{totals['episodes']}"))
        sharded = totals["episodes"] % 2 == 1  # the first one too: a short run rebalances
        totals["sharded_episodes"] += sharded
        stack = await new_stack(settings, root / f"e{totals['episodes']}", sharded=sharded)
        try:
            if sharded:  # the group starts with two workers: a rebalance in every sharded episode
                stack.rebalance()
            for _ in range(EPISODE_STEPS):
                if time.monotonic() >= deadline:
                    break
                await random_step(stack, rng)
                totals["steps"] += 1
                await stack.check()
                if stack.mismatches:
                    break
            if not stack.serving:  # the last step left the worker down: compare once more with it up
                stack.start_worker()
                await stack.check()
        finally:
            await stack.stop()
        totals["reads_checked"] += stack.reads
        totals["rebalances"] += sum(1 for step in stack.steps if step.endswith("worker 1"))
        totals["mismatches"] += len(stack.mismatches)
        if stack.mismatches and len(first) < 5:
            first.append({"mismatch": str(stack.mismatches[0]), "steps": stack.steps, "notes": stack.notes})
        status(f"episode {totals['episodes']}: {len(stack.steps)} steps, {stack.reads} reads, "
               f"{len(stack.mismatches)} mismatches")
    return {**totals, "first_mismatches": first}


def run(*, seconds: float = 60.0, seed: int = 0) -> dict[str, Any]:
    with BenchWorkdir("fold") as work:
        result = asyncio.run(_run(work.path, seconds, seed, work.track))
    result.update({"seconds": seconds, "seed": seed, **machine_info()})
    print_table(
        "bench fold",
        [
            ("steps", str(result["steps"]), "-"),
            ("reads_checked", str(result["reads_checked"]), "-"),
            ("mismatches", str(result["mismatches"]), "0"),
            ("episodes", str(result["episodes"]), f"at most {EPISODE_STEPS} steps each"),
            ("sharded_episodes", str(result["sharded_episodes"]), "two workers, rebalanced"),
            ("rebalances", str(result["rebalances"]), "a worker joined or left the group"),
        ],
    )
    for item in result["first_mismatches"]:
        status(item["mismatch"])
    return result
