"""One writer per LanceDB directory: an advisory file lock beside a local directory,
an expiring lease object (:mod:`memstream.projections.store.object_lease`) beside one on an
object store."""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memstream.projections.store.object_lease import LeaseBusyError, ObjectLease
from memstream.projections.store.object_paths import ObjectPath, as_path

__all__ = ["LanceDirBusyError", "LanceDirLock", "DEFAULT_LEASE_TTL_S", "stop_process"]

log = logging.getLogger(__name__)

DEFAULT_LEASE_TTL_S = 30.0


def stop_process(message: str) -> None:
    """What a writer does when it finds its object lease taken over: stop at once,
    before its next commit can land beside the new holder's (fail-stop fencing)."""
    log.critical("%s; stopping this process", message)
    os._exit(75)


class LanceDirBusyError(RuntimeError):
    """Another process (a worker, a replay's swap) owns the LanceDB directory."""


# Kept by hand: filelock takes exclusive flocks only (its reader/writer lock is SQLite), and
# workers in a group hold this shared beside a replay's probe (tests/services/shards/test_group.py).
class LanceDirLock:
    """The exclusive right to write (or swap) a LanceDB directory: an advisory
    ``flock`` on the sibling file ``<lance_dir>.lock``.

    Why: the projector's tables hold every partition, so two writers on one
    directory would interleave positions, and a replay must never swap the directory
    under a running worker. The kernel drops the lock when its process dies, SIGKILL
    included, so a crash never leaves a stale lock. The file sits next to the
    directory, not in it, so the lock belongs to the path that a swap renames.
    It only guards processes on the same host, which is where a local LanceDB
    directory can be written and renamed at all. POSIX only (``fcntl``).

    On an object store (an :class:`ObjectPath`) the lock is the lease object
    ``<dir>.lease`` instead, held exclusively (``shared`` takes nothing there: see
    docs/operations-storage.md); ``on_lost`` is told if the lease is taken over.
    """

    def __init__(
        self,
        lance_dir: Path | ObjectPath,
        *,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        on_lost: Callable[[str], None] | None = stop_process,
    ) -> None:
        self.dir: Any = as_path(lance_dir)
        self.path: Any = self.dir.with_name(self.dir.name + ".lock")
        self._fd: int | None = None
        self._lease: ObjectLease | None = None
        if isinstance(self.dir, ObjectPath):
            self._lease = ObjectLease(self.dir.with_name(self.dir.name + ".lease"), lease_ttl_s, on_lost)
            self.path = self._lease.path

    @property
    def is_local(self) -> bool:
        """A file lock (a local directory), not an object-store lease."""
        return self._lease is None

    @property
    def held(self) -> bool:
        return self._lease.held if self._lease is not None else self._fd is not None

    def valid(self) -> bool:
        """Whether writes under this lock are still allowed (a lease may expire)."""
        return self._lease.valid() if self._lease is not None else self._fd is not None

    @property
    def generation(self) -> int:
        """The lease's fencing number (0 for a file lock)."""
        return self._lease.generation if self._lease is not None else 0

    def acquire(self, owner: str, *, shared: bool = False) -> None:
        """Take the lock or raise :class:`LanceDirBusyError` naming the holder.
        ``shared``: several holders at once (workers in a consumer group, each writing
        its own shards under per-shard locks), none beside an exclusive holder."""
        if self._lease is not None:
            self._acquire_lease(owner, shared=shared, wait_s=0.0)
            return
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise LanceDirBusyError(f"{self.dir} is in use by {holder}") from None
        except BaseException:
            os.close(fd)
            raise
        if not shared:  # shared holders leave the last exclusive holder's name
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{owner} (pid {os.getpid()})".encode(), 0)
        self._fd = fd

    def try_acquire(self, owner: str) -> bool:
        """One exclusive attempt without waiting (a lease that stopped being renewed
        is taken by the attempt that finds it unchanged for its whole ttl)."""
        if self._lease is not None:
            return self._lease.try_acquire(owner)
        try:
            self.acquire(owner)
        except LanceDirBusyError:
            return False
        return True

    def _acquire_lease(self, owner: str, *, shared: bool, wait_s: float) -> None:
        """``wait_s`` 0: wait only as long as a holder that stopped renewing takes to
        expire. ``shared``: there is no reader-writer lease on an object store, so a
        shared holder takes the lease and lets go at once: it proves no exclusive
        holder is alive, and keeps nothing."""
        assert self._lease is not None
        if self._lease.held:
            return
        try:
            self._lease.acquire(owner, wait_s=wait_s or self._lease.ttl_s * 1.5)
        except LeaseBusyError as exc:
            raise LanceDirBusyError(str(exc)) from None
        if shared:
            self._lease.release()

    def acquire_waiting(self, owner: str) -> None:
        """Take the lock exclusively, waiting for any holder to let go."""
        if self._lease is not None:
            self._acquire_lease(owner, shared=False, wait_s=float("inf"))
            return
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{owner} (pid {os.getpid()})".encode(), 0)
        self._fd = fd

    def holder(self) -> str | None:
        """Who holds the lock now (the name the last exclusive holder wrote), or None."""
        if self._lease is not None:
            return self._lease.holder()
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another process"
        finally:
            os.close(fd)  # also drops the probe's own shared lock
        return None

    def release(self) -> None:
        if self._lease is not None:
            self._lease.release()
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock

    def __enter__(self) -> "LanceDirLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
