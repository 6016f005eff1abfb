"""``async with`` for memstream's clients: each has ``start()`` and ``stop()``, and a
block starts it on entry and stops it on exit, an exception included."""

from __future__ import annotations

from typing import Self

__all__ = ["StartStop"]


class StartStop:
    """Mixin: ``async with client:`` runs ``await client.start()`` and, on the way out,
    ``await client.stop()``."""

    async def start(self) -> object:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
