"""The storage root on a real S3-compatible server (SeaweedFS, started by
``scripts/s3-tests``; skipped without one): workers in a consumer group project their
shards into ``s3://``, the HTTP API searches them there, two workers contend for
shard leases (one lease each, never both on one shard), a SIGKILLed worker's shards
are handed over through lease expiry, and a replay into ``s3://`` equals the same
log replayed into a local root. Real broker, real LanceDB on the object store."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path

import httpx
import pytest
from tests.s3_support import needs_s3, s3_prefix, storage_env, storage_settings  # noqa: F401 - fixture
from tests.services.shards.test_group import (
    SPACES, GroupWorker, Traffic, assert_shards_exact, group_settings, wait_caught_up,
)

from memstream.banks import create_key
from memstream.interfaces.api import create_api
from memstream.projections.store.object_paths import ObjectPath
from memstream.projections.store.shards import ShardedStore, shard_dir
from memstream.projections.store.table_sets import TableSets
from memstream.services.replay.rebuild import replay
from memstream.services.projector.shard_owner import ShardLeases, ShardLostError
from memstream.services.shards.routing import open_store
from memstream.services.shards.status import NotShardedError, shard_statuses
from memstream.settings.model import Settings
from memstream.streams.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow, *needs_s3]

PARTITIONS = 4
LEASE_TTL_S = 3.0
SESSION_S = 6.0


class S3Worker(GroupWorker):
    def env(self) -> dict[str, str]:
        return {**super().env(), **storage_env(self.settings)}


def owners(settings: Settings) -> dict[int, str]:
    try:
        return {s.partition: s.owner or "" for s in shard_statuses(settings, None)}
    except NotShardedError:  # the workers have not created the shards yet
        return {}


def pid_of(owner: str) -> int | None:
    found = re.search(r"\(pid (\d+)\)", owner)
    return int(found.group(1)) if found else None


def generation_of(owner: str) -> int:
    found = re.search(r"\(generation (\d+)\)", owner)
    assert found, owner
    return int(found.group(1))


async def wait_for(what: str, check, workers: list[S3Worker], timeout: float = 180.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        for w in workers:
            w.assert_alive()
        assert time.monotonic() < deadline, f"{what}\n" + "\n".join(w.log_text()[-2000:] for w in workers)
        await asyncio.sleep(0.5)


async def api_search(settings: Settings, tmp_path: Path, scope_index: int) -> list[dict[str, object]]:
    """``GET /v1/search`` through the real app (its lifespan opens the store on S3)."""
    scope = SPACES[scope_index]
    banks = tmp_path / "banks.toml"
    banks.write_text(f"[banks.b]\nteam_id = '{scope.team_id}'\nuser_id = '{scope.user_id}'\ndescription = 'd'\n")
    api_settings = settings.model_copy(update={"banks_file": banks, "keys_file": tmp_path / "keys.toml"})
    key, _ = create_key(api_settings, "b")
    app = create_api(api_settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            resp = await client.get(
                "/v1/search", params={"q": f"{scope.user_id} noted fact", "k": 100}, headers={"X-API-Key": key}
            )
    assert resp.status_code == 200, resp.text
    return list(resp.json()["results"])


async def test_workers_project_into_s3_hand_over_through_leases_and_replay_equals_a_local_root(
    kafka_bootstrap: str, topic_prefix: str, settings_for, tmp_path: Path, s3_prefix: str  # type: ignore[no-untyped-def]
) -> None:
    topics, settings = await group_settings(
        settings_for, kafka_bootstrap, topic_prefix, PARTITIONS,
        worker_session_timeout_s=SESSION_S, storage_lease_ttl_s=LEASE_TTL_S, **storage_settings(s3_prefix),
    )
    root = TableSets(settings.storage.root).root
    assert isinstance(root, ObjectPath)
    workers = [S3Worker(settings, tmp_path, f"w{i}") for i in range(2)]
    for w in workers:
        w.workdir = tmp_path / w.instance
        w.workdir.mkdir()
        w.start()
    try:
        await _project_hand_over_and_replay(settings, topics, workers, tmp_path)
    finally:
        for w in workers:  # a failed check must not leave worker processes behind
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait(timeout=30)


async def _project_hand_over_and_replay(
    settings: Settings, topics: Topics, workers: list[S3Worker], tmp_path: Path
) -> None:
    traffic = Traffic()
    load = asyncio.ensure_future(traffic.load(settings, 11))
    try:
        # Two workers contend for the shards: each holds the leases of its own, none both.
        pids = {w.proc.pid for w in workers if w.proc is not None}
        await wait_for(
            "both workers own shards", lambda: {pid_of(o) for o in owners(settings).values()} == pids, workers
        )
        assert all((shard_dir(TableSets(settings.storage.root).current(), p).with_name(f"{p}.lease")).is_file()
                   for p in range(PARTITIONS))

        victim, survivor = workers
        assert victim.proc is not None and survivor.proc is not None
        before = owners(settings)
        held = {p: generation_of(o) for p, o in before.items() if pid_of(o) == victim.proc.pid}
        assert held, before
        victim.kill()  # SIGKILL: its leases stay, unrenewed, until they expire
        await wait_for(
            "the survivor took every shard over",
            lambda: {pid_of(o) for o in owners(settings).values()} == {survivor.proc.pid},  # type: ignore[union-attr]
            [survivor],
        )
        after = owners(settings)
        # a killed holder releases nothing: each of its leases was taken over (expired), one generation up
        assert all(generation_of(after[p]) > g for p, g in held.items()), (before, after)
        await asyncio.sleep(2)
    finally:
        traffic.stop.set()
        await asyncio.gather(load, return_exceptions=True)
    await wait_caught_up(settings, topics, [survivor])
    live = assert_shards_exact(settings, traffic.acked)
    assert sum(len(v) for v in traffic.acked.values()) > 0

    # The HTTP API reads the space's shard from the object store, and only that space.
    results = await api_search(settings, tmp_path, 5)
    wanted = traffic.acked[SPACES[5]]
    found = {r["memory_id"] for r in results}
    assert wanted and found <= wanted and len(found) == min(100, len(wanted))
    assert all(str(r["content"]).startswith(f"{SPACES[5].user_id} ") for r in results)

    assert survivor.stop(signal.SIGTERM) == 0, survivor.log_text()[-3000:]
    # A replay into the object store swaps in a set equal to the live one...
    live_digest = live.table_digest()
    report = await replay(settings)
    assert report.swapped and report.live_matches is True, report.differences
    rebuilt = open_store(settings, TableSets(settings.storage.root).current(), create=False)
    assert isinstance(rebuilt, ShardedStore) and str(rebuilt.root).startswith("s3://")
    # ...and equal, row for row, to the same log replayed into a local root.
    local = settings.model_copy(update={"lance_dir": tmp_path / "local"})
    local_report = await replay(local)
    assert local_report.swapped
    local_store = open_store(local, TableSets(local.lance_dir).current(), create=False)
    assert local_store.table_digest() == rebuilt.table_digest() == live_digest


async def test_a_shard_lease_is_handed_over_and_the_old_holder_can_no_longer_write(
    kafka_bootstrap: str, topic_prefix: str, settings_for, s3_prefix: str  # type: ignore[no-untyped-def]
) -> None:
    settings = settings_for(
        Topics(prefix=topic_prefix, partitions=2, replication_factor=1),
        sharded=True, embedder="local", storage_lease_ttl_s=LEASE_TTL_S, **storage_settings(s3_prefix),
    )
    set_dir = TableSets(settings.storage.root).current()
    first = ShardLeases(set_dir, "worker one", LEASE_TTL_S)
    second = ShardLeases(set_dir, "worker two", LEASE_TTL_S)
    await first.take(0)
    first.check([0])
    waiting = asyncio.ensure_future(second.take(0, wait_s=60))
    await asyncio.sleep(LEASE_TTL_S * 1.5)  # the holder renews: the contender keeps waiting
    assert not waiting.done() and second.held() == frozenset()
    first.release({0})  # a rebalance: the old owner lets go, the new one takes over at once
    await asyncio.wait_for(waiting, 30)
    assert second.held() == {0} and second.generation(0) == 2
    second.check([0])
    with pytest.raises(ShardLostError):
        first.check([0])
    second.release({0})
