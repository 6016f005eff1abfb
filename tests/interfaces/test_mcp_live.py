"""MCP tools read their bank from the live registry on every call (the API server's
wiring and ``memstream mcp`` over stdio): a bank moved to another team reads and writes the new team at once, and a
removed bank answers a tool error; a bank declared while the API runs is served over
MCP at its first request. Real broker, real worker, real LanceDB."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from memstream.banks import RegistrySource, create_key
from memstream.interfaces.mcp_server import build_mcp_server
from tests.interfaces.iface_stack import Stack

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _bank(team: str) -> str:
    return f"[banks.mover]\nteam_id = '{team}'\nuser_id = 'u'\ndescription = 'A bank that moves.'\n"


async def _call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def test_a_moved_bank_reads_and_writes_its_new_team(stack: Stack, tmp_path: Path) -> None:
    mark = uuid.uuid4().hex[:8]
    beta, gamma = f"beta{mark}", f"gamma{mark}"
    banks = tmp_path / "banks.toml"
    banks.write_text(_bank(beta))
    settings = stack.settings.model_copy(update={"banks_file": banks, "keys_file": tmp_path / "keys.toml"})
    source = RegistrySource(settings)
    server = build_mcp_server(source.current().bank("mover"), stack.settings, live=lambda: source.current().bank("mover"))
    async with Client(server) as client:
        await _call(client, "add_memory", {"content": f"beta secret {mark}"})
        found = await _call(client, "query_memory", {"query": f"beta secret {mark}"})
        assert found["memories"] and found["memories"][0]["team_id"] == beta
        banks.write_text(_bank(gamma))  # the operator moves the bank
        found = await _call(client, "query_memory", {"query": f"beta secret {mark}"})
        assert found["memories"] == []  # beta is no longer this bank's
        added = await _call(client, "add_memory", {"content": f"gamma fact {mark}"})
        found = await _call(client, "query_memory", {"query": f"gamma fact {mark}"})
        assert [m["memory_id"] for m in found["memories"]] == [added["memory_id"]]
        assert found["memories"][0]["team_id"] == gamma
        banks.write_text("")  # removed
        result = await client.call_tool("query_memory", {"query": "anything"})
        assert result.is_error and "no longer declared" in str(result.content)


async def test_stdio_follows_the_bank_file_without_a_restart(stack: Stack, tmp_path: Path) -> None:
    mark = uuid.uuid4().hex[:8]
    beta, gamma = f"beta{mark}", f"gamma{mark}"
    banks = tmp_path / "banks.toml"
    banks.write_text(_bank(beta))
    env = {**stack.env, "MEMSTREAM_API_BANKS_FILE": str(banks), "MEMSTREAM_API_KEYS_FILE": str(tmp_path / "keys.toml")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "memstream", "mcp", "--bank", "mover"], env=env)
    async with Client(params, read_timeout_seconds=60) as client:
        await _call(client, "add_memory", {"content": f"beta secret {mark}"})
        found = await _call(client, "query_memory", {"query": f"beta secret {mark}"})
        assert found["memories"] and found["memories"][0]["team_id"] == beta
        banks.write_text(_bank(gamma))  # moved while the host's server runs
        found = await _call(client, "query_memory", {"query": f"beta secret {mark}"})
        assert found["memories"] == []
        added = await _call(client, "add_memory", {"content": f"gamma fact {mark}"})
        found = await _call(client, "query_memory", {"query": f"gamma fact {mark}"})
        assert [(m["memory_id"], m["team_id"]) for m in found["memories"]] == [(added["memory_id"], gamma)]
        banks.write_text("")  # removed: fails closed
        result = await client.call_tool("query_memory", {"query": "anything"})
        assert result.is_error and "no longer declared" in str(result.content)


async def test_a_bank_declared_while_the_api_runs_is_served_over_http(stack: Stack) -> None:
    mark = uuid.uuid4().hex[:8]
    name = f"late{mark}"
    assert stack.settings.api.banks_file is not None
    with stack.settings.api.banks_file.open("a", encoding="utf-8") as fh:  # as `memstream banks add` would, while `up` runs
        fh.write(f"\n[banks.{name}]\nteam_id = 'late'\nuser_id = 'u{mark}'\ndescription = 'Declared after the API started.'\n")
    key, _ = create_key(stack.settings, name)
    headers = {"Authorization": f"Bearer {key}"}
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    deadline = time.monotonic() + 3 * RegistrySource.RELOAD_EVERY_S  # the registry's bound, with room for a loaded machine
    while (status := httpx.post(f"{stack.base_url}/mcp", json=ping, headers=headers).status_code) == 401:
        assert time.monotonic() < deadline, "the new key was not taken within the registry's bound"
        await asyncio.sleep(0.5)
    assert status != 503
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        async with Client(streamable_http_client(f"{stack.base_url}/mcp", http_client=http)) as client:
            added = await _call(client, "add_memory", {"content": f"late bank fact {mark}"})
            found = await _call(client, "query_memory", {"query": f"late bank fact {mark}"})
    assert [m["memory_id"] for m in found["memories"]] == [added["memory_id"]]
    assert found["memories"][0]["team_id"] == "late"
