"""Handing the C allocator's free memory back to the operating system on a timer, in
the long-running processes (the HTTP API, the worker).

Why: LanceDB's reads, the change feeds' steps and the projector's writes allocate and
free native buffers from dozens of threads; glibc keeps what they free in its arenas
and rarely returns it, so a process's resident memory kept climbing after its caches
had reached their bounds (docs/benchmarks-history.md, memory).
``malloc_trim(0)`` returns every free page of every arena. It is glibc's: on another C
library (musl, macOS) this module does nothing. Arrow's buffers come from its own pool
(mimalloc), which is asked to return what it holds unused at the same time.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from collections.abc import Callable

import pyarrow as pa

__all__ = ["trim_supported", "release_free_memory", "release_every", "pin_mmap_threshold", "MMAP_THRESHOLD_BYTES", "RELEASE_EVERY_S"]

MMAP_THRESHOLD_BYTES = 256 * 1024
"""Allocations this large get their own mapping, returned to the system when freed:
with glibc's moving threshold, large freed buffers fragmented the API's heap under writes."""

RELEASE_EVERY_S = 10.0
"""How often the API and the worker hand free memory back (without it their resident
memory kept growing after their caches were full)."""

log = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` from the running process's own symbols, or ``None``."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


_TRIM = _malloc_trim()
_M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter number (``malloc.h``)."""


def pin_mmap_threshold(threshold_bytes: int) -> bool:
    """Serve each allocation of at least ``threshold_bytes`` from its own mapping, which
    goes back to the operating system when it is freed; ``True`` when set (glibc).

    Why: glibc raises its threshold (up to 32 MB) each time such a block is freed, so
    later large buffers (NumPy arrays, dictionaries of a cached space, LanceDB's reads)
    came from the heap, and the holes they left fragmented it: :func:`release_free_memory`
    cannot return a page a small live block still sits in (docs/benchmarks-history.md,
    memory). Setting the threshold also stops the raising. 0: leave glibc's."""
    if threshold_bytes <= 0 or _TRIM is None:
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold_bytes))


def trim_supported() -> bool:
    """Whether this process's C library can return free memory (glibc)."""
    return _TRIM is not None


def release_free_memory() -> bool:
    """Return the allocators' free pages to the operating system; ``True`` when glibc
    released some. ctypes releases the interpreter lock for the call."""
    pa.default_memory_pool().release_unused()
    return _TRIM is not None and bool(_TRIM(0))


async def release_every(interval_s: float) -> None:
    """Forever (until cancelled): every ``interval_s`` seconds, release free memory on a
    thread, so the event loop never waits for the allocator's walk of its arenas."""
    if interval_s <= 0 or not trim_supported():
        return
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(release_free_memory)
        except RuntimeError as exc:  # the default executor shut down: the process is stopping
            log.debug("free memory not released: %s", exc)
            return
