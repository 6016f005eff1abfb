"""Agent isolation through the real API (real broker, worker and LanceDB): two keys
pinned to two agents of one user ("planner" and "spy", banks in ``iface_stack``),
and a team-wide key of the same team. Each test is one way a key could read or write
another agent's memories, closed."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.interfaces.iface_stack import Stack

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as c:
        yield c


def _error(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()["error"]
    assert body["code"] == code, body
    return body  # type: ignore[no-any-return]


async def _memory(client: httpx.AsyncClient, stack: Stack, bank: str, **body: Any) -> dict[str, Any]:
    resp = await client.post("/v1/memories", headers=stack.headers(bank), json=body)
    assert resp.status_code == 202, resp.text
    return resp.json()  # type: ignore[no-any-return]


async def test_source_messages_never_read_another_agents_turn(stack: Stack, client: httpx.AsyncClient) -> None:
    mark = uuid.uuid4().hex[:8]
    turn_id = f"m-{mark}"
    resp = await client.post(
        "/v1/messages", headers=stack.headers("planner"),
        json={"messages": [{"content": f"planner secret {mark}", "message_id": turn_id}], "session_id": f"s-{mark}"},
    )
    assert resp.status_code == 202, resp.text
    spy = await _memory(client, stack, "spy", content=f"spy note {mark}", source_message_ids=[turn_id])
    for bank in ("spy", "trustteam"):
        resp = await client.get(
            f"/v1/memories/{spy['memory_id']}", headers=stack.headers(bank),
            params={"min_position": [spy["position"], resp.json()["position"]] if bank == "spy" else spy["position"],
                    **({"user_id": "u1"} if bank == "trustteam" else {})},
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["source_messages"] == [], bank


async def test_a_memory_id_of_another_agent_is_refused_with_409(stack: Stack, client: httpx.AsyncClient) -> None:
    mark = uuid.uuid4().hex[:8]
    mine = await _memory(client, stack, "planner", content=f"the plan {mark}", memory_id=f"plan-{mark}")
    got = await client.get(f"/v1/memories/{mine['memory_id']}", headers=stack.headers("planner"),
                           params={"min_position": mine["position"]})
    assert got.status_code == 200
    for bank, scope in (("spy", None), ("trustteam", {"user_id": "u1", "agent_id": "spy"})):
        body = {"content": "overwritten", "memory_id": mine["memory_id"], **({"scope": scope} if scope else {})}
        _error(await client.post("/v1/memories", headers=stack.headers(bank), json=body), 409, "memory_id_taken")
    got = await client.get(f"/v1/memories/{mine['memory_id']}", headers=stack.headers("planner"))
    assert got.status_code == 200 and got.json()["content"] == f"the plan {mark}"


async def test_a_raced_write_of_another_agents_id_never_replaces_the_row(stack: Stack, client: httpx.AsyncClient) -> None:
    # the spy writes before the planner's memory is projected: the API cannot see it
    # yet, so the projector refuses it (dead letter) and the planner's row stands
    mark = uuid.uuid4().hex[:8]
    mine = await _memory(client, stack, "planner", content=f"the plan {mark}", memory_id=f"race-{mark}")
    spy = await client.post("/v1/memories", headers=stack.headers("spy"),
                            json={"content": f"overwritten {mark}", "memory_id": mine["memory_id"]})
    positions = [mine["position"]] + ([spy.json()["position"]] if spy.status_code == 202 else [])
    got = await client.get(f"/v1/memories/{mine['memory_id']}", headers=stack.headers("planner"),
                           params={"min_position": positions})
    assert got.status_code == 200 and got.json()["content"] == f"the plan {mark}"
    _error(await client.get(f"/v1/memories/{mine['memory_id']}", headers=stack.headers("spy")), 404, "not_found")


async def test_a_link_to_another_agents_memory_is_403(stack: Stack, client: httpx.AsyncClient) -> None:
    mark = uuid.uuid4().hex[:8]
    mine = await _memory(client, stack, "planner", content=f"Alice flies on Friday {mark}")
    spy = await _memory(client, stack, "spy", content=f"Alice flies on Monday {mark}")
    got = await client.get(f"/v1/memories/{mine['memory_id']}", headers=stack.headers("planner"),
                           params={"min_position": [mine["position"], spy["position"]]})
    assert got.status_code == 200
    link = {
        "type": "MemoryLinked", "schema_version": 1, "from_memory_id": spy["memory_id"],
        "to_memory_id": mine["memory_id"], "relation": "supersedes",
    }
    _error(await client.post("/v1/events", headers=stack.headers("spy"), json=link), 403, "forbidden")
    # the planner's current-only search still finds its memory
    resp = await client.get("/v1/search", headers=stack.headers("planner"),
                            params={"q": f"Alice flies {mark}", "include_superseded": False})
    assert resp.status_code == 200
    assert mine["memory_id"] in [r["memory_id"] for r in resp.json()["results"]]


async def test_pinned_keys_never_read_each_other(stack: Stack, client: httpx.AsyncClient) -> None:
    mark = uuid.uuid4().hex[:8]
    mine = await _memory(client, stack, "planner", content=f"planner only fact {mark}")
    spy = await _memory(client, stack, "spy", content=f"spy only fact {mark}")
    positions = [mine["position"], spy["position"]]
    resp = await client.get("/v1/search", headers=stack.headers("spy"),
                            params={"q": f"only fact {mark}", "min_position": positions})
    found = [r["memory_id"] for r in resp.json()["results"]]
    assert spy["memory_id"] in found and mine["memory_id"] not in found
    assert {r["agent_id"] for r in resp.json()["results"]} == {"spy"}
    _error(await client.get(f"/v1/memories/{mine['memory_id']}", headers=stack.headers("spy")), 404, "not_found")
    _error(await client.get("/v1/search", headers=stack.headers("spy"), params={"q": "x", "agent_id": "planner"}),
           403, "forbidden")
    team = await client.get("/v1/search", headers=stack.headers("trustteam"),
                            params={"q": f"only fact {mark}", "user_id": "u1"})
    assert {mine["memory_id"], spy["memory_id"]} <= {r["memory_id"] for r in team.json()["results"]}


async def _lessons(client: httpx.AsyncClient, stack: Stack, bank: str, subject: str) -> list[dict[str, Any]]:
    """The bank's lessons on ``subject`` once the reflector wrote one (a readiness
    bound: the reflector ticks every half second)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        resp = await client.get("/v1/lessons", headers=stack.headers(bank), params={"subject": subject})
        assert resp.status_code == 200, resp.text
        if resp.json()["same_subject"]:
            return resp.json()["same_subject"]  # type: ignore[no-any-return]
        await asyncio.sleep(0.5)
    pytest.fail(f"no lesson on {subject} for {bank}")


