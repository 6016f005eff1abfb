"""Memory as a tool: an MCP server bound to one memory bank.

The model gets five tools — ``add_memory``, ``query_memory``, ``record_decision``,
``get_lessons``, ``get_memory`` — and never sees a scope parameter. The bank (team,
user, agent) is pinned when the server is built, so whatever bank, team or user id a
model writes into the arguments is ignored (the argument models drop unknown keys),
and one bank can never read or write another's memories.

``add_memory``'s description starts with the auto-trigger line: it tells the model to
call the tool on its own, without being asked, when the user reveals something durable
— limited to what the bank's description says belongs in it. This is the
memory-as-plugin pattern: the bank becomes a pair of tools the model uses unprompted.

Writes are durable before a tool answers (the Kafka ack). Reads wait, bounded by
``read_wait_max_s``, until the projection has applied this server's own latest write,
so a model that adds a memory and then queries finds it (read-your-writes); if the
worker lags beyond the bound the answer says so instead of failing.

Served over stdio by ``memstream mcp --bank NAME`` and over streamable HTTP at ``/mcp``
inside the API server (which passes its shared :class:`MemoryService`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

from memstream.banks import Bank
from memstream.interfaces.mcp_tools import AddMemoryResult, BankTools, DecisionResult, LessonsResult, QueryResult
from memstream.interfaces.service import MemoryService
from memstream.settings import Settings

__all__ = [
    "AUTO_TRIGGER",
    "build_mcp_server",
    "add_memory_description",
    "AddMemoryResult",
    "QueryResult",
    "DecisionResult",
    "LessonsResult",
]

AUTO_TRIGGER = (
    "Call this tool on your own, without being asked, whenever the user reveals a durable "
    "fact, preference or instruction worth remembering in later conversations."
)


def add_memory_description(bank: Bank) -> str:
    """The ``add_memory`` description: the auto-trigger line first, then the bank's scope."""
    return (
        f"{AUTO_TRIGGER}\n"
        f'Memory bank "{bank.name}": {bank.description}\n'
        "Only store what belongs in this bank. Store one self-contained statement per call "
        '(e.g. "Alice prefers aisle seats"), not small talk, and never secrets such as '
        "passwords or keys. The memory is saved durably before the tool answers."
    )


def build_mcp_server(
    bank: Bank,
    settings: Settings,
    *,
    service: MemoryService | None = None,
    clock: Callable[[], datetime] | None = None,
    live: Callable[[], Bank] | None = None,
) -> MCPServer:
    """An MCP server whose tools read and write ``bank`` only.

    With ``service`` (the API server's), the server uses it and owns nothing; without
    one, the server starts its own service in its lifespan (stdio use) and stops it on
    exit. ``clock`` supplies "now" for templates and default deadlines. ``live``
    returns the bank as the registry declares it at the moment of each tool call (the
    API server passes its registry's; raises ``LookupError`` once it is removed):
    every call reads and writes the bank's current scope, never the one at start-up.
    """
    tools = BankTools(bank, settings, service, live, clock)
    owns_service = service is None

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[dict[str, Any]]:
        if not owns_service:
            yield {}
            return
        own = MemoryService(settings, client_id=f"memstream-mcp-{bank.name}")
        await own.start()
        tools.service = own
        try:
            yield {}
        finally:
            tools.service = None
            await own.stop()

    server: MCPServer = MCPServer(
        name=f"memstream-{bank.name}",
        title=f"memstream memory bank {bank.name}",
        instructions=(
            f'Long-term memory bank "{bank.name}": {bank.description} '
            "Use add_memory proactively for durable facts, preferences and instructions; "
            "use query_memory before answering questions that may depend on them."
        ),
        lifespan=lifespan,
        log_level="WARNING",
    )
    _add_tools(server, tools, bank)
    return server


def _add_tools(server: MCPServer, tools: BankTools, bank: Bank) -> None:
    """The five tools, with the descriptions and hints the model reads."""
    server.add_tool(
        tools.add_memory,
        description=add_memory_description(bank),
        annotations=ToolAnnotations(title="Remember", destructive_hint=False, idempotent_hint=False),
    )
    server.add_tool(
        tools.query_memory,
        description=(
            f'Search the memory bank "{bank.name}" ({bank.description}) with hybrid '
            "(semantic + keyword) search. Use it before answering anything that may depend "
            "on what the user told you before. Newer memories outrank superseded ones."
        ),
        annotations=ToolAnnotations(title="Recall", read_only_hint=True),
    )
    server.add_tool(
        tools.record_decision,
        description=(
            "Record a decision whose outcome is not known yet (e.g. a rating on a ticker). "
            "When the outcome arrives, a short lesson is reflected from it; read lessons with "
            "get_lessons before deciding on the same subject again."
        ),
        annotations=ToolAnnotations(title="Record decision", destructive_hint=False),
    )
    server.add_tool(
        tools.get_lessons,
        description=(
            "Lessons learned from past decisions on a subject (what was decided, what "
            "happened, what to do differently), sized to a token budget. Call it before a "
            "new decision on that subject."
        ),
        annotations=ToolAnnotations(title="Lessons", read_only_hint=True),
    )
    server.add_tool(
        tools.get_memory,
        description="One memory by id, with its history (what superseded it), links and provenance.",
        annotations=ToolAnnotations(title="Memory details", read_only_hint=True),
    )
