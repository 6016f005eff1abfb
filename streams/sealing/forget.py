"""``memstream forget``: forget one user's memory space, or every space of a team.

Order matters for convergence. First a ``SubjectForgotten`` per space goes to each
topic the projector folds, events and messages (unsealed, signed by the worker key, in
the space's partition, so after every earlier record of the space there): the
projector deletes the rows each one covers when it reaches it (those written from its
topic before it; a write after it survives) and drops the keys it names at once. Then the keys are tombstoned in
``memstream.keys``. A run killed between the two is repeated with the same command
(the keys are still there); once they are gone there is nothing left to do, and a
second run says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from memstream.domain.events import Scope, SubjectForgotten, build_event
from memstream.domain.log import LogPosition
from memstream.sealing import Subject
from memstream.settings import BrokerSettings, StreamsConfig
from memstream.streams.admin import topic_partitions
from memstream.streams.sealing.keys import SubjectKeys
from memstream.codec.wire import encode_event
from memstream.streams.topics import Topics
from memstream.streams.trust.worker_identity import signed_headers, worker_key
from memstream.streams.connect import kafka_options

__all__ = ["ForgetReport", "forget"]


@dataclass
class ForgetReport:
    team_id: str
    user_id: str | None
    forgotten: list[Subject] = field(default_factory=list)
    already_forgotten: list[Subject] = field(default_factory=list)
    positions: list[LogPosition] = field(default_factory=list)
    ingress_lag_s: float | None = None
    """Age of the oldest plaintext record still in the ingress (not yet sealed and
    deleted): how long plaintext waits there now. None: the ingress is empty."""

    def summary(self) -> str:
        what = f"team {self.team_id!r}" + (f" user {self.user_id!r}" if self.user_id is not None else " (every user)")
        if self.forgotten:
            users = ", ".join(repr(s.user_id) for s in self.forgotten)
            window = (
                "ingress holds no plaintext" if self.ingress_lag_s is None
                else f"oldest plaintext in the ingress is {self.ingress_lag_s:.1f}s old (sealed, then deleted)"
            )
            return (
                f"forgot {what}: {len(self.forgotten)} memory space(s) ({users}); keys tombstoned, "
                f"projections deleting; {window}"
            )
        if self.already_forgotten:
            return f"nothing to forget: {what} was already forgotten"
        return f"nothing to forget: no data subject {what} is known (nothing was ever sealed for it)"


def forgotten_events(keys: SubjectKeys, subjects: list[Subject], whole_team: bool) -> list[SubjectForgotten]:
    assert keys.keyring is not None
    return [
        build_event(
            SubjectForgotten,
            scope=Scope(team_id=s.team_id, user_id=s.user_id),
            whole_team=whole_team,
            key_ids=tuple(kid.hex() for kid in keys.keyring.kids_of(s)),
            producer="memstream-forget",
        )
        for s in subjects
    ]


async def forget(streams: StreamsConfig, team_id: str, user_id: str | None = None) -> ForgetReport:
    """Forget the subject(s); see the module doc for the order of the writes."""
    topics = Topics.from_settings(streams.broker)
    report = ForgetReport(team_id, user_id)
    async with SubjectKeys(streams, topics, client_id="memstream-forget") as keys:
        await keys.sync()
        assert keys.keyring is not None
        subjects = keys.keyring.subjects(team_id, user_id)
        if not subjects:
            report.already_forgotten = keys.keyring.forgotten_subjects(team_id, user_id)
            return report
        signer = worker_key(streams.worker_key_file)
        producer = AIOKafkaProducer(
            **kafka_options(streams.broker), client_id="memstream-forget", enable_idempotence=True, acks="all"
        )
        await producer.start()
        try:
            for event in forgotten_events(keys, subjects, whole_team=user_id is None):
                rec = encode_event(event)
                for topic in (topics.events, topics.messages):
                    md = await producer.send_and_wait(
                        topic, rec.value, key=rec.key, headers=signed_headers(signer, rec.value, rec.headers)
                    )
                    report.positions.append(LogPosition(topic=md.topic, partition=md.partition, offset=md.offset))
        finally:
            await producer.stop()
        report.forgotten = await keys.forget(team_id, user_id)
    report.ingress_lag_s = await ingress_lag_s(streams.broker, topics)
    return report


async def ingress_lag_s(broker: BrokerSettings, topics: Topics) -> float | None:
    """The age of the oldest record left in the ingress (the sealer deletes what it
    has sealed), None when it holds none: the plaintext window a forget reports."""
    consumer = AIOKafkaConsumer(**kafka_options(broker), group_id=None,
                                enable_auto_commit=False, client_id="memstream-forget-ingress")
    await consumer.start()
    try:
        found = await topic_partitions(broker.bootstrap_servers, [topics.ingress], client_id="memstream-forget-ingress")
        tps = [TopicPartition(topics.ingress, p) for p in sorted(found.get(topics.ingress, ()))]
        if not tps:
            return None
        consumer.assign(tps)
        begins, ends = await consumer.beginning_offsets(tps), await consumer.end_offsets(tps)
        oldest: int | None = None
        for tp in tps:
            if begins[tp] < ends[tp]:
                consumer.seek(tp, begins[tp])
                first = (await consumer.getmany(tp, timeout_ms=2000, max_records=1)).get(tp, ())
                if first:
                    oldest = first[0].timestamp if oldest is None else min(oldest, first[0].timestamp)
        return None if oldest is None else max(0.0, time.time() - oldest / 1000)
    finally:
        await consumer.stop()
