"""The Faust application that runs memstream's stream processors (``memstream worker``).

Why a subclass of :class:`faust.App`: the worker's Faust data directory is created
with its parents, its internal topics exist before its consumer first joins, and the
start line names the services it runs. The projector does not read
through Faust at all: it owns every partition of its topics and resumes from the
positions stored with its rows (see :mod:`memstream.streams.projector_feed`), so it
runs as a service of this app with its own group-less consumer.

Which services run is picked per worker (``--services``): the projector, the extractor
and the sealer are ``mode`` services with their own plain consumers, the reflector is
implemented as Faust agents over Faust tables; each registers itself through
``register_<name>(app, settings, topics)`` (docs/architecture.md says why).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import faust
from faust.auth import SASLCredentials, SSLCredentials
from faust.types.auth import CredentialsT

from memstream.memory_release import (
    MMAP_THRESHOLD_BYTES,
    RELEASE_EVERY_S,
    pin_mmap_threshold,
    release_free_memory,
    trim_supported,
)
from memstream.projections.store import TableSets
from memstream.services.extraction import register_extractor
from memstream.services.projector import register_group_projector, register_projector
from memstream.services.reflection import register_reflector
from memstream.services.shards import projects_sharded
from memstream.settings import BrokerSettings, Settings
from memstream.streams.admin import topic_partitions
from memstream.streams.connect import kafka_options
from memstream.streams.producers.kafka_producer import LINGER_MS, MAX_BATCH_BYTES
from memstream.streams.records.inflation_bound import bound_inflation
from memstream.streams.sealing.sealer import register_sealer
from memstream.streams.topics import Topics

__all__ = [
    "SERVICE_NAMES",
    "MemstreamApp",
    "FAUST_LOGGER",
    "build_app",
    "broker_urls",
    "group_instance_id",
]

log = logging.getLogger(__name__)

SERVICE_NAMES: tuple[str, ...] = ("projector", "extractor", "reflector", "sealer")
"""Every service a worker can run, in registration order."""


def faust_credentials(broker: BrokerSettings) -> CredentialsT | None:
    """The identity of :func:`kafka_options` for faust (``App(broker_credentials=...)``);
    here, so that the Kafka clients of the CLI never import faust."""
    options = kafka_options(broker)
    protocol = broker.security_protocol
    if protocol == "PLAINTEXT":
        return None
    if protocol == "SSL":
        return SSLCredentials(options["ssl_context"])
    return SASLCredentials(
        username=options["sasl_plain_username"], password=options["sasl_plain_password"],
        mechanism=broker.sasl_mechanism, ssl_context=options.get("ssl_context"),
    )


def broker_urls(bootstrap_servers: str) -> list[str]:
    """``"h1:9092,h2:9092"`` -> ``["kafka://h1:9092", "kafka://h2:9092"]`` (Faust's form)."""
    hosts = [h.strip() for h in bootstrap_servers.split(",") if h.strip()]
    if not hosts:
        raise ValueError("bootstrap_servers is empty")
    return [h if "://" in h else f"kafka://{h}" for h in hosts]


FAUST_LOGGER = "memstream.faust"
"""Logger of the Faust services defined here (their start/stop chatter stays with
Faust's own, which the worker shows from WARNING up unless debugging)."""


class MemstreamApp(faust.App):
    """memstream's :class:`faust.App` (see the module docstring)."""

    logger = logging.getLogger(FAUST_LOGGER)
    memstream_settings: Settings | None = None
    """Set by :func:`build_app`: how this app's own admin calls connect."""

    async def on_first_start(self) -> None:
        # Faust creates its data directory without parents.
        self.conf.datadir.parent.mkdir(parents=True, exist_ok=True)
        await super().on_first_start()
        await self.declare_internal_topics()

    def internal_topics(self) -> list[Any]:
        """The topics Faust creates for this app: agents' internal channels (the
        reflector's work topic) and the tables' changelogs."""
        channels = [agent.channel for agent in self.agents.values()]
        changelogs = [table.changelog_topic for table in self.tables.values()]
        return [t for t in [*channels, *changelogs] if isinstance(t, faust.TopicT) and t.internal]

    async def declare_internal_topics(self, timeout: float = 30.0) -> None:
        """Create the internal topics and wait until the broker lists them.

        Faust creates them just before its consumer subscribes; a topic the broker has
        not published yet is left out of that first assignment, and the consumer only
        notices it at its next metadata refresh, minutes later (an idle reflector)."""
        topics = self.internal_topics()
        for topic in topics:
            await topic.maybe_declare()
        names = [name for topic in topics for name in topic.topics]
        settings = self.memstream_settings
        kafka = settings.broker if settings is not None else ",".join(f"{url.host}:{url.port}" for url in self.conf.broker)
        deadline = time.monotonic() + timeout
        while names:
            visible = await topic_partitions(kafka, names, client_id=f"{self.conf.id}-declare")
            names = [name for name in names if name not in visible]
            if not names or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        if names:
            log.warning("internal topics not visible after %.0f s: %s", timeout, ", ".join(names))

    async def on_started(self) -> None:
        await super().on_started()
        log.info("worker %s started; Faust agents: %s", self.conf.id, ", ".join(sorted(self.agents)))


def group_instance_id(settings: Settings) -> str:
    """The worker's static consumer-group member id: app id and host name."""
    suffix = f"-{settings.worker.instance}" if settings.worker.instance else ""
    return f"{settings.worker.app_id}@{socket.gethostname()}{suffix}"


def build_app(
    settings: Settings,
    *,
    services: Sequence[str] | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
) -> MemstreamApp:
    """The configured Faust app with its services registered.

    ``services`` picks which to run (default: all of them).
    Faust's own web server stays off (it needs aiohttp, which memstream does not
    ship); health and metrics are served by memstream's HTTP API.
    """
    requested = list(services) if services is not None else list(SERVICE_NAMES)
    unknown = [a for a in requested if a not in SERVICE_NAMES]
    if unknown:
        raise ValueError(f"unknown service(s) {', '.join(unknown)} (known: {', '.join(SERVICE_NAMES)})")

    topics = Topics.from_settings(settings.broker)
    bound_inflation()  # every consumer of the worker
    app = MemstreamApp(
        settings.worker.app_id,
        broker=broker_urls(settings.broker.bootstrap_servers),
        broker_credentials=faust_credentials(settings.broker),
        store="memory://",  # tables are rebuilt from their changelog topics
        datadir=str(settings.home / "faust"),
        topic_partitions=settings.broker.partitions,
        topic_replication_factor=settings.broker.replication_factor,
        # The log is the source of truth: a new consumer group starts at the beginning.
        consumer_auto_offset_reset="earliest",
        # Static membership: a worker restarted on the same host (after a crash, a
        # deploy, a SIGKILL) takes its partitions back at once instead of waiting out
        # the dead member's session (60 s); a second worker of the same app on the
        # same host fences the first rather than splitting the log between them.
        consumer_group_instance_id=group_instance_id(settings),
        producer_acks=-1,
        # Agents emit many small records (reflections, expiries, re-keyed work); a
        # short linger lets the producer batch them instead of one request each.
        producer_linger=LINGER_MS / 1000.0,
        producer_max_batch_size=MAX_BATCH_BYTES,
        web_enabled=False,
        loop=loop,
    )
    app.memstream_settings = settings

    # A sharded set is written by workers in a consumer group, each owning some shards.
    sharded = projects_sharded(settings, TableSets(settings.storage.root).current())
    register: dict[str, Callable[[MemstreamApp, Settings, Topics], object]] = {
        "projector": register_group_projector if sharded else register_projector,
        "extractor": register_extractor,
        "reflector": register_reflector,
        "sealer": lambda app, settings, topics: register_sealer(app, settings.streams, settings.worker.app_id, topics),
    }
    for name in SERVICE_NAMES:
        if name in requested:
            register[name](app, settings, topics)
    pin_mmap_threshold(MMAP_THRESHOLD_BYTES)
    if trim_supported():

        async def release_memory() -> None:
            await asyncio.to_thread(release_free_memory)

        app.timer(RELEASE_EVERY_S, name="memstream.release-memory")(release_memory)
    return app
