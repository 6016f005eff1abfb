"""One writer per LanceDB directory: an advisory file lock beside the directory."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["LanceDirBusyError", "LanceDirLock"]


class LanceDirBusyError(RuntimeError):
    """Another process (a worker, a replay's swap) owns the LanceDB directory."""


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
    """

    def __init__(self, lance_dir: Path) -> None:
        self.dir = Path(lance_dir)
        self.path = self.dir.with_name(self.dir.name + ".lock")
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, owner: str, *, shared: bool = False) -> None:
        """Take the lock or raise :class:`LanceDirBusyError` naming the holder.
        ``shared``: several holders at once (workers in a consumer group, each writing
        its own shards under per-shard locks), none beside an exclusive holder."""
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

    def acquire_waiting(self, owner: str) -> None:
        """Take the lock exclusively, waiting for any holder to let go."""
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
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock

    def __enter__(self) -> "LanceDirLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
