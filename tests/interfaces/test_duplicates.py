"""Idempotent client writes on the running stack (real broker, worker, API, LanceDB):
the same content written again by the same scope through HTTP, the SDK or MCP is the
same memory. HTTP answers 200 with ``duplicate: true`` and the stored memory's id and
position, MCP says ``duplicate``, the SDK's write carries the same id, and the view
holds one row. Another agent of the same user writing that content gets its own
memory (no answer tells it about the first), and a client's own ``memory_id`` is a
deliberate repeat."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from mcp import Client

from memstream.banks import RegistrySource
from memstream.domain.events import Scope
from memstream.interfaces.mcp_server import build_mcp_server
from memstream.projections.store.lance_store import LanceStore
from memstream.streams.producers.producer import MemstreamProducer
from tests.interfaces.iface_stack import Stack

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as c:
        yield c


async def _read(client: httpx.AsyncClient, stack: Stack, bank: str, memory_id: str, position: str) -> dict[str, Any]:
    resp = await client.get(f"/v1/memories/{memory_id}", headers=stack.headers(bank), params={"min_position": position})
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def _rows(stack: Stack, content: str) -> list[tuple[str, str, str]]:
    table = LanceStore.from_settings(stack.settings.storage, stack.settings.embeddings.dim, create=False).table("memories").to_arrow()
    rows = zip(*(table.column(c).to_pylist() for c in ("content", "user_id", "agent_id", "memory_id")))
    return sorted((user, agent, mid) for text, user, agent, mid in rows if text == content)


async def test_the_same_content_by_the_same_scope_is_one_memory_on_every_path(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    fact = f"Alice prefers window seats ({uuid.uuid4().hex[:8]})"
    first = await client.post("/v1/memories", headers=stack.headers("alice"), json={"content": fact})
    assert first.status_code == 202, first.text
    accepted = first.json()
    assert accepted["duplicate"] is False
    memory_id = accepted["memory_id"]

    # before the view has it: the same id, which the projection folds into one row
    async with MemstreamProducer(stack.settings.streams) as producer:
        sent = await producer.add_memory(Scope(team_id="acme", user_id="alice"), fact)
    assert sent.event.memory_id == memory_id
    await _read(client, stack, "alice", memory_id, str(sent.position))

    again = await client.post("/v1/memories", headers=stack.headers("alice"), json={"content": f"  {fact} "})
    assert again.status_code == 200, again.text
    assert again.json()["duplicate"] is True and again.json()["memory_id"] == memory_id
    assert again.json()["position"] == str(sent.position)  # the stored memory's last write

    source = RegistrySource(stack.settings)
    server = build_mcp_server(source.current().bank("alice"), stack.settings, live=lambda: source.current().bank("alice"))
    async with Client(server) as mcp:
        result = await mcp.call_tool("add_memory", {"content": fact})
    assert not result.is_error, result.content
    assert result.structured_content is not None
    assert result.structured_content["duplicate"] is True and result.structured_content["memory_id"] == memory_id

    # a deliberate repeat: the client names its own id
    own = await client.post("/v1/memories", headers=stack.headers("alice"), json={"content": fact, "memory_id": f"again-{memory_id[:8]}"})
    assert own.status_code == 202 and own.json()["duplicate"] is False, own.text
    await _read(client, stack, "alice", own.json()["memory_id"], own.json()["position"])
    assert _rows(stack, fact) == sorted([("alice", "default", memory_id), ("alice", "default", f"again-{memory_id[:8]}")])


async def test_a_duplicate_check_sees_only_the_callers_own_agent(stack: Stack, client: httpx.AsyncClient) -> None:
    fact = f"u1 books aisle seats ({uuid.uuid4().hex[:8]})"
    planner = await client.post("/v1/memories", headers=stack.headers("planner"), json={"content": fact})
    assert planner.status_code == 202, planner.text
    await _read(client, stack, "planner", planner.json()["memory_id"], planner.json()["position"])
    spy = await client.post("/v1/memories", headers=stack.headers("spy"), json={"content": fact})
    assert spy.status_code == 202 and spy.json()["duplicate"] is False, spy.text
    assert spy.json()["memory_id"] != planner.json()["memory_id"]
    await _read(client, stack, "spy", spy.json()["memory_id"], spy.json()["position"])
    again = await client.post("/v1/memories", headers=stack.headers("planner"), json={"content": fact})
    assert again.status_code == 200 and again.json()["memory_id"] == planner.json()["memory_id"], again.text
