"""``memstream reseal``: upgrade a deployment written before sealing existed.

Shredding only works for events sealed from the start, and Kafka cannot rewrite a
record in place, so each kept-forever topic is copied: plaintext records are sealed
under their subject's key into a staging topic (records already sealed are copied as
they are), the original topic is deleted and created again, the staging topic is
copied back, partition by partition in order (so offsets, and the projection's stored
positions, stay valid), and the staging topic is deleted. Run it with the worker
stopped. A state file (``<home>/reseal.json``) records each topic's phase, so an
interrupted run resumes where it stopped and never deletes a topic whose copy is not
complete.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from memstream.sealing import Subject, is_sealed
from memstream.settings import BrokerSettings, StreamsConfig
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.sealing.sealed_records import PLAIN_TYPES, NotAnEvent, ingress_header, seal_value, signed_for
from memstream.streams.topics import Topics
from memstream.streams.trust.worker_identity import HEADER as SIGNATURE_HEADER, verifier, worker_key
from memstream.streams.connect import kafka_options

__all__ = ["reseal", "ResealError", "STATE_FILE"]

_COPIED, _DONE = "copied", "done"
Progress = Callable[[str], None]
STATE_FILE = "reseal.json"
"""Under ``home``: which topics a run has copied or finished, so a rerun resumes there."""


class ResealError(RuntimeError):
    """A topic could not be resealed (one line; the state file says where to resume)."""


def _load_state(path: Path) -> dict[str, str]:
    return json.loads(path.read_text()) if path.exists() else {}


def _save_state(path: Path, state: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_suffix(".tmp")
    aside.write_text(json.dumps(state, indent=1))
    os.replace(aside, path)


class _Kafka:
    def __init__(self, broker: BrokerSettings) -> None:
        self.broker = broker
        self.admin = AIOKafkaAdminClient(**kafka_options(broker), client_id="memstream-reseal")
        self.producer = AIOKafkaProducer(
            **kafka_options(broker), client_id="memstream-reseal", enable_idempotence=True, acks="all"
        )

    async def partitions(self, topic: str) -> int | None:
        if topic not in set(await self.admin.list_topics()):
            return None
        described = await self.admin.describe_topics([topic])
        return len(described[0]["partitions"])

    async def create(self, topic: str, partitions: int, config: dict[str, str]) -> None:
        for _ in range(120):  # a topic just deleted takes a moment to be gone
            try:
                response = await self.admin.create_topics(
                    [NewTopic(topic, partitions, self.broker.replication_factor, topic_configs=config)]
                )
            except TopicAlreadyExistsError:
                response = None
            errors = [code for _, code, *_ in response.topic_errors] if response else [36]
            if errors == [0]:
                return
            if errors != [36]:
                raise ResealError(f"cannot create topic {topic} (error {errors[0]})")
            if await self.partitions(topic) == partitions:
                return
            await asyncio.sleep(0.5)
        raise ResealError(f"topic {topic} still exists a minute after it was deleted")

    async def delete(self, topic: str) -> None:
        if await self.partitions(topic) is not None:
            await self.admin.delete_topics([topic])
        for _ in range(120):
            if await self.partitions(topic) is None:
                return
            await asyncio.sleep(0.5)
        raise ResealError(f"topic {topic} was not deleted within a minute")

    async def copy(self, source: str, target: str, partitions: int, transform: Callable | None) -> int:  # type: ignore[type-arg]
        """Copy every record of ``source`` to the same partition of ``target``, in order."""
        consumer = AIOKafkaConsumer(**kafka_options(self.broker), group_id=None, enable_auto_commit=False)
        await consumer.start()
        copied = 0
        try:
            tps = [TopicPartition(source, p) for p in range(partitions)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                sends = []
                while await consumer.position(tp) < ends[tp]:
                    for r in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, ()):
                        value, headers = (r.value, list(r.headers or ())) if transform is None else await transform(r)
                        sends.append(
                            await self.producer.send(
                                target, value=value, key=r.key, headers=headers, partition=tp.partition, timestamp_ms=r.timestamp
                            )
                        )
                await asyncio.gather(*sends)
                copied += len(sends)
        finally:
            await consumer.stop()
        return copied


async def reseal(streams: StreamsConfig, state_path: Path, *, progress: Progress = lambda line: None) -> dict[str, int]:
    """Seal every kept-forever topic in place; records sealed per topic. ``state_path``
    (``<home>/``:data:`STATE_FILE`) records progress, so an interrupted run resumes."""
    topics = Topics.from_settings(streams.broker)
    state = _load_state(state_path)
    kafka = _Kafka(streams.broker)
    signer = worker_key(streams.worker_key_file)
    valid = verifier(signer)
    sealed: dict[str, int] = {}
    async with SubjectKeys(streams, topics, client_id="memstream-reseal") as keys:

        async def seal_one(r):  # type: ignore[no-untyped-def]
            headers = list(r.headers or ())
            if is_sealed(r.value):
                return r.value, headers
            header = ingress_header(r.value)
            if header.type in PLAIN_TYPES:
                return r.value, headers
            key = await keys.key_for(Subject(header.team_id, header.user_id))
            value = seal_value(key, header, r.value)
            if any(k == SIGNATURE_HEADER for k, _ in headers) and valid(r.value, headers):
                headers = signed_for(signer, value, headers)
            sealed[r.topic] = sealed.get(r.topic, 0) + 1
            return value, headers

        await kafka.admin.start()
        await kafka.producer.start()
        try:
            for topic in topics.kept_forever():
                await _reseal_topic(kafka, topic, f"{topics.prefix}reseal.{topic[len(topics.prefix):]}", state, state_path, seal_one, progress)
        except NotAnEvent as exc:
            raise ResealError(f"a record cannot be sealed ({exc}); fix or remove it first") from None
        finally:
            await kafka.producer.stop()
            await kafka.admin.close()
    state_path.unlink(missing_ok=True)
    return {t: sealed.get(t, 0) for t in topics.kept_forever()}


async def _reseal_topic(kafka: _Kafka, topic: str, staging: str, state: dict[str, str], state_path: Path, seal_one, progress: Progress) -> None:  # type: ignore[no-untyped-def]
    config = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
    phase = state.get(topic)
    if phase == _DONE:
        return
    if phase is None:
        partitions = await kafka.partitions(topic)
        if partitions is None:
            return
        await kafka.delete(staging)  # a half copy from an interrupted run
        await kafka.create(staging, partitions, config)
        n = await kafka.copy(topic, staging, partitions, seal_one)
        progress(f"{topic}: {n} records copied, sealed, to {staging}")
        state[topic] = phase = _COPIED
        _save_state(state_path, state)
    partitions = await kafka.partitions(staging)
    if partitions is None:
        raise ResealError(f"{staging} is missing although {state_path} says it was copied")
    # copied: the original may be deleted; a copy-back cut short is redone whole
    await kafka.delete(topic)
    await kafka.create(topic, partitions, config)
    n = await kafka.copy(staging, topic, partitions, None)
    state[topic] = _DONE
    _save_state(state_path, state)
    await kafka.delete(staging)
    progress(f"{topic}: {n} sealed records in place")
