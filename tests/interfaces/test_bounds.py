"""Bounded resources at the HTTP boundary: hostile bodies get a 4xx (never a 500), and
a key over its rate limit gets 429 with Retry-After. Real uvicorn server and broker
(the shared stack), and the real app in process for the limiter."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from memstream.banks import create_key
from memstream.interfaces.api import create_api
from memstream.interfaces.ratelimit import RateLimiter
from memstream.settings.model import Settings
from tests.interfaces.iface_stack import Stack

DEEP = 100_000


@pytest.mark.kafka
@pytest.mark.parametrize("path", ["/v1/events", "/v1/memories", "/v1/messages", "/v1/decisions"])
@pytest.mark.parametrize(
    "body",
    [
        b"[" * DEEP + b"]" * DEEP,
        b'{"content": "x", "metadata": ' + b'{"a": ' * DEEP + b"1" + b"}" * DEEP + b"}",
        b'{"content": "x", "priority": ' + b"9" * 50_000 + b"}",
        b'{"content": "\xff\xfe bad utf-8"}',
        b'{"content": "lone \\ud800 surrogate", "type": "MemoryAdded", "memory_id": "m"}',
        b'{"content": "x", "priority": 1e999}',
    ],
    ids=["deep-array", "deep-object", "huge-int", "bad-utf8", "surrogate", "inf"],
)
def test_hostile_bodies_are_4xx_never_500(stack: Stack, path: str, body: bytes) -> None:
    resp = httpx.post(
        f"{stack.base_url}{path}", content=body, timeout=60,
        headers={**stack.headers("acme"), "content-type": "application/json"},
    )
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text[:300])
    assert set(resp.json()["error"]) == {"code", "message", "details"}


def test_token_bucket() -> None:
    now = [0.0]
    limiter = RateLimiter(2.0, 3, clock=lambda: now[0])
    assert [limiter.take("k") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("k") == pytest.approx(0.5)
    assert limiter.take("other") == 0.0  # per key
    now[0] += 0.5
    assert limiter.take("k") == 0.0
    assert RateLimiter.retry_after(0.2) == "1" and RateLimiter.retry_after(2.1) == "3"
    assert RateLimiter(0, 10).take("k") == 0.0  # off


async def test_a_key_over_its_rate_gets_429_with_retry_after(tmp_path: Path) -> None:
    (tmp_path / "banks.toml").write_text("[banks.a]\nteam_id = 'x'\ndescription = 'd'\n")
    settings = Settings(home=tmp_path, banks_file=tmp_path / "banks.toml", keys_file=tmp_path / "keys.toml",
                        api_rate_per_s=0.01, api_rate_burst=3)
    key, _ = create_key(settings, "a")
    other, _ = create_key(settings, "a")
    app = create_api(settings)  # no lifespan: authenticated requests reach a 503 "starting"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        codes = [(await client.get("/v1/search", params={"q": "x"}, headers={"X-API-Key": key})).status_code
                 for _ in range(3)]
        assert codes == [503, 503, 503]
        resp = await client.get("/v1/search", params={"q": "x"}, headers={"X-API-Key": key})
        assert resp.status_code == 429 and resp.json()["error"]["code"] == "too_many_requests"
        assert int(resp.headers["retry-after"]) >= 1
        mcp = await client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers={"X-API-Key": key})
        assert mcp.status_code == 429
        # another key has its own bucket
        assert (await client.get("/v1/search", params={"q": "x"}, headers={"X-API-Key": other})).status_code == 503
