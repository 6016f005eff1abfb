"""The LLM client against endpoints as they really are: which output modes they refuse
and how (a 4xx, or llama-cpp-python's 500), what the client learns and keeps, and the
non-retryable "unusable answer" (through the real openai client and the fake server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memstream.domain.repair import UnusableAnswer
from memstream.llm.client import MODES, LLMClient, LLMError, call_with_retry
from memstream.llm.modes import ModeMemory, endpoint_key
from memstream.settings.model import Settings
from tests.fakes.openai_server import FakeOpenAI, Reply, fake_llm  # noqa: F401 - the fixture

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def client(fake: FakeOpenAI, memory: ModeMemory | None = None, **kwargs: Any) -> LLMClient:
    return LLMClient(base_url=fake.base_url, api_key=None, model="m", timeout_s=2.0, memory=memory, **kwargs)


def formats(fake: FakeOpenAI) -> list[str]:
    """Each request's mode as the server saw it."""
    out = []
    for body in fake.chat.requests:
        fmt = body.get("response_format")
        if fmt is None:
            out.append("plain")
        elif fmt["type"] == "json_object" and "schema" in fmt:
            out.append("json_object_schema")
        else:
            out.append(fmt["type"])
    return out


async def test_llama_cpp_pythons_500_for_json_schema_is_a_refusal_and_schema_in_json_object_is_used(
    fake_llm: FakeOpenAI,  # noqa: F811
) -> None:
    fake_llm.reject_json_schema = True
    fake_llm.format_refusal_status = 500
    fake_llm.chat.push_json({"a": 1})
    fake_llm.chat.push_json({"a": 2})
    llm = client(fake_llm)
    try:
        first = await llm.chat_json("s", "u", schema=SCHEMA)
        second = await llm.chat_json("s", "u", schema=SCHEMA)
    finally:
        await llm.close()
    assert json.loads(first.text) == {"a": 1} and json.loads(second.text) == {"a": 2}
    assert first.mode == second.mode == "json_object_schema" == llm.output_mode
    assert llm.refused_modes == ("json_schema",)
    # refused once; the grammar form carries the schema itself; learned for the next call
    assert formats(fake_llm) == ["json_schema", "json_object_schema", "json_object_schema"]
    assert fake_llm.chat.requests[1]["response_format"]["schema"] == SCHEMA


async def test_a_refusal_naming_the_format_is_learned_before_the_next_mode_answers(
    fake_llm: FakeOpenAI,  # noqa: F811
) -> None:
    def slow_model(body: dict[str, Any]) -> Reply:
        if body["response_format"]["type"] == "json_schema":
            return Reply(status=500, error_message="response_format: Input should be 'text' or 'json_object'")
        return Reply(delay=3.0)  # the slow model's answer never comes in time

    fake_llm.chat.responder = slow_model
    llm = client(fake_llm)
    try:
        with pytest.raises(LLMError) as raised:
            await llm.chat_json("s", "u", schema=SCHEMA)
    finally:
        await llm.close()
    assert raised.value.kind == "timeout"
    assert llm.output_mode == "json_object_schema" and llm.refused_modes == ("json_schema",)


async def test_a_500_that_does_not_name_the_format_is_an_outage_not_a_refusal(
    fake_llm: FakeOpenAI,  # noqa: F811
) -> None:
    fake_llm.chat.push(Reply(status=500, error_message="CUDA out of memory"))
    llm = client(fake_llm)
    try:
        with pytest.raises(LLMError) as raised:
            await llm.chat_json("s", "u", schema=SCHEMA)
    finally:
        await llm.close()
    assert raised.value.kind == "http" and raised.value.retryable
    assert formats(fake_llm) == ["json_schema"]
    assert llm.output_mode == "json_schema" and llm.refused_modes == ()


@pytest.mark.parametrize(
    ("refuse", "status", "settled"),
    [
        ({"reject_json_schema"}, 400, "json_object_schema"),
        ({"reject_json_schema"}, 422, "json_object_schema"),
        ({"reject_json_schema", "reject_json_object_schema"}, 400, "json_object"),
        ({"reject_json_schema", "reject_json_object_schema"}, 404, "json_object"),
        ({"reject_json_schema", "reject_json_object_schema", "reject_json_object"}, 400, "plain"),
        ({"reject_json_object_schema", "reject_json_object"}, 400, "json_schema"),  # LM Studio's profile
    ],
)
async def test_each_refusal_steps_down_one_mode_and_the_first_success_is_learned(
    fake_llm: FakeOpenAI, refuse: set[str], status: int, settled: str  # noqa: F811
) -> None:
    for name in refuse:
        setattr(fake_llm, name, True)
    fake_llm.format_refusal_status = status
    fake_llm.chat.push(Reply(content='Here: {"a": 1}'), Reply(content='{"a": 2}'))
    llm = client(fake_llm)
    try:
        result = await llm.chat_json("s", "u", schema=SCHEMA)
        again = await llm.chat_json("s", "u", schema=SCHEMA)
    finally:
        await llm.close()
    steps = list(MODES[: MODES.index(settled) + 1])  # type: ignore[arg-type]
    assert formats(fake_llm) == [*steps, settled]
    assert result.mode == again.mode == settled == llm.output_mode