async def _decide(client: httpx.AsyncClient, stack: Stack, bank: str, **body: Any) -> dict[str, Any]:
    resp = await client.post("/v1/decisions", headers=stack.headers(bank), json={"rating": "buy", "horizon_days": 1, **body})
    assert resp.status_code == 202, resp.text
    return resp.json()  # type: ignore[no-any-return]


async def _outcome(client: httpx.AsyncClient, stack: Stack, bank: str, subject: str, alpha: float, **body: Any) -> str:
    outcome_id = f"o-{bank}-{uuid.uuid4().hex[:8]}"
    event = {"type": "OutcomeObserved", "schema_version": 1, "outcome_id": outcome_id, "subject": subject,
             "raw_return": alpha, "alpha": alpha, "horizon_days": 1, **body}
    resp = await client.post("/v1/events", headers=stack.headers(bank), json=event)
    assert resp.status_code == 202, resp.text
    return outcome_id


async def test_another_agents_outcome_never_settles_a_decision(stack: Stack, client: httpx.AsyncClient) -> None:
    # the spy answers the planner's decision (by id, and subject-wide) with a loss
    # first; only the planner's own outcome, later on the same partition, settles it
    subject = f"AAPL{uuid.uuid4().hex[:6]}"
    decision = await _decide(client, stack, "planner", subject=subject, decision_text="Launch ahead; buy.")
    await _outcome(client, stack, "spy", subject, -0.2, decision_id=decision["decision_id"])
    await _outcome(client, stack, "spy", subject, -0.2)
    mine = await _outcome(client, stack, "planner", subject, 0.05, decision_id=decision["decision_id"])
    (lesson,) = await _lessons(client, stack, "planner", subject)
    assert (lesson["decision_id"], lesson["outcome_id"], lesson["correct"]) == (decision["decision_id"], mine, True)


