"""The asynchronous side of LanceDB's synchronous tables, in one place.

Search awaits several reads together on LanceDB's own event loop, through the
asynchronous handle each synchronous table wraps (same version, same consistency
settings, no per-query schema round trips). LanceDB has no public accessor for that
handle nor for its loop, so this adapter is the only module that touches them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from lancedb.background_loop import LOOP

__all__ = ["async_table", "wait", "gather_all"]

_T = TypeVar("_T")


def async_table(table: Any) -> Any:
    """The ``AsyncTable`` a synchronous ``LanceTable`` wraps (private ``_table``: no
    public accessor in lancedb 0.40)."""
    native = getattr(table, "_table", None)
    if native is None or not hasattr(native, "query"):
        raise TypeError(f"{type(table).__name__} has no asynchronous handle (lancedb changed?)")
    return native


def wait(work: Awaitable[_T]) -> _T:
    """Run ``work`` on LanceDB's background event loop and wait for it (what every
    synchronous LanceDB call does). Never call a synchronous LanceDB API inside it."""

    async def run() -> _T:
        return await work

    return LOOP.run(run())


async def gather_all(work: Sequence[Awaitable[Any]]) -> list[Any]:
    """``asyncio.gather`` that, when one of them fails, cancels the others and waits
    for them before raising: no read outlives the search that started it."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