@pytest.mark.parametrize("status", [429, 408])
async def test_a_try_later_status_is_retryable_and_no_refusal(fake_llm: FakeOpenAI, status: int) -> None:  # noqa: F811
    fake_llm.chat.push(Reply(status=status))
    llm = client(fake_llm)
    try:
        with pytest.raises(LLMError) as raised:
            await llm.chat_json("s", "u", schema=SCHEMA)
    finally:
        await llm.close()
    assert raised.value.retryable and formats(fake_llm) == ["json_schema"]


async def test_a_4xx_in_every_mode_is_a_refusal_and_nothing_is_learned(fake_llm: FakeOpenAI) -> None:  # noqa: F811
    fake_llm.chat.responder = lambda body: Reply(status=401, error_message="bad key")
    llm = client(fake_llm)
    try:
        with pytest.raises(LLMError) as raised:
            await llm.chat_json("s", "u", schema=SCHEMA)
    finally:
        await llm.close()
    assert raised.value.kind == "refused" and not raised.value.retryable
    assert formats(fake_llm) == list(MODES)
    assert llm.output_mode == "json_schema"  # a bad key teaches nothing about modes


async def test_a_call_without_a_schema_teaches_nothing(fake_llm: FakeOpenAI) -> None:  # noqa: F811
    fake_llm.reject_json_object = True
    fake_llm.chat.push(Reply(content='{"a": 1}'))
    llm = client(fake_llm)
    try:
        result = await llm.chat_json("s", "u")
    finally:
        await llm.close()
    assert result.mode == "plain" and formats(fake_llm) == ["json_object", "plain"]
    assert llm.output_mode == "json_schema"


async def test_the_learned_mode_is_kept_across_clients_and_processes(fake_llm: FakeOpenAI, tmp_path: Path) -> None:  # noqa: F811
    settings = Settings(home=tmp_path, llm_base_url=fake_llm.base_url + "/", llm_model="small", llm_timeout_s=2.0)
    fake_llm.reject_json_schema = True
    fake_llm.chat.push_json({"a": 1})
    fake_llm.chat.push_json({"a": 2})
    first = LLMClient.from_settings(settings)
    await first.chat_json("s", "u", schema=SCHEMA)
    await first.close()
    kept = json.loads((tmp_path / "llm-modes.json").read_text())
    key = endpoint_key(fake_llm.base_url, "small")
    assert kept[key]["mode"] == "json_object_schema" and kept[key]["refused"] == ["json_schema"]
    second = LLMClient.from_settings(settings)  # a new process reads the file
    await second.chat_json("s", "u", schema=SCHEMA)
    await second.close()
    assert formats(fake_llm) == ["json_schema", "json_object_schema", "json_object_schema"]
    # another model on the same endpoint learns for itself
    other = LLMClient.from_settings(settings.model_copy(update={"llm_model": "big"}))
    assert other.output_mode == "json_schema"
    await other.close()


def test_a_learned_mode_expires_and_a_broken_file_is_an_empty_memory(tmp_path: Path) -> None:
    now = [1000.0]
    path = tmp_path / "llm-modes.json"
    memory = ModeMemory(path, MODES, ttl_s=60.0, clock=lambda: now[0])
    memory.learn("k", "json_object", ["json_schema", "json_object_schema"])
    assert ModeMemory(path, MODES, ttl_s=60.0, clock=lambda: now[0]).get("k").mode == "json_object"  # type: ignore[union-attr]
    now[0] += 61
    assert ModeMemory(path, MODES, ttl_s=60.0, clock=lambda: now[0]).get("k") is None
    path.write_text("{not json")
    assert ModeMemory(path, MODES).get("k") is None
    path.write_text(json.dumps({"k": {"mode": "telepathy", "learned_at": now[0]}}))
    assert ModeMemory(path, MODES).get("k") is None


async def test_an_unusable_answer_is_not_retried(fake_llm: FakeOpenAI) -> None:  # noqa: F811
    fake_llm.chat.push_json({"a": 1})
    fake_llm.chat.push_json({"a": 1})
    llm = client(fake_llm)

    def parse(text: str) -> Any:
        raise UnusableAnswer("nothing usable in " + text)

    try:
        with pytest.raises(LLMError) as raised:
            await call_with_retry(llm, "s", "u", parse=parse, schema=SCHEMA, retries=3)
    finally:
        await llm.close()
    assert raised.value.kind == "unusable" and not raised.value.retryable
    assert raised.value.attempts == 1 and fake_llm.chat.count == 1


async def test_retryable_failures_are_asked_again_and_every_attempt_is_counted(fake_llm: FakeOpenAI) -> None:  # noqa: F811
    fake_llm.chat.push_error(503)
    fake_llm.chat.push_text("not json at all")
    fake_llm.chat.push_json({"a": 7})
    llm = client(fake_llm)
    try:
        call = await call_with_retry(llm, "s", "u", parse=json.loads, schema=SCHEMA, retries=2)
        fake_llm.chat.push_text("still not json")
        fake_llm.chat.push_text("nor this")
        with pytest.raises(LLMError) as raised:
            await call_with_retry(llm, "s", "u", parse=json.loads, schema=SCHEMA, retries=1)
    finally:
        await llm.close()
    assert call.value == {"a": 7} and call.attempts == 3
    assert [e.split(":")[0] for e in call.errors] == ["http", "parse"]
    assert call.latency_ms >= call.result.latency_ms > 0
    # the retries spent: the last failure, with the totals of both attempts
    assert raised.value.kind == "parse" and raised.value.attempts == 2
    assert len(raised.value.errors) == 2 and fake_llm.chat.count == 5
