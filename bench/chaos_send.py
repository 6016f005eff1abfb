"""How a chaos run pushes its traffic: the ledger of what producers were told, valid and
hostile sends with resends, the faults injected while they run (worker kills, broker
restarts) and forged key records."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiokafka.errors import KafkaError

from memstream.bench._common import (
    WorkerProcess,
    console,
)
from memstream.bench.chaos_traffic import (
    BadRecord,
    ChaosPlan,
)
from memstream.codec.wire import encode_event
from memstream.domain.events import EventBase, Scope, SubjectForgotten
from memstream.domain.log import LogPosition
from memstream.sealing import Subject
from memstream.sealing.keyring import key_record_key
from memstream.settings import LocalBrokerConfig, Settings
from memstream.streams.broker import local
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.producers.producer import MemstreamProducer, ProduceError, create_kafka_producer
from memstream.streams.topics import Topics


@dataclass
class Ledger:
    """What the producers were told."""

    acked: dict[str, LogPosition] = field(default_factory=dict)
    bad: dict[tuple[str, int, int], str] = field(default_factory=dict)
    resends: int = 0
    send_errors: Counter[str] = field(default_factory=Counter)


async def _send_valid(producer: Any, batch: list[EventBase], ledger: Ledger, stop_at: float) -> None:
    pending = batch
    while pending:
        try:
            positions = await producer.send_many(pending)
            for event, pos in zip(pending, positions):
                ledger.acked[str(event.event_id)] = pos
            return
        except ProduceError as exc:
            retry = []
            for event, result in zip(pending, exc.results):
                if isinstance(result, LogPosition):
                    ledger.acked[str(event.event_id)] = result
                else:
                    retry.append(event)
                    ledger.send_errors[type(result).__name__] += 1
            ledger.resends += len(retry)
            pending = retry
            if time.monotonic() > stop_at:
                raise RuntimeError(f"{len(pending)} events still not acknowledged after the deadline") from exc
            await asyncio.sleep(1.0)


async def _send_bad(raw: Any, records: list[BadRecord], ledger: Ledger, stop_at: float) -> None:
    pending = records
    while pending:
        futures = []
        for r in pending:
            try:
                futures.append(await raw.send(r.topic, value=r.value, key=r.key, headers=list(r.headers)))
            except KafkaError as exc:
                ledger.send_errors[type(exc).__name__] += 1
                futures.append(None)
        retry = []
        for r, fut in zip(pending, futures):
            if fut is None:
                retry.append(r)
                continue
            try:
                md = await fut
            except KafkaError as exc:
                ledger.send_errors[type(exc).__name__] += 1
                retry.append(r)
                continue
            ledger.bad[(md.topic, md.partition, md.offset)] = r.kind
        ledger.resends += len(retry)
        pending = retry
        if pending:
            if time.monotonic() > stop_at:
                raise RuntimeError(f"{len(pending)} bad records still not acknowledged after the deadline")
            await asyncio.sleep(1.0)


async def produce_traffic(
    settings: Settings,
    valid: list[EventBase],
    bad: list[BadRecord],
    plan: ChaosPlan,
    ledger: Ledger,
    on_progress: Any,
) -> float:
    producer = MemstreamProducer(settings.streams, client_id="memstream-chaos")
    raw = create_kafka_producer(settings.broker, client_id="memstream-chaos-raw")
    await producer.start()
    await raw.start()
    start = time.monotonic()
    stop_at = start + plan.produce_seconds + plan.settle_timeout_s
    try:
        batch = 200
        chunks = max(1, (len(valid) + batch - 1) // batch)
        bad_per_chunk = [len(bad) * (i + 1) // chunks - len(bad) * i // chunks for i in range(chunks)]
        b = 0
        for i in range(chunks):
            due = start + plan.produce_seconds * i / chunks
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
            await _send_valid(producer, valid[i * batch : (i + 1) * batch], ledger, stop_at)
            await _send_bad(raw, bad[b : b + bad_per_chunk[i]], ledger, stop_at)
            b += bad_per_chunk[i]
            on_progress(min(len(valid), (i + 1) * batch))
    finally:
        await producer.stop()
        await raw.stop()
    return time.monotonic() - start


@dataclass
class Faults:
    worker_kills: int = 0
    worker_crashes: int = 0
    broker_restarts: int = 0
    broker_down_s: float = 0.0
    log: list[str] = field(default_factory=list)


async def inject_faults(
    worker: WorkerProcess,
    broker: LocalBrokerConfig,
    plan: ChaosPlan,
    rng: random.Random,
    faults: Faults,
    done: asyncio.Event,
) -> None:
    """Kill the worker and restart the broker on a schedule spread over the window."""
    window = plan.produce_seconds
    actions = [(window * (0.05 + 0.9 * rng.random()), "kill") for _ in range(plan.worker_kills)]
    actions += [(window * (i + 1) / (plan.broker_restarts + 1), "broker") for i in range(plan.broker_restarts)]
    actions.sort()
    start = time.monotonic()
    for at, action in actions:
        while time.monotonic() - start < at:
            if not worker.alive():
                faults.worker_crashes += 1
                faults.log.append(f"{time.monotonic() - start:6.1f}s worker exited by itself ({worker.exit_code()}): restarted")
                worker.start()
            await asyncio.sleep(0.2)
        t = time.monotonic() - start
        if action == "kill":
            worker.kill()
            faults.worker_kills += 1
            await asyncio.sleep(rng.uniform(0.2, 1.5))
            worker.start()
            faults.log.append(f"{t:6.1f}s worker SIGKILLed and restarted")
        else:
            t0 = time.monotonic()
            await asyncio.to_thread(local.stop, broker)
            await asyncio.sleep(rng.uniform(1.0, 3.0))
            await asyncio.to_thread(local.start, broker)
            faults.broker_down_s += time.monotonic() - t0
            faults.broker_restarts += 1
            faults.log.append(f"{t:6.1f}s broker stopped and restarted ({time.monotonic() - t0:.1f}s down)")
    while not done.is_set():
        if not worker.alive():
            faults.worker_crashes += 1
            faults.log.append("worker exited by itself after the faults: restarted")
            worker.start()
        await asyncio.sleep(0.5)


async def forge_keys(settings: Settings, topics: Topics, ledger: Ledger) -> dict[str, Any]:
    """What a producer without the worker key tries on the keys: a forged tombstone of
    every data key, a bogus key record, and a forged ``SubjectForgotten`` naming each
    key's real id on ``events`` (its position joins the bad inputs: it must be dead-
    lettered). Then a new keyring must start and still hold every subject."""
    async with SubjectKeys(settings.streams, topics, client_id="memstream-bench-chaos-forger") as keys:
        ring = keys.keyring
        assert ring is not None
        held = {s: ring.kids_of(s) for s in ring.known_subjects()}
    raw = create_kafka_producer(settings.broker, client_id="memstream-chaos-forger")
    await raw.start()
    forged = 0
    try:
        for subject, kids in held.items():
            for kid in kids:
                await raw.send_and_wait(topics.keys, None, key=key_record_key(subject, kid), partition=0)
                rec = encode_event(
                    SubjectForgotten(scope=Scope(team_id="globex", user_id="mallory"), key_ids=(kid.hex(),), producer="memstream-forget")
                )
                md = await raw.send_and_wait(topics.events, rec.value, key=rec.key, headers=rec.headers)
                ledger.bad[(md.topic, md.partition, md.offset)] = "forged_forget"
                forged += 2
        bogus = json.dumps({"wrapped": "AAAA", "wrapped_by": "deadbeefdeadbeef"}).encode()
        await raw.send_and_wait(topics.keys, bogus, key=key_record_key(Subject("globex", "mallory"), b"\x01" * 16), partition=0)
        forged += 1
    finally:
        await raw.stop()
    async with SubjectKeys(settings.streams, topics, client_id="memstream-bench-chaos-after") as after:
        ring = after.keyring
        assert ring is not None
        kept = sum(1 for subject, kids in held.items() if all(ring.by_kid(k) is not None for k in kids))
    console.print(f"forged {forged} key records and forget orders: {kept}/{len(held)} subjects still hold their keys")
    return {
        "forged_key_records": forged,
        "forged_forgets": len([k for k in ledger.bad.values() if k == "forged_forget"]),
        "subjects_keyed": len(held),
        "subjects_keyed_after_forgery": kept,
    }
