"""What ``memstream up`` checks before it claims anything.

* One ``up`` per home: a second one refuses at once, naming the running one's pid and
  ports (an advisory lock on ``<home>/up.lock``, released by the kernel when that
  process ends, so a crash leaves nothing to clean).
* A broker it did not start is named with its cluster id.
* A broker's topics belong to one home: ``<prefix>home`` (one compacted record) names
  the home that serves them; another home refuses them unless told to share.
* "up" is said once the API answers ``/healthz`` and the worker reads its partitions
  (the worker writes ``<home>/worker.ready`` then).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from aiokafka import TopicPartition
from aiokafka.admin import NewTopic

from memstream.cli._errors import CLIError
from memstream.settings import Settings
from memstream.streams.admin import topic_partitions
from memstream.streams.clients import create_admin, create_consumer, create_producer

__all__ = ["UpLock", "hold_home", "cluster_id", "claim_topics", "home_topic"]


@dataclass
class UpLock:
    """The held lock of a running ``up`` (kept open for the process's lifetime)."""

    handle: IO[str]
    path: Path

    def release(self) -> None:
        self.handle.close()


def hold_home(settings: Settings) -> UpLock:
    """Take ``<home>/up.lock`` for this process, or a CLIError naming the ``up`` that
    holds it."""
    path = settings.home / "up.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        try:
            held = json.loads(handle.read() or "{}")
        except ValueError:
            held = {}
        handle.close()
        raise CLIError(
            f"memstream up already runs in {settings.home} (pid {held.get('pid', '?')}: API port {held.get('api_port', '?')}, "
            f"broker {held.get('bootstrap', '?')}); stop it first (Ctrl-C in its terminal, or `kill {held.get('pid', 'PID')}`), "
            "or use another MEMSTREAM_HOME"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"pid": os.getpid(), "api_port": settings.api.port, "bootstrap": settings.broker.bootstrap_servers}))
    handle.flush()
    return UpLock(handle, path)


def home_topic(settings: Settings) -> str:
    return f"{settings.broker.topic_prefix}home"


def _home_id(settings: Settings) -> str:
    path = settings.home / "home.id"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(uuid.uuid4().hex + "\n", encoding="ascii")
    return path.read_text(encoding="ascii").strip()


async def _cluster_id(settings: Settings) -> str:
    admin = create_admin(settings.broker, client_id="memstream-up")
    await admin.start()
    try:
        return str((await admin.describe_cluster())["cluster_id"])
    finally:
        await admin.close()


def cluster_id(settings: Settings) -> str:
    """The broker's cluster id ("unknown" if it does not say)."""
    try:
        return asyncio.run(_cluster_id(settings)) or "unknown"
    except Exception:  # noqa: BLE001 - naming the cluster is a courtesy; the next steps report real failures
        return "unknown"


async def _read_owner(settings: Settings) -> dict[str, str] | None:
    topic = home_topic(settings)
    if not (await topic_partitions(settings.broker, [topic], client_id="memstream-up")).get(topic):
        return None
    consumer = create_consumer(settings.broker, client_id="memstream-up", group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        consumer.seek(tp, (await consumer.beginning_offsets([tp]))[tp])
        owner: dict[str, str] | None = None
        while await consumer.position(tp) < end:
            for record in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                try:
                    found = json.loads(record.value or b"")
                except ValueError:
                    continue
                if isinstance(found, dict) and isinstance(found.get("id"), str):
                    owner = {k: str(v) for k, v in found.items()}
        return owner
    finally:
        await consumer.stop()


async def _write_owner(settings: Settings, me: dict[str, str]) -> None:
    admin = create_admin(settings.broker, client_id="memstream-up")
    await admin.start()
    try:
        if home_topic(settings) not in await admin.list_topics():
            config = {"cleanup.policy": "compact"}
            await admin.create_topics([NewTopic(home_topic(settings), 1, settings.broker.replication_factor, topic_configs=config)])
    finally:
        await admin.close()
    producer = create_producer(settings.broker, client_id="memstream-up", acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(home_topic(settings), json.dumps(me).encode(), key=b"home")
    finally:
        await producer.stop()


def claim_topics(settings: Settings, *, share: bool) -> str:
    """Mark the broker's ``<prefix>*`` topics as this home's, or a CLIError when they
    are another home's (unless ``share``). Returns what to print."""
    me = {"id": _home_id(settings), "home": str(settings.home), "host": socket.gethostname()}
    owner = asyncio.run(_read_owner(settings))
    if owner is None:
        asyncio.run(_write_owner(settings, me))
        return f"Topics: {settings.broker.topic_prefix}* are served from this home"
    if owner["id"] == me["id"]:
        return f"Topics: {settings.broker.topic_prefix}* belong to this home"
    other = f"{owner.get('home', '?')} on {owner.get('host', '?')}"
    if share:
        return f"Topics: {settings.broker.topic_prefix}* belong to the home {other}; shared as asked (--share-broker)"
    raise CLIError(
        f"the topics {settings.broker.topic_prefix}* on {settings.broker.bootstrap_servers} belong to another memstream home "
        f"({other}); pass --share-broker to serve them from this home too, or use another MEMSTREAM_BROKER_TOPIC_PREFIX "
        "or broker (MEMSTREAM_BROKER_PORT)"
    )
