"""The HTTP API on a real uvicorn server (loopback, random port) with real Kafka, a real
worker projecting into LanceDB, and tenant-bound keys."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from aiokafka import AIOKafkaConsumer, TopicPartition

from memstream.domain.log import LogPosition
from memstream import metrics
from memstream.interfaces.api import openapi_spec
from memstream.projections.search.cache import CACHE_MAX_ROWS
from memstream.projections.search.vectors import VECTORS_MAX_ROWS
from memstream.settings.model import Settings

from tests.interfaces.iface_stack import Stack

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
async def offsets_consumer(stack: Stack) -> AsyncIterator[AIOKafkaConsumer]:
    consumer = AIOKafkaConsumer(bootstrap_servers=stack.settings.broker.bootstrap_servers, group_id=None)
    await consumer.start()
    yield consumer
    await consumer.stop()


@pytest.fixture
def end_offsets(stack: Stack, offsets_consumer: AIOKafkaConsumer) -> Callable[[], Awaitable[dict[tuple[str, int], int]]]:
    """Every partition's end offset across the deployment's topics (to prove that a
    rejected request wrote nothing anywhere)."""
    parts = [TopicPartition(spec.name, p) for spec in stack.topics.catalogue() for p in range(spec.partitions)]

    async def read() -> dict[tuple[str, int], int]:
        ends = await offsets_consumer.end_offsets(parts)
        return {(tp.topic, tp.partition): o for tp, o in ends.items()}

    return read


def assert_error(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}, body
    assert body["error"]["code"] == code, body
    assert body["error"]["message"]
    return body["error"]


async def test_write_then_read_your_write(stack: Stack, client: httpx.AsyncClient) -> None:
    marker = uuid.uuid4().hex[:8]
    resp = await client.post(
        "/v1/memories",
        headers=stack.headers("alice"),
        json={"content": f"Alice prefers window seats on flight {marker}", "memory_type": "preference", "priority": 80},
    )
    assert resp.status_code == 202, resp.text
    accepted = resp.json()
    position = LogPosition.parse(accepted["position"])
    assert position.topic == stack.topics.events
    uuid.UUID(accepted["event_id"])

    # The read waits until the projection has applied the write, then finds it.
    resp = await client.get(
        "/v1/search",
        headers=stack.headers("alice"),
        params={"q": f"window seats {marker}", "k": 5, "min_position": accepted["position"], "explain": True},
    )
    assert resp.status_code == 200, resp.text
    results = resp.json()["results"]
    assert results and results[0]["memory_id"] == accepted["memory_id"]
    assert results[0]["memory_type"] == "persona"  # legacy name mapped
    assert "parts" in results[0] and "vector" not in results[0]

    resp = await client.get(
        f"/v1/memories/{accepted['memory_id']}",
        headers={"X-API-Key": stack.keys["alice"]},
        params={"min_position": accepted["position"]},
    )
    assert resp.status_code == 200, resp.text
    memory = resp.json()
    assert memory["content"].endswith(marker) and memory["user_id"] == "alice"
    assert {"history", "links_out", "links_in", "provenance"} <= set(memory)
    assert memory["provenance"]["method"] == "api"


async def test_the_default_embedder_finds_facts_asked_for_in_other_words(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    """API write (no vector) -> the projector embeds it with the default model ->
    search finds it from a question that shares no word with it but the name."""
    facts = {
        "seat": "Frank prefers window seats on flights",
        "job": "Frank works night shifts as a nurse in Boston",
        "pets": "Frank has two cats named Miso and Tofu",
        "food": "Frank is allergic to peanuts",
        "home": "Frank grew up in a small fishing village in Norway",
        "car": "Frank drives an old red Volvo",
    }
    ids, last = {}, ""
    for key, text in facts.items():
        resp = await client.post("/v1/memories", headers=stack.headers("frank"), json={"content": text})
        assert resp.status_code == 202, resp.text
        ids[key], last = resp.json()["memory_id"], resp.json()["position"]
    asked = {
        "seat": "Where does Frank like to sit on a plane?",
        "job": "What does Frank do for a living?",
        "pets": "Which animals live with Frank?",
        "food": "What can Frank not eat?",
    }
    for key, question in asked.items():
        resp = await client.get(
            "/v1/search", headers=stack.headers("frank"), params={"q": question, "k": 3, "min_position": last}
        )
        assert resp.status_code == 200, resp.text
        assert ids[key] in [r["memory_id"] for r in resp.json()["results"]], question


async def test_position_not_reached_is_a_clear_error(stack: Stack, client: httpx.AsyncClient) -> None:
    # A position no write has reached is answered at once (it used to poll for the
    # whole wait: 50 such reads kept a core busy): no wait, the partition's end named.
    far = f"{stack.topics.events}:0:999999999"
    resp = await client.get(
        "/v1/search", headers=stack.headers("alice"), params={"q": "x", "min_position": far, "wait_s": 20}
    )
    err = assert_error(resp, 409, "position_beyond_log")
    assert err["details"]["requested"] == far and 0 <= err["details"]["end_offset"] < 999999999
    assert "waited_s" not in err["details"]
    assert_error(
        await client.get("/v1/search", headers=stack.headers("alice"), params={"q": "x", "min_position": "nonsense"}),
        422,
        "validation_error",
    )
    assert_error(
        await client.get("/v1/search", headers=stack.headers("alice"), params={"q": "x", "min_position": "other.topic:0:1"}),
        422,
        "validation_error",
    )


async def test_auth_401_and_403_never_cross_tenants(stack: Stack, client: httpx.AsyncClient, end_offsets: Any) -> None:
    before = await end_offsets()
    body = {"content": "should never be written"}
    assert_error(await client.post("/v1/memories", json=body), 401, "unauthorized")
    assert_error(
        await client.post("/v1/memories", json=body, headers={"Authorization": "Bearer msk_not-a-key"}), 401, "unauthorized"
    )
    assert_error(await client.get("/v1/search", params={"q": "x"}, headers={"X-API-Key": "nope"}), 401, "unauthorized")

    # Team A's key (acme) cannot write or read team B (globex).
    foreign = {"type": "MemoryAdded", "memory_id": "m1", "content": body["content"], "scope": {"team_id": "globex", "user_id": "bob"}}
    err = assert_error(await client.post("/v1/events", json=foreign, headers=stack.headers("acme")), 403, "forbidden")
    assert err["details"]["bank"] == "acme"
    assert_error(
        await client.post("/v1/memories", json={**body, "scope": {"team_id": "globex"}}, headers=stack.headers("acme")),
        403,
        "forbidden",
    )
    assert_error(
        await client.get("/v1/search", params={"q": "x", "team_id": "globex"}, headers=stack.headers("acme")), 403, "forbidden"
    )
    # A user-pinned key cannot reach another user of its own team; an agent-pinned one, another agent.
    assert_error(
        await client.get("/v1/search", params={"q": "x", "user_id": "bob"}, headers=stack.headers("alice")), 403, "forbidden"
    )
    assert_error(
        await client.post("/v1/memories", json={**body, "scope": {"agent_id": "other"}}, headers=stack.headers("bot")),
        403,
        "forbidden",
    )
    assert await end_offsets() == before  # nothing was written

    # Bob's memory is invisible to ACME's team-wide key, even by id.
    resp = await client.post("/v1/memories", json={"content": "Bob's secret plan"}, headers=stack.headers("globex"))
    assert resp.status_code == 202
    written = resp.json()
    own = await client.get(
        f"/v1/memories/{written['memory_id']}", headers=stack.headers("globex"), params={"min_position": written["position"]}
    )
    assert own.status_code == 200
    assert_error(
        await client.get(f"/v1/memories/{written['memory_id']}", headers=stack.headers("acme"), params={"user_id": "bob"}),
        404,
        "not_found",
    )
    found = await client.get(
        "/v1/search", headers=stack.headers("acme"), params={"q": "Bob's secret plan", "user_id": "bob"}
    )
    assert found.status_code == 200 and found.json()["results"] == []


@pytest.mark.parametrize(
    ("path", "body", "code", "fragment"),
    [
        ("/v1/memories", {"content": "   "}, "invalid_event", "content"),
        ("/v1/memories", {"content": "x", "memory_type": "gossip"}, "invalid_event", "memory type"),
        ("/v1/memories", {"content": "x", "priority": 101}, "validation_error", "priority"),
        ("/v1/memories", {"content": "x", "colour": "red"}, "validation_error", "colour"),
        ("/v1/memories", {"content": "x", "timestamp": "2025-01-01T10:00:00"}, "invalid_event", "UTC offset"),
        ("/v1/memories", {"content": "x", "memory_id": "has space"}, "invalid_event", "memory_id"),
        ("/v1/events", {"type": "Gossip", "content": "x"}, "invalid_event", "unknown event type"),
        ("/v1/events", {"type": "MemoryAdded", "content": "x"}, "invalid_event", "memory_id"),
        ("/v1/events", [1, 2], "invalid_event", "JSON object"),
        ("/v1/messages", {"messages": []}, "validation_error", "messages"),
        ("/v1/messages", {"messages": [{"content": "ok"}, {"content": ""}]}, "invalid_event", "messages.1"),
        ("/v1/decisions", {"subject": "ACME", "rating": "maybe", "decision_text": "x"}, "invalid_event", "rating"),
    ],
)
async def test_invalid_bodies_are_422_and_write_nothing(
    stack: Stack, client: httpx.AsyncClient, end_offsets: Any, path: str, body: Any, code: str, fragment: str
) -> None:
    before = await end_offsets()
    resp = await client.post(path, json=body, headers=stack.headers("acme"))
    err = assert_error(resp, 422, code)
    assert fragment.lower() in json.dumps(err).lower(), err
    assert await end_offsets() == before


async def test_non_json_and_oversized_bodies(stack: Stack, client: httpx.AsyncClient, end_offsets: Any) -> None:
    before = await end_offsets()
    h = {**stack.headers("acme"), "content-type": "application/json"}
    assert_error(await client.post("/v1/events", content=b"{not json", headers=h), 422, "validation_error")
    huge = json.dumps({"content": "x" * (stack.settings.api.max_body_bytes + 1)}).encode()
    assert_error(await client.post("/v1/memories", content=huge, headers=h), 413, "payload_too_large")
    assert await end_offsets() == before


async def test_events_messages_and_decisions(stack: Stack, client: httpx.AsyncClient) -> None:
    h = stack.headers("acme")
    resp = await client.post(
        "/v1/events",
        headers=h,
        json={
            "type": "MemoryAdded",
            "schema_version": 2,
            "memory_id": f"ev-{uuid.uuid4().hex[:6]}",
            "content": "The ACME office moved to Lyon",
            "scope": {"team_id": "acme", "user_id": "ops"},
        },
    )
    assert resp.status_code == 202, resp.text
    assert LogPosition.parse(resp.json()["position"]).topic == stack.topics.events

    resp = await client.post(
        "/v1/messages",
        headers=h,
        json={"session_id": "s1", "messages": [{"role": "user", "content": "I moved to Lyon"}, {"role": "assistant", "content": "Noted!"}]},
    )
    assert resp.status_code == 202, resp.text
    turns = resp.json()
    positions = [LogPosition.parse(e["position"]) for e in turns["events"]]
    assert {p.topic for p in positions} == {stack.topics.messages}
    assert len({p.partition for p in positions}) == 1 and positions[0].offset < positions[1].offset
    assert turns["position"] == turns["events"][-1]["position"]
    # The projector applies turns too, so a read can wait for them.
    waited = await client.get("/v1/search", headers=h, params={"q": "Lyon", "min_position": turns["position"]})
    assert waited.status_code == 200, waited.text

    resp = await client.post(
        "/v1/decisions",
        headers=h,
        json={"subject": "ACME", "rating": "Buy", "decision_text": "Strong quarter ahead.", "horizon_days": 5},
    )
    assert resp.status_code == 202, resp.text
    decision = resp.json()
    assert LogPosition.parse(decision["position"]).topic == stack.topics.pending_reflections
    assert decision["decision_id"] and decision["deadline"]

    # A decision's position is on the reflector's topic, which the store never reaches.
    err = assert_error(
        await client.get("/v1/lessons", headers=h, params={"subject": "ACME", "min_position": decision["position"]}),
        422,
        "validation_error",
    )
    assert "not projected" in err["message"]

    lessons = await client.get("/v1/lessons", headers=h, params={"subject": "ACME", "budget": 400})
    assert lessons.status_code == 200, lessons.text
    body = lessons.json()
    assert body["subject"] == "ACME" and body["budget_tokens"] == 400 and "text" in body


async def test_health_metrics_and_unknown_routes(stack: Stack, client: httpx.AsyncClient) -> None:
    health = await client.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    # Make sure at least one event was counted by this server, then scrape.
    written = await client.post("/v1/memories", headers=stack.headers("acme"), json={"content": "metrics probe"})
    assert written.status_code == 202
    searched = await client.get(
        "/v1/search", headers=stack.headers("acme"), params={"q": "probe", "min_position": written.json()["position"]}
    )
    assert searched.status_code == 200 and searched.json()["results"]
    text = (await client.get("/metrics")).text
    gauges = {
        line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("memstream_search_")
    }
    assert gauges["memstream_search_kept_memories"] >= 1 and gauges["memstream_search_kept_bytes"] > 0
    assert gauges["memstream_search_kept_spaces"] >= 1 and gauges["memstream_search_cache_spaces"] >= 1
    assert "memstream_search_change_steps" in gauges
    assert gauges["memstream_search_cache_rows_max"] == CACHE_MAX_ROWS
    assert gauges["memstream_search_kept_memories_max"] == VECTORS_MAX_ROWS
    assert 'memstream_events_in_total{interface="api",type="MemoryAdded"}' in text
    events = stack.topics.events
    assert f'memstream_log_end_offset{{partition="0",topic="{events}"}}' in text
    assert f'memstream_consumer_lag{{partition="0",topic="{events}"}}' in text
    assert "memstream_events_projected{" in text
    assert "memstream_dead_letters" in text
    assert "memstream_log_state_up 1.0" in text
    assert "memstream_search_seconds_bucket" in text
    assert_error(await client.get("/v1/nothing-here"), 404, "not_found")


def test_openapi_spec_is_committed_and_current() -> None:
    committed = json.loads((REPO / "docs" / "openapi.json").read_text(encoding="utf-8"))
    assert committed == json.loads(json.dumps(openapi_spec(Settings()))), (
        "docs/openapi.json is stale: run `python -m memstream.interfaces.api --openapi > docs/openapi.json`"
    )


async def test_served_spec_matches(stack: Stack, client: httpx.AsyncClient) -> None:
    served = (await client.get("/openapi.json")).json()
    assert served["paths"].keys() == openapi_spec(Settings())["paths"].keys()
    assert {"HTTPBearer", "APIKeyHeader"} <= set(served["components"]["securitySchemes"])


async def test_bad_query_parameters(stack: Stack, client: httpx.AsyncClient) -> None:
    h = stack.headers("acme")
    assert_error(await client.get("/v1/search", headers=h, params={"q": "x", "user_id": "not an id"}), 422, "validation_error")
    assert_error(await client.get("/v1/search", headers=h, params={"q": "x", "memory_type": "gossip"}), 422, "validation_error")
    assert_error(
        await client.get("/v1/search", headers=h, params={"q": "x", "time_from": "2025-01-01T00:00:00"}), 422, "validation_error"
    )
    assert_error(await client.get("/v1/search", headers=h, params={"q": "x", "k": 0}), 422, "validation_error")
    assert_error(await client.get("/v1/lessons", headers=h, params={"subject": "  "}), 422, "validation_error")
    # Values no event can carry are refused at the door, never passed on to a LanceDB
    # filter (a NUL used to surface as a 500 from the filter builder).
    for params in ({"session_id": "s\x00"}, {"agent_id": "not an id"}, {"entity": "Al\x00ice"}):
        err = assert_error(await client.get("/v1/search", headers=h, params={"q": "x", **params}), 422, "validation_error")
        assert next(iter(params)) in err["message"]
    assert_error(await client.get("/v1/lessons", headers=h, params={"subject": "AC\x00ME"}), 422, "validation_error")
    assert_error(await client.get("/v1/memories/m%00x", headers=h), 422, "validation_error")


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
_event_like = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["MemoryAdded", "MessageObserved", "DecisionRecorded", "MemoryLinked", "Nope"]),
        "schema_version": st.integers(-1, 3),
        "scope": st.one_of(_json, st.just({"team_id": "acme"}), st.just({"team_id": "globex"})),
        "memory_id": _json,
        "content": st.one_of(st.text(max_size=50), _json),
        "memory_type": st.one_of(st.sampled_from(["persona", "episode", "x"]), _json),
        "priority": _json,
        "occurred_at": st.one_of(st.just("2025-01-01T00:00:00Z"), st.just("2025-01-01"), _json),
        "metadata": _json,
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(["/v1/events", "/v1/memories", "/v1/messages", "/v1/decisions"]), body=st.one_of(_event_like, _json))
def test_fuzzed_bodies_never_crash_the_server(stack: Stack, path: str, body: Any) -> None:
    """Whatever JSON arrives, the answer is an accepted write or a client error in the
    one shape, never a 500."""
    resp = httpx.post(f"{stack.base_url}{path}", json=body, headers=stack.headers("acme"), timeout=30)
    assert resp.status_code in (202, 403, 422), resp.text
    if resp.status_code != 202:
        assert set(resp.json()["error"]) == {"code", "message", "details"}


def test_log_snapshot_lag_and_llm_counters() -> None:
    snap = metrics.LogSnapshot(
        end_offsets={("p.events", 0): 10, ("p.events", 1): 4, ("p.dead-letter", 0): 2, ("p.outcomes", 0): 7},
        positions={("p.events", 0): 7},
        projected_topics=frozenset({"p.events"}),
        dead_letter_topic="p.dead-letter",
    )
    assert snap.lag() == {("p.events", 0): 3, ("p.events", 1): 4}  # never-projected partitions lag fully
    assert snap.dead_letters() == 2

    purpose = f"test-{uuid.uuid4().hex[:6]}"
    metrics.record_llm_call(purpose, ok=True)
    metrics.record_llm_call(purpose, ok=False, reason="TimeoutError")
    text = metrics.render().decode()
    assert f'memstream_llm_calls_total{{purpose="{purpose}"}} 2.0' in text
    assert f'memstream_llm_failures_total{{purpose="{purpose}",reason="TimeoutError"}} 1.0' in text


def _prefer(word: str) -> Callable[[dict[str, Any]], Any]:
    """A scripted reranker: documents holding ``word`` first, then the rest."""
    from memstream.bench.openai_fake import Reply

    return lambda body: Reply(scores=[2.0 if word in d else 0.0 for d in body["documents"]])


async def test_rerank_true_lets_the_configured_reranker_order_the_results(stack: Stack, client: httpx.AsyncClient) -> None:
    assert stack.rerank is not None
    marker = uuid.uuid4().hex[:8]
    positions = []
    for word in ("first", "second"):
        resp = await client.post(
            "/v1/memories", headers=stack.headers("alice"),
            json={"content": f"the {word} note about rail passes {marker}"},
        )
        assert resp.status_code == 202, resp.text
        positions.append(resp.json()["position"])
    query = {"q": f"rail passes {marker}", "k": 2, "min_position": positions, "explain": True, "rerank": True}
    for word in ("first", "second"):
        stack.rerank.rerank.responder = _prefer(word)
        resp = await client.get("/v1/search", headers=stack.headers("alice"), params=query)
        assert resp.status_code == 200, resp.text
        top = resp.json()["results"][0]
        assert word in top["content"] and top["parts"]["rerank"] == 2.0
    asked = stack.rerank.rerank.requests[-1]
    assert asked["query"] == f"rail passes {marker}" and len(asked["documents"]) >= 2
    plain = await client.get("/v1/search", headers=stack.headers("alice"), params={**query, "rerank": False})
    assert plain.status_code == 200 and plain.json()["results"][0]["parts"]["rerank"] is None
    assert len(stack.rerank.rerank.requests) == 2  # rerank=false asks nobody


async def test_rerank_without_a_configured_reranker_is_refused(tmp_path: Path) -> None:
    from memstream.domain.events import Scope
    from memstream.interfaces.service import MemoryService, RerankUnavailable

    service = MemoryService(Settings(home=tmp_path, rerank_url=None))
    with pytest.raises(RerankUnavailable, match="MEMSTREAM_EMBEDDINGS_RERANK_URL"):
        await service.search(Scope(team_id="t", user_id="u"), "anything", 5, None, interface="api", rerank=True)
