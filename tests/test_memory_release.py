"""Free memory handed back to the operating system: what glibc keeps after ``free``
leaves the process's resident set once released; the timer runs until cancelled and
is off at 0."""

from __future__ import annotations

import asyncio
import ctypes
import subprocess
import sys

import pytest

from memstream.memory_release import release_every, release_free_memory, trim_supported

pytestmark = pytest.mark.skipif(not trim_supported(), reason="glibc's malloc_trim is not available")

_BLOCK = 64 * 1024  # under glibc's mmap threshold: the blocks come from the heap
_BLOCKS = 3_000  # about 190 MB


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def test_freed_heap_memory_leaves_the_resident_set_once_released() -> None:
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(_BLOCK) for _ in range(_BLOCKS)]
    assert all(blocks)
    for block in blocks:
        ctypes.memset(block, 1, _BLOCK)  # touched: resident
    guard = libc.malloc(_BLOCK)  # above the freed blocks: free() alone cannot shrink the heap
    try:
        for block in blocks:
            libc.free(block)
        kept = _rss_mb()
        assert release_free_memory()
        released = kept - _rss_mb()
    finally:
        libc.free(guard)
    assert released > 100, f"only {released:.0f} MB of about 190 MB freed left the resident set"


def test_the_timer_releases_until_cancelled_and_is_off_at_zero() -> None:
    async def scenario() -> tuple[bool, bool]:
        off = asyncio.create_task(release_every(0))
        running = asyncio.create_task(release_every(0.01))
        await asyncio.sleep(0.1)
        off_done, running_done = off.done(), running.done()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        return off_done, running_done

    off_done, running_done = asyncio.run(scenario())
    assert off_done and not running_done


_PINNED = """
import ctypes, sys
from memstream.memory_release import pin_mmap_threshold
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("RssAnon:")) / 1024
if sys.argv[1] == "pin":
    assert pin_mmap_threshold(256 * 1024)
libc.free(libc.malloc(8 << 20))  # glibc raises its moving threshold past 1 MB here
blocks = [libc.malloc(1 << 20) for _ in range(150)]
for b in blocks:
    ctypes.memset(b, 1, 1 << 20)
guard = libc.malloc(100 << 10)  # above the blocks if they come from the heap
ctypes.memset(guard, 1, 100 << 10)
before = rss()
for b in blocks:
    libc.free(b)
print(before - rss())
"""


@pytest.mark.parametrize("pinned", [True, False])
def test_large_blocks_freed_leave_the_resident_set_at_once_with_the_threshold_pinned(pinned: bool) -> None:
    """With the threshold pinned, 1 MB blocks allocated after a larger one was freed get
    their own mappings and leave the resident set at ``free``; with glibc's moving
    threshold they come from the heap and stay until a trim (the case that
    fragmented the API's heap)."""
    out = subprocess.run([sys.executable, "-c", _PINNED, "pin" if pinned else "moving"],
                         capture_output=True, text=True, check=True)
    freed = float(out.stdout)
    assert (freed > 120) == pinned, f"{freed:.0f} MB of 150 left the resident set at free"
