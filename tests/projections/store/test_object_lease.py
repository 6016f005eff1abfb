"""The expiring lease on an object store, against a real S3-compatible server
(SeaweedFS, ``scripts/s3-tests``): one holder at a time, a stalled holder's lease
taken over only after it went unrenewed for its ttl (with a higher generation), the
stalled holder told it lost it and no longer valid, and a released lease taken at once
(``dir_lock`` on an object-store root)."""

from __future__ import annotations

import threading
import time

import pytest
from tests.s3_support import needs_s3, s3_prefix, s3_root  # noqa: F401 - fixtures

from memstream.projections.store.dir_lock import LanceDirBusyError, LanceDirLock
from memstream.projections.store.object_lease import LeaseBusyError, ObjectLease
from memstream.projections.store.object_paths import ObjectPath

pytestmark = needs_s3

TTL = 2.0


def test_one_holder_at_a_time_and_a_release_hands_over_at_once(s3_root: ObjectPath) -> None:
    a, b = ObjectLease(s3_root / "p.lease", TTL), ObjectLease(s3_root / "p.lease", TTL)
    assert a.try_acquire("worker a") and a.valid() and a.generation == 1
    assert not b.try_acquire("worker b") and not b.held
    assert "worker a" in (b.holder() or "")
    time.sleep(TTL * 1.5)  # a renews meanwhile: b never sees one ETag for a whole ttl
    assert not b.try_acquire("worker b")
    assert a.valid()
    a.release()
    assert not a.valid() and b.holder() is None
    assert b.try_acquire("worker b") and b.generation == 2
    b.release()


def test_a_stalled_holder_is_taken_over_after_its_ttl_and_learns_it_lost(s3_root: ObjectPath) -> None:
    lost: list[str] = []
    a = ObjectLease(s3_root / "p.lease", TTL, on_lost=lost.append)
    b = ObjectLease(s3_root / "p.lease", TTL)
    a.acquire("worker a")
    a.pause_renewals()  # a stalls (GC pause, partition): its lease stops changing
    started = time.monotonic()
    b.acquire("worker b", wait_s=TTL * 4, poll_s=0.1)
    waited = time.monotonic() - started
    assert waited >= TTL, "taken over before the lease went unrenewed for its ttl"
    assert b.generation == a.generation + 1
    assert not a.valid(), "the stalled holder must count itself invalid before the take-over"
    assert a.renew() is False and lost and "another process took it over" in lost[0]
    assert b.valid()
    b.release()


def test_racing_contenders_get_exactly_one_lease(s3_root: ObjectPath) -> None:
    leases = [ObjectLease(s3_root / "race.lease", TTL) for _ in range(6)]
    barrier = threading.Barrier(len(leases))
    won: list[int] = []

    def contend(i: int) -> None:
        barrier.wait()
        if leases[i].try_acquire(f"racer {i}"):
            won.append(i)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(len(leases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    leases[won[0]].release()


def test_the_directory_lock_on_an_object_root_is_the_lease(s3_root: ObjectPath) -> None:
    shard = s3_root / "shards" / "0"
    first = LanceDirLock(shard, lease_ttl_s=TTL, on_lost=None)
    second = LanceDirLock(shard, lease_ttl_s=TTL, on_lost=None)
    first.acquire("worker one")
    assert first.held and first.valid() and first.generation == 1
    assert str(first.path) == f"{shard}.lease"
    with pytest.raises(LanceDirBusyError, match="worker one"):
        second.acquire("worker two")  # waits 1.5 ttl for an expiry that never comes
    assert not second.try_acquire("worker two")
    assert "worker one" in (second.holder() or "")
    first.release()
    assert second.holder() is None and second.try_acquire("worker two")
    # shared: proves no exclusive holder is alive, keeps nothing
    with pytest.raises(LanceDirBusyError):
        LanceDirLock(shard, lease_ttl_s=TTL, on_lost=None).acquire("reader", shared=True)
    second.release()
    reader = LanceDirLock(shard, lease_ttl_s=TTL, on_lost=None)
    reader.acquire("reader", shared=True)
    assert not reader.held and second.holder() is None


def test_an_unknown_holder_is_never_taken_from_while_it_renews(s3_root: ObjectPath) -> None:
    a = ObjectLease(s3_root / "q.lease", TTL)
    a.acquire("worker a")
    with pytest.raises(LeaseBusyError):
        ObjectLease(s3_root / "q.lease", TTL).acquire("worker b", wait_s=TTL * 2, poll_s=0.2)
    a.release()
