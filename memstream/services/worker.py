"""Run the memstream Faust worker in this process (``memstream worker``,
``python -m memstream.services.worker``).

Why not ``faust -A ... worker``: the app is built from :class:`Settings` at run time
(topic prefix, app id, LanceDB directory), the topics must exist before Faust
subscribes (the broker may refuse to auto-create them, and auto-created topics would
get the broker's retention instead of "forever"), and a worker must stop cleanly on
SIGINT and SIGTERM: Faust's :class:`faust.Worker` installs those handlers, stops the
services (the batch being written finishes first), flushes the producer, and exits 0.
A SIGKILL loses nothing either: the projector resumes from its stored positions.

One projector worker per LanceDB directory: the projector's tables hold every
partition, so a second worker sharing the consumer group would only see part of the
log. The worker takes the directory's lock (``<lance_dir>.lock``, see
:class:`~memstream.services.projector.service.LanceDirLock`) and refuses to start when
another worker or a replay's swap holds it. Scale reads with more API processes, not
more projector workers. Workers running other service sets (``--services extractor``)
should use their own ``MEMSTREAM_WORKER_APP_ID``: one Faust app, one set of services.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from typing import Any

import faust

from memstream.gc_tuning import tune_gc
from memstream.private_files import private_by_default
from memstream.projections.store import LanceDirBusyError, LanceDirLock, TableSets
from memstream.services.app import FAUST_LOGGER, SERVICE_NAMES, build_app
from memstream.services.shards import create_shards, projects_sharded
from memstream.settings import Settings, load_settings, parse_log_level
from memstream.streams.admin import TopicCreationError, ensure_topics
from memstream.streams.connect import until_reachable
from memstream.streams.topics import Topics

__all__ = ["WorkerError", "logging_config", "run_worker", "main"]

log = logging.getLogger("memstream.services.worker")

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class WorkerError(RuntimeError):
    """The worker could not start or stopped because of an error (one readable line)."""


class _TransientCoordinatorNoise(logging.Filter):
    """Drop aiokafka's "coordinator not available" errors: every fresh consumer group
    meets them while the broker elects a coordinator, and aiokafka retries them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("aiokafka.consumer.group_coordinator"):
            return "CoordinatorNotAvailable" not in record.getMessage()
        return True


class _Worker(faust.Worker):
    """Faust's worker, announcing what it runs once logging is set up."""

    def __init__(self, app: faust.App, settings: Settings, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.memstream_settings = settings

    async def on_execute(self) -> None:
        await super().on_execute()
        s = self.memstream_settings
        log.info(
            "memstream worker %s: broker %s, topics %s*, LanceDB %s",
            s.worker.app_id,
            s.broker.bootstrap_servers,
            s.broker.topic_prefix,
            s.storage.root,
        )


def logging_config(level: int) -> dict[str, object]:
    """One readable line per record on stderr; Faust, mode and aiokafka only from
    WARNING up unless ``level`` is DEBUG."""
    libraries = level if level <= logging.DEBUG else max(level, logging.WARNING)
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"transient": {"()": _TransientCoordinatorNoise}},
        "formatters": {"memstream": {"format": LOG_FORMAT}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "memstream",
                "filters": ["transient"],
            }
        },
        "loggers": {
            name: {"level": libraries}
            for name in ("aiokafka", "faust", "mode", FAUST_LOGGER)
        },
        "root": {"level": level, "handlers": ["stderr"]},
    }


def run_worker(
    settings: Settings,
    *,
    services: Sequence[str] | None = None,
    loglevel: str = "info",
) -> int:
    """Create the topics, then run the worker until SIGINT/SIGTERM. Returns the exit code.

    Blocks the calling thread, which must be the main thread (signal handlers).
    """
    try:
        level = parse_log_level(loglevel)
    except ValueError as exc:
        raise WorkerError(str(exc)) from None
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    topics = Topics.from_settings(settings.broker)
    try:
        # A worker started while the broker (re)starts waits for it instead of dying.
        loop.run_until_complete(
            until_reachable(lambda: ensure_topics(settings.broker, topics), "creating topics")
        )
    except TopicCreationError as exc:
        loop.close()
        raise WorkerError(str(exc)) from exc

    lock = LanceDirLock(settings.storage.root, lease_ttl_s=settings.storage.lease_ttl_s)
    if services is None or "projector" in services:
        # Workers writing shards share the root (each shard has its own lease); a
        # worker writing an unsharded set, or a replay's swap, holds it alone.
        current = TableSets(settings.storage.root).current()
        sharded = projects_sharded(settings, current)
        try:
            lock.acquire(f"memstream worker {settings.worker.app_id}", shared=sharded)
            if sharded:
                create_shards(settings, current)
        except LanceDirBusyError as exc:
            loop.close()
            raise WorkerError(f"cannot project: {exc}") from exc

    try:
        app = build_app(settings, services=services, loop=loop)
    except ValueError as exc:
        lock.release()
        loop.close()
        raise WorkerError(str(exc)) from exc

    tune_gc()
    worker = _Worker(
        app,
        settings,
        loop=loop,
        loglevel=level,
        logging_config=logging_config(level),
        redirect_stdouts=False,
        quiet=True,
    )
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        code = int(exc.code or 0)
        log.info("memstream worker %s stopped (exit code %d)", settings.worker.app_id, code)
        return code
    except Exception as exc:  # noqa: BLE001 - report the crash as one line + exit 1
        log.debug("worker crashed", exc_info=True)
        raise WorkerError(f"worker crashed: {type(exc).__name__}: {exc}") from exc
    finally:
        lock.release()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m memstream.services.worker [--services projector,...] [--loglevel info]``
    (``--agents``: the old name of ``--services``, kept for one release)."""
    private_by_default()
    parser = argparse.ArgumentParser(
        prog="python -m memstream.services.worker",
        description="Run the memstream Faust worker (settings from MEMSTREAM_* variables).",
    )
    parser.add_argument(
        "--services",
        default=None,
        help=f"comma-separated subset of {','.join(SERVICE_NAMES)} (default: all available)",
    )
    parser.add_argument("--agents", default=None, help="deprecated: use --services")
    parser.add_argument("--loglevel", default="info")
    args = parser.parse_args(argv)
    if args.agents is not None:
        print("warning: --agents is deprecated, use --services", file=sys.stderr)
    chosen = args.services or args.agents
    services = [a.strip() for a in chosen.split(",") if a.strip()] if chosen else None
    try:
        return run_worker(load_settings(), services=services, loglevel=args.loglevel)
    except WorkerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