async def test_a_decision_id_of_another_agent_names_another_decision(stack: Stack, client: httpx.AsyncClient) -> None:
    # the spy takes the planner's next decision id first: both decisions stand, each
    # settled by its own agent's outcome
    subject, decision_id = f"MSFT{uuid.uuid4().hex[:6]}", f"d-{uuid.uuid4().hex[:8]}"
    await _decide(client, stack, "spy", subject=subject, decision_text="Spy call; buy.", decision_id=decision_id)
    await _decide(client, stack, "planner", subject=subject, decision_text="Planner call; buy.", decision_id=decision_id)
    theirs = await _outcome(client, stack, "spy", subject, -0.1, decision_id=decision_id)
    mine = await _outcome(client, stack, "planner", subject, 0.1, decision_id=decision_id)
    for bank, text, outcome_id in (("planner", "Planner call; buy.", mine), ("spy", "Spy call; buy.", theirs)):
        (lesson,) = await _lessons(client, stack, bank, subject)
        assert (lesson["decision_text"], lesson["outcome_id"]) == (text, outcome_id), bank


async def test_a_link_id_of_another_agent_never_replaces_its_link(stack: Stack, client: httpx.AsyncClient) -> None:
    mark = uuid.uuid4().hex[:8]
    old = await _memory(client, stack, "planner", content=f"Alice lives in Lyon {mark}")
    new = await _memory(client, stack, "planner", content=f"Alice lives in Porto {mark}")
    link_id = f"l-{mark}"
    link = {"type": "MemoryLinked", "schema_version": 1, "link_id": link_id, "from_memory_id": new["memory_id"],
            "to_memory_id": old["memory_id"], "relation": "supersedes"}
    got = await client.get(f"/v1/memories/{old['memory_id']}", headers=stack.headers("planner"),
                           params={"min_position": [old["position"], new["position"]]})
    assert got.status_code == 200, got.text
    mine = await client.post("/v1/events", headers=stack.headers("planner"), json=link)
    assert mine.status_code == 202, mine.text
    a = await _memory(client, stack, "spy", content=f"spy note one {mark}")
    b = await _memory(client, stack, "spy", content=f"spy note two {mark}")
    got = await client.get(f"/v1/memories/{a['memory_id']}", headers=stack.headers("spy"),
                           params={"min_position": [a["position"], b["position"]]})
    assert got.status_code == 200, got.text
    theirs = await client.post("/v1/events", headers=stack.headers("spy"), json={
        **link, "from_memory_id": a["memory_id"], "to_memory_id": b["memory_id"], "relation": "same_entity"})
    assert theirs.status_code == 202, theirs.text
    got = await client.get(f"/v1/memories/{old['memory_id']}", headers=stack.headers("planner"),
                           params={"min_position": [mine.json()["position"], theirs.json()["position"]]})
    assert got.status_code == 200, got.text
    assert [(x["link_id"], x["from_memory_id"]) for x in got.json()["links_in"]] == [(link_id, new["memory_id"])]
    assert got.json()["status"] == "superseded"
    got = await client.get(f"/v1/memories/{b['memory_id']}", headers=stack.headers("spy"))
    assert [(x["link_id"], x["from_memory_id"]) for x in got.json()["links_in"]] == [(link_id, a["memory_id"])]
