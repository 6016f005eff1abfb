"""The HTTP server's MCP servers, one per bank, made when a bank is first asked for.

Banks come from the live registry (``RegistrySource``, re-read within its 5 s bound),
as REST keys do: a bank declared while the server runs is served over MCP at its
first request, no restart. Each server's session manager runs in a task of its own
(an anyio task group must be left by the task that entered it) until :meth:`close`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from mcp.server.mcpserver import MCPServer

from memstream.banks import RegistrySource
from memstream.interfaces.mcp_server import build_mcp_server
from memstream.interfaces.service import MemoryService
from memstream.settings import Settings

__all__ = ["McpServers"]

log = logging.getLogger(__name__)


class McpServers:
    """The MCP server of each bank served so far, started on demand."""

    def __init__(self, settings: Settings, source: RegistrySource, service: MemoryService) -> None:
        self._settings = settings
        self._source = source
        self._service = service
        self._servers: dict[str, MCPServer] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()

    @property
    def names(self) -> list[str]:
        return sorted(self._servers)

    async def get(self, name: str) -> MCPServer | None:
        """The server of bank ``name``, started if the live registry declares it; None
        once :meth:`close` began, or for a bank it does not declare."""
        server = self._servers.get(name)
        if server is not None or self._stop.is_set():
            return server
        async with self._lock:
            if name not in self._servers and not self._stop.is_set():
                if name not in self._source.current().banks:
                    return None
                self._servers[name] = await self._start(name)
        return self._servers.get(name)

    async def _start(self, name: str) -> MCPServer:
        source = self._source
        server = build_mcp_server(
            source.current().bank(name), self._settings, service=self._service,
            live=lambda: source.current().bank(name),
        )
        server.streamable_http_app(streamable_http_path="/mcp", host=self._settings.api.host)
        running: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def serve() -> None:
            try:
                async with server.session_manager.run():
                    running.set_result(None)
                    await self._stop.wait()
            except BaseException as exc:
                if not running.done():
                    running.set_exception(exc)
                raise

        self._tasks.append(asyncio.create_task(serve(), name=f"mcp-{name}"))
        await running
        return server

    async def close(self) -> None:
        """Stop every session manager (their open sessions end)."""
        self._stop.set()
        tasks, self._tasks = self._tasks, []
        results: list[Any] = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                log.warning("an MCP session manager stopped with %s", result)
        self._servers.clear()
