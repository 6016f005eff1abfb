"""Real MCP client sessions (the SDK's ``Client``) against memstream's MCP server: in
process, over stdio (``python -m memstream mcp --bank NAME``) and over streamable HTTP
inside the API server, with the real broker and the real worker projecting."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import httpx2
import pytest
from tests.interfaces.iface_stack import Stack
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from memstream.banks import load_registry
from memstream.domain.events import Scope
from memstream.interfaces.mcp_server import AUTO_TRIGGER, build_mcp_server
from memstream.projections.store.lance_store import LanceStore
from memstream.streams.producers.producer import MemstreamProducer

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

TOOLS = {"add_memory", "query_memory", "record_decision", "get_lessons", "get_memory"}


async def call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


@pytest.fixture
def reader(stack: Stack) -> LanceStore:
    """A second reader of the projection, to check where writes really landed."""
    return LanceStore.from_settings(stack.settings.storage, stack.settings.embeddings.dim, read_consistency_interval=timedelta(0))


async def test_in_process_session_pins_the_bank(stack: Stack, reader: LanceStore) -> None:
    bank = load_registry(stack.settings).bank("carol")
    async with Client(build_mcp_server(bank, stack.settings)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == TOOLS
        description = tools["add_memory"].description or ""
        assert description.splitlines()[0] == AUTO_TRIGGER
        assert bank.description in description
        # No tool lets the model choose a scope.
        for tool in tools.values():
            assert not {"bank", "team_id", "user_id", "scope"} & set(tool.input_schema.get("properties", {}))

        marker = uuid.uuid4().hex[:8]
        added = await call(
            client,
            "add_memory",
            {
                "content": f"Carol is vegetarian and prefers aisle seats {marker}",
                "memory_type": "persona",
                # Whatever the model claims, the server's bank wins.
                "bank": "globex",
                "team_id": "globex",
                "user_id": "bob",
            },
        )
        assert added["bank"] == "carol"
        assert added["content"].startswith(f"Carol is vegetarian and prefers aisle seats {marker} (noted ")
        assert added["content"].endswith(" UTC)")  # the bank's template with the current date

        found = await call(client, "query_memory", {"query": f"aisle seats {marker}", "k": 3, "team_id": "globex"})
        assert found["up_to_date"] is True
        assert [m["memory_id"] for m in found["memories"]][:1] == [added["memory_id"]]
        assert found["memories"][0]["team_id"] == "mcpteam" and found["memories"][0]["user_id"] == "carol"

        detail = await call(client, "get_memory", {"memory_id": added["memory_id"]})
        assert detail["memory_id"] == added["memory_id"] and "history" in detail

        missing = await client.call_tool("get_memory", {"memory_id": "no-such-memory"})
        assert missing.is_error and "no memory" in str(missing.content[0])

        bad = await client.call_tool("add_memory", {"content": "   "})
        assert bad.is_error and "nothing was saved" in str(bad.content[0])

    # The memory is in Carol's space, and nowhere near Globex.
    assert reader.get_memory(Scope(team_id="mcpteam", user_id="carol"), added["memory_id"]) is not None
    assert reader.get_memory(Scope(team_id="globex", user_id="bob"), added["memory_id"]) is None


async def test_an_agent_pinned_bank_never_reads_another_agents_memory(stack: Stack) -> None:
    """The "bot" bank (team acme, agent bot) shares its user's memory space with the
    team-wide "acme" bank, but reads only what agent bot wrote: by search and by id."""
    marker = uuid.uuid4().hex[:8]
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as http:
        resp = await http.post(
            "/v1/memories",
            json={"content": f"The other agent's note {marker}", "scope": {"agent_id": "other"}},
            headers=stack.headers("acme"),
        )
        assert resp.status_code == 202, resp.text
        written = resp.json()
        seen = await http.get(
            f"/v1/memories/{written['memory_id']}",
            params={"min_position": written["position"]},
            headers=stack.headers("acme"),
        )
        assert seen.status_code == 200 and seen.json()["agent_id"] == "other"
        over_api = await http.get(f"/v1/memories/{written['memory_id']}", headers=stack.headers("bot"))
        assert over_api.status_code == 404

    bank = load_registry(stack.settings).bank("bot")
    async with Client(build_mcp_server(bank, stack.settings)) as client:
        by_id = await client.call_tool("get_memory", {"memory_id": written["memory_id"]})
        assert by_id.is_error and "no memory" in str(by_id.content[0])
        found = await call(client, "query_memory", {"query": f"other agent's note {marker}"})
        assert written["memory_id"] not in [m["memory_id"] for m in found["memories"]]


async def test_decision_outcome_lesson_round_trip(stack: Stack) -> None:
    bank = load_registry(stack.settings).bank("carol")
    subject = f"T{uuid.uuid4().hex[:6].upper()}"
    async with Client(build_mcp_server(bank, stack.settings)) as client:
        decided = await call(
            client,
            "record_decision",
            {"subject": subject, "rating": "buy", "decision_text": "Margins expand next quarter.", "horizon_days": 5, "team_id": "x"},
        )
        assert decided["position"].startswith(stack.topics.pending_reflections + ":")

        empty = await call(client, "get_lessons", {"subject": subject})
        assert empty["context"]["same_subject"] == []

        # The outcome arrives from elsewhere (a price feed) through the producer SDK.
        async with MemstreamProducer(stack.settings.streams, client_id="test-outcomes") as producer:
            await producer.observe_outcome(
                bank.scope, f"o-{decided['decision_id']}", subject, 0.08, 5,
                decision_id=decided["decision_id"], benchmark_return=0.01,
            )

        # The reflector settles the decision and reflects (a templated lesson without an
        # LLM); the projector makes it readable.
        deadline = time.monotonic() + 60
        while True:
            lessons = await call(client, "get_lessons", {"subject": subject, "budget_tokens": 600})
            if lessons["context"]["same_subject"]:
                break
            assert time.monotonic() < deadline, f"no lesson for {subject}:\n{stack.log_tail('worker')}"
            await asyncio.sleep(0.5)
        lesson = lessons["context"]["same_subject"][0]
        assert lesson["decision_id"] == decided["decision_id"] and lesson["correct"] is True
        assert subject in lessons["context"]["text"]


async def test_stdio_session(stack: Stack) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "memstream", "mcp", "--bank", "erin"], env=stack.env
    )
    marker = uuid.uuid4().hex[:8]
    async with Client(params, read_timeout_seconds=60) as client:
        assert {t.name for t in (await client.list_tools()).tools} == TOOLS
        added = await call(client, "add_memory", {"content": f"Erin drinks oat milk {marker}", "bank": "carol"})
        found = await call(client, "query_memory", {"query": f"oat milk {marker}"})
        assert found["memories"][0]["memory_id"] == added["memory_id"]
        assert found["memories"][0]["user_id"] == "erin"


@pytest.fixture
async def http_client(stack: Stack) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(headers=stack.headers("dave"), timeout=60) as c:
        yield c


async def test_streamable_http_inside_the_api(stack: Stack, http_client: httpx2.AsyncClient) -> None:
    marker = uuid.uuid4().hex[:8]
    transport = streamable_http_client(f"{stack.base_url}/mcp", http_client=http_client)
    async with Client(transport) as client:
        assert {t.name for t in (await client.list_tools()).tools} == TOOLS
        added = await call(client, "add_memory", {"content": f"Dave cycles to work {marker}", "user_id": "carol"})
        found = await call(client, "query_memory", {"query": f"cycles to work {marker}"})
        assert found["memories"][0]["memory_id"] == added["memory_id"]
        assert found["memories"][0]["user_id"] == "dave"  # the key's bank, not the argument
        assert stack.rerank is not None
        await call(client, "add_memory", {"content": f"Dave walks to the station {marker}"})
        asked = stack.rerank.rerank.count
        reranked = await call(client, "query_memory", {"query": f"cycles to work {marker}", "rerank": True})
        assert reranked["memories"][0]["memory_id"] == added["memory_id"]
        assert stack.rerank.rerank.count == asked + 1  # the search went through the reranker
        assert stack.rerank.rerank.requests[-1]["query"] == f"cycles to work {marker}"

    # The endpoint needs a key, and answers in the API's one error shape.
    denied = httpx.post(f"{stack.base_url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "unauthorized"
