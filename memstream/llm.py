"""The LLM client: JSON answers from any OpenAI-compatible chat endpoint.

memstream asks models for JSON only (extraction, judgment, reflection). Endpoints
differ in how they can be made to answer JSON, so :class:`LLMClient` asks in the
strongest form the endpoint accepts and remembers what worked:

1. ``response_format={"type": "json_schema", ...}`` (structured output: OpenAI, vLLM,
   llama.cpp, recent Ollama),
2. ``response_format={"type": "json_object"}`` (JSON mode) if the endpoint refuses the
   schema with a 400/422,
3. no ``response_format`` at all if it refuses JSON mode too (the prompt still asks for
   JSON, and :mod:`memstream.domain.repair` reads what comes back).

Falling back a mode is not a retry. Failures that are worth a retry (timeout, connection
error, 429, 5xx, an empty answer, or an answer the caller cannot parse) are retried by
:func:`call_with_retry` ``settings.llm_max_retries`` times (default once); the openai
client's own retries are off so that the count is exactly that. Each call has a total
deadline of ``settings.llm_timeout_s``.

Every answer carries its latency and token usage, summed over attempts by
:func:`call_with_retry`, for the provenance of the events it produces.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from memstream.interfaces.metrics import record_llm_call
from memstream.settings import Settings

__all__ = [
    "OutputMode",
    "LLMError",
    "ChatResult",
    "LLMCall",
    "ChatModel",
    "LLMClient",
    "call_with_retry",
    "build_llm",
]

log = logging.getLogger(__name__)

OutputMode = Literal["json_schema", "json_object", "plain"]
_MODES: tuple[OutputMode, ...] = ("json_schema", "json_object", "plain")
T = TypeVar("T")

ErrorKind = Literal["timeout", "connection", "http", "empty", "parse", "refused"]


class LLMError(RuntimeError):
    """A chat call that produced no usable answer.

    ``kind`` says why (``timeout``, ``connection``, ``http``, ``empty``, ``parse``,
    ``refused`` for a 4xx that no retry can fix); ``attempts``, ``latency_ms`` and
    ``usage`` cover every attempt made, for the failure's record.
    """

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        status: int | None = None,
        attempts: int = 1,
        latency_ms: float = 0.0,
        usage: Mapping[str, int] | None = None,
        errors: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.attempts = attempts
        self.latency_ms = latency_ms
        self.usage = dict(usage or {})
        self.errors = errors or (f"{kind}: {message}",)

    @property
    def retryable(self) -> bool:
        return self.kind != "refused"


@dataclass(frozen=True)
class ChatResult:
    """One answer: its text, the model that wrote it, usage, latency and the output mode."""

    text: str
    model: str
    usage: Mapping[str, int] = field(default_factory=dict)
    latency_ms: float = 0.0
    mode: OutputMode = "json_schema"
    finish_reason: str | None = None


@dataclass(frozen=True)
class LLMCall(Generic[T]):
    """A parsed answer after retries: ``value`` from the caller's parser, the ``result``
    it came from, and totals over all ``attempts`` (``errors`` of the failed ones)."""

    value: T
    result: ChatResult
    attempts: int
    latency_ms: float
    usage: Mapping[str, int]
    errors: tuple[str, ...] = ()


@runtime_checkable
class ChatModel(Protocol):
    """What the extractor and the reflector need from a model (one attempt per call)."""

    model: str

    async def chat_json(
        self,
        system: str,
        user: str,
        *,
        schema: Mapping[str, Any] | None = None,
        schema_name: str = "answer",
    ) -> ChatResult:
        """Ask once; raise :class:`LLMError` on failure."""
        ...


def _usage(response: Any) -> dict[str, int]:
    usage = getattr(response, "usage", None)
    if usage is None:
        return {}
    out: dict[str, int] = {}
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = getattr(usage, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[name] = value
    return out


def _add_usage(total: dict[str, int], more: Mapping[str, int]) -> None:
    for key, value in more.items():
        total[key] = total.get(key, 0) + value


class LLMClient:
    """An OpenAI-compatible chat endpoint answering JSON (see the module docstring)."""

    def __init__(
        self,
        *,
        base_url: str | None,
        api_key: str | None,
        model: str,
        timeout_s: float = 60.0,
        max_retries: int = 1,
        client: AsyncOpenAI | None = None,
        output_mode: OutputMode = "json_schema",
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self._mode: OutputMode = output_mode
        self._client = client or AsyncOpenAI(
            base_url=base_url,
            # Local endpoints (vLLM, llama.cpp, Ollama) ignore the key, the client needs one.
            api_key=api_key or "not-needed",
            timeout=self.timeout_s,
            max_retries=0,
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> "LLMClient":
        key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
        return cls(
            base_url=settings.llm_base_url,
            api_key=key,
            model=settings.llm_model,
            timeout_s=settings.llm_timeout_s,
            max_retries=settings.llm_max_retries,
        )

    @property
    def output_mode(self) -> OutputMode:
        """The strongest JSON mode this endpoint accepted so far."""
        return self._mode

    async def close(self) -> None:
        await self._client.close()

    async def chat_json(
        self,
        system: str,
        user: str,
        *,
        schema: Mapping[str, Any] | None = None,
        schema_name: str = "answer",
    ) -> ChatResult:
        """One attempt (falling back output modes on a 400/422 only)."""
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ]
        start = time.perf_counter()
        mode = self._mode if schema is not None or self._mode != "json_schema" else "json_object"
        while True:
            kwargs: dict[str, Any] = {}
            if mode == "json_schema" and schema is not None:
                kwargs["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": schema_name, "schema": dict(schema), "strict": True},
                }
            elif mode in ("json_schema", "json_object"):
                kwargs["response_format"] = {"type": "json_object"}
            try:
                async with asyncio.timeout(self.timeout_s):
                    response = await self._client.chat.completions.create(
                        model=self.model, messages=messages, **kwargs
                    )
            except (openai.BadRequestError, openai.UnprocessableEntityError) as exc:
                next_index = _MODES.index(mode) + 1
                if next_index < len(_MODES) and "response_format" in kwargs:
                    log.info(
                        "LLM endpoint %s refused %s output (%s); falling back to %s",
                        self.base_url, mode, exc.status_code, _MODES[next_index],
                    )
                    mode = _MODES[next_index]
                    continue
                raise self._error("refused", exc, start, status=exc.status_code) from None
            except TimeoutError:
                raise LLMError(
                    "timeout",
                    f"no answer within {self.timeout_s:g} s",
                    latency_ms=(time.perf_counter() - start) * 1000,
                ) from None
            except openai.APITimeoutError as exc:
                raise self._error("timeout", exc, start) from None
            except openai.APIConnectionError as exc:
                raise self._error("connection", exc, start) from None
            except openai.APIStatusError as exc:
                kind: ErrorKind = "http" if exc.status_code in (408, 409, 429) or exc.status_code >= 500 else "refused"
                raise self._error(kind, exc, start, status=exc.status_code) from None
            except openai.OpenAIError as exc:
                raise self._error("http", exc, start) from None
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                # A 200 whose body is not a chat completion (garbage, truncated JSON).
                raise self._error("http", exc, start) from None
            break
        if mode != self._mode:
            self._mode = mode
        latency = (time.perf_counter() - start) * 1000
        usage = _usage(response)
        choices = getattr(response, "choices", None) or []
        if not choices:
            raise LLMError("empty", "the answer has no choices", latency_ms=latency, usage=usage)
        message = choices[0].message
        text = getattr(message, "content", None)
        if not isinstance(text, str) or not text.strip():
            refusal = getattr(message, "refusal", None)
            detail = f"the model refused: {refusal}" if refusal else "the answer is empty"
            raise LLMError("empty", detail, latency_ms=latency, usage=usage)
        return ChatResult(
            text=text,
            model=getattr(response, "model", None) or self.model,
            usage=usage,
            latency_ms=latency,
            mode=mode,
            finish_reason=getattr(choices[0], "finish_reason", None),
        )

    def _error(
        self, kind: ErrorKind, exc: Exception, start: float, *, status: int | None = None
    ) -> LLMError:
        message = " ".join(str(exc).split())[:300] or type(exc).__name__
        return LLMError(
            kind,
            f"{type(exc).__name__}: {message}",
            status=status,
            latency_ms=(time.perf_counter() - start) * 1000,
        )


async def call_with_retry(
    chat: ChatModel,
    system: str,
    user: str,
    *,
    parse: Callable[[str], T],
    schema: Mapping[str, Any] | None = None,
    schema_name: str = "answer",
    retries: int = 1,
) -> LLMCall[T]:
    """Ask, parse with ``parse`` (which raises ``ValueError`` for an unusable answer),
    and try again up to ``retries`` times on a retryable failure.

    Raises :class:`LLMError` with the totals of every attempt when none succeeded.
    """
    errors: list[str] = []
    usage: dict[str, int] = {}
    latency = 0.0
    last: LLMError | None = None
    for attempt in range(1, retries + 2):
        try:
            result = await chat.chat_json(system, user, schema=schema, schema_name=schema_name)
        except LLMError as exc:
            record_llm_call(schema_name, ok=False, reason=exc.kind)
            latency += exc.latency_ms
            _add_usage(usage, exc.usage)
            errors.append(f"{exc.kind}: {exc}")
            last = exc
            if not exc.retryable:
                break
            continue
        latency += result.latency_ms
        _add_usage(usage, result.usage)
        try:
            value = parse(result.text)
        except ValueError as exc:
            record_llm_call(schema_name, ok=False, reason="parse")
            reason = " ".join(str(exc).split())[:300]
            errors.append(f"parse: {reason}")
            last = LLMError("parse", reason, latency_ms=result.latency_ms, usage=result.usage)
            continue
        record_llm_call(schema_name, ok=True)
        return LLMCall(value, result, attempt, latency, usage, tuple(errors))
    assert last is not None
    raise LLMError(
        last.kind,
        str(last),
        status=last.status,
        attempts=len(errors),
        latency_ms=latency,
        usage=usage,
        errors=tuple(errors),
    )


def build_llm(settings: Settings) -> LLMClient | None:
    """The configured client, or ``None`` when no endpoint is set (``MEMSTREAM_LLM_BASE_URL``
    unset): the extractor then runs its documented heuristic instead."""
    if not settings.llm_base_url:
        return None
    return LLMClient.from_settings(settings)
