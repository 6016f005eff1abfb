"""The LLM client: JSON answers from any OpenAI-compatible chat endpoint.

memstream asks models for JSON only (extraction, judgment, reflection). Endpoints
differ in how they can be made to answer JSON, so :class:`LLMClient` asks in the
strongest form the endpoint accepts, strongest first:

1. ``json_schema``: ``response_format={"type": "json_schema", "json_schema": {...}}``
   (structured output: OpenAI, vLLM, llama.cpp's ``llama-server``, Ollama, LM Studio);
2. ``json_object_schema``: ``response_format={"type": "json_object", "schema": {...}}``,
   the form llama.cpp servers read as a grammar (llama-cpp-python's server accepts
   only this one: it answers ``json_schema`` with a 500). Grammar-constrained decoding
   is the strongest guarantee a small local model can get;
3. ``json_object``: ``response_format={"type": "json_object"}`` (JSON mode);
4. ``plain``: no ``response_format`` (the prompt still asks for JSON, and
   :mod:`memstream.domain.repair` reads what comes back).

A *refusal* of a mode steps down to the next one within the same call; it is not a
retry and not an outage. A refusal is any 4xx answer to a request that carried a
``response_format`` (except 408, 409 and 429, which say "later", not "never"), and a
5xx whose body names the ``response_format`` (or one of its types): some servers
validate the request body in a handler that turns a validation error into a 500.
A 4xx in ``plain`` mode is an error no retry can fix (``refused``).

The first mode an endpoint answers in is *learned* per endpoint and model, and kept by
:class:`memstream.llm.modes.ModeMemory` (in memory, and in ``<home>/llm-modes.json``
when built from settings): later calls, in this process and the next ones, start
there. A refusal about the format itself (a 400/422, or a body naming the format) is
learned at once, before the next mode has answered: a slow local model's answer may
never come within its deadline, and the refusal would otherwise be paid again on every
call. Only calls that carried a schema teach anything (without one, the two schema
modes send plain JSON mode and say nothing about the schema forms).

Failures that are worth a retry (timeout, connection error, 429, 5xx, an empty answer,
or an answer the caller cannot parse) are retried by :func:`call_with_retry`
``settings.extraction.llm_max_retries`` times (default once); the openai client's own retries are
off so that the count is exactly that. A caller's parser that raises
:class:`UnusableAnswer` (an answer that parsed and says nothing usable, which asking
again will not change) ends the call at once with a non-retryable ``unusable``
:class:`LLMError`. Each call has a total deadline of ``settings.extraction.llm_timeout_s``.

Every answer carries its latency and token usage, summed over attempts by
:func:`call_with_retry`, for the provenance of the events it produces.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

from memstream.domain.repair import UnusableAnswer
from memstream.metrics import record_llm_call
from memstream.llm.modes import ModeMemory, endpoint_key
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
    "UnusableAnswer",
    "MODES",
    "modes_path",
]

log = logging.getLogger(__name__)

MODE_TTL_S = 7 * 86400.0
"""How long an endpoint's learned output mode is kept before it is probed again."""

OutputMode = Literal["json_schema", "json_object_schema", "json_object", "plain"]
MODES: tuple[OutputMode, ...] = ("json_schema", "json_object_schema", "json_object", "plain")
"""Strongest first (see the module docstring)."""
T = TypeVar("T")

ErrorKind = Literal["timeout", "connection", "http", "empty", "parse", "refused", "unusable"]

_LATER_STATUSES = (408, 409, 429)
"""4xx answers that say "try later", not "never": retryable, never a mode refusal."""


class LLMError(RuntimeError):
    """A chat call that produced no usable answer.

    ``kind`` says why (``timeout``, ``connection``, ``http``, ``empty``, ``parse``,
    ``refused`` for a 4xx that no retry can fix, ``unusable`` for an answer the caller
    read and found nothing usable in, see :class:`UnusableAnswer`); ``attempts``,
    ``latency_ms`` and ``usage`` cover every attempt made, for the failure's record.
    ``retryable`` is false for ``refused`` and ``unusable``: asking again will get the
    same answer, so a caller should fall back instead.
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
        return self.kind not in ("refused", "unusable")


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


def modes_path(settings: Settings) -> Path:
    """Where the learned output modes are kept: ``<home>/llm-modes.json``."""
    return settings.home / "llm-modes.json"


def _response_format(
    mode: OutputMode, schema: Mapping[str, Any] | None, schema_name: str
) -> dict[str, Any] | None:
    """The ``response_format`` a request in ``mode`` carries (``None``: none)."""
    if mode == "plain":
        return None
    if schema is None or mode == "json_object":
        return {"type": "json_object"}
    if mode == "json_schema":
        return {
            "type": "json_schema",
            "json_schema": {"name": schema_name, "schema": dict(schema), "strict": True},
        }
    return {"type": "json_object", "schema": dict(schema)}


def _error_text(exc: openai.APIStatusError) -> str:
    parts = [str(exc)]
    try:
        parts.append(exc.response.text)
    except Exception:  # noqa: BLE001 - a body that cannot be read names nothing
        pass
    return " ".join(parts).lower()


def _names_the_format(exc: openai.APIStatusError, response_format: Mapping[str, Any]) -> bool:
    """A refusal that is about the format itself (a 400/422, or an error body naming
    the format): learned at once. Other 4xx (a bad key, an unknown model) step down
    within the call but teach nothing until a mode answers."""
    if exc.status_code in (400, 422):
        return True
    text = _error_text(exc)
    return "response_format" in text or str(response_format.get("type", "")).lower() in text


def refuses_format(exc: openai.APIStatusError, response_format: Mapping[str, Any]) -> bool:
    """Whether an error answer to a request carrying ``response_format`` refuses that
    format (see the module docstring) rather than reporting an outage."""
    status = exc.status_code
    if 400 <= status < 500:
        return status not in _LATER_STATUSES
    if status < 500:
        return False
    text = _error_text(exc)
    return "response_format" in text or str(response_format.get("type", "")).lower() in text


class LLMClient:
    """An OpenAI-compatible chat endpoint answering JSON (see the module docstring).

    ``output_mode`` is the mode to start from when nothing is learned yet;
    ``memory`` keeps what is learned (default: in this client only)."""

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
        memory: ModeMemory | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._initial: OutputMode = output_mode
        self._memory = memory or ModeMemory(None, MODES)
        self._key = endpoint_key(base_url, model)
        self._client = client or AsyncOpenAI(
            base_url=base_url,
            # Local endpoints (vLLM, llama.cpp, Ollama) ignore the key, the client needs one.
            api_key=api_key or "not-needed",
            timeout=self.timeout_s,
            max_retries=0,
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> "LLMClient":
        key = settings.extraction.llm_api_key.get_secret_value() if settings.extraction.llm_api_key else None
        return cls(
            base_url=settings.extraction.llm_base_url,
            api_key=key,
            model=settings.extraction.llm_model,
            timeout_s=settings.extraction.llm_timeout_s,
            max_retries=settings.extraction.llm_max_retries,
            memory=ModeMemory(modes_path(settings), MODES, ttl_s=MODE_TTL_S),
            max_tokens=settings.extraction.llm_max_tokens,
            temperature=settings.extraction.llm_temperature,
        )

    @property
    def output_mode(self) -> OutputMode:
        """The mode the next call with a schema starts from: the one learned for this
        endpoint and model, else the initial one."""
        learned = self._memory.get(self._key)
        return learned.mode if learned is not None else self._initial  # type: ignore[return-value]

    @property
    def refused_modes(self) -> tuple[str, ...]:
        """The stronger modes this endpoint refused before the learned one."""
        learned = self._memory.get(self._key)
        return learned.refused if learned is not None else ()

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
        """One attempt, stepping down output modes on a refusal only."""
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ]
        start = time.perf_counter()
        mode = self.output_mode
        if schema is None and MODES.index(mode) < MODES.index("json_object"):
            mode = "json_object"  # the schema modes have nothing to send without a schema
        refused: list[OutputMode] = []
        extra: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature}
        extra = {k: v for k, v in extra.items() if v is not None}
        while True:
            response_format = _response_format(mode, schema, schema_name)
            kwargs = dict(extra) if response_format is None else {**extra, "response_format": response_format}
            try:
                async with asyncio.timeout(self.timeout_s):
                    response = await self._client.chat.completions.create(
                        model=self.model, messages=messages, **kwargs
                    )
            except openai.APIStatusError as exc:
                if response_format is not None and mode != "plain" and refuses_format(exc, response_format):
                    refused.append(mode)
                    mode = MODES[MODES.index(mode) + 1]
                    log.info(
                        "LLM endpoint %s refused %s output (%s); trying %s",
                        self.base_url, refused[-1], exc.status_code, mode,
                    )
                    if schema is not None and _names_the_format(exc, response_format):
                        # kept at once: a slow model's next answer may never come in time
                        self._memory.learn(self._key, mode, self.refused_modes + tuple(refused))
                    continue
                retry_later = exc.status_code in _LATER_STATUSES or exc.status_code >= 500
                kind: ErrorKind = "http" if retry_later else "refused"
                raise self._error(kind, exc, start, status=exc.status_code) from None
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
            except openai.OpenAIError as exc:
                raise self._error("http", exc, start) from None
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                # A 200 whose body is not a chat completion (garbage, truncated JSON).
                raise self._error("http", exc, start) from None
            break
        if refused and schema is not None:
            self._memory.learn(self._key, mode, self.refused_modes + tuple(refused))
        elif schema is not None and self._memory.get(self._key) is None:
            self._memory.learn(self._key, mode, ())
        return _answer(response, self.model, mode, (time.perf_counter() - start) * 1000)

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
    """Ask, parse with ``parse`` (which raises ``ValueError`` for an answer it cannot
    read, :class:`UnusableAnswer` for one it read and found nothing usable in), and try
    again up to ``retries`` times on a retryable failure.

    Raises :class:`LLMError` with the totals of every attempt when none succeeded.
    """
    errors: list[str] = []
    usage: dict[str, int] = {}
    latency = 0.0

    async def once() -> LLMCall[T]:
        nonlocal latency
        try:
            result = await chat.chat_json(system, user, schema=schema, schema_name=schema_name)
        except LLMError as exc:
            record_llm_call(schema_name, ok=False, reason=exc.kind)
            latency += exc.latency_ms
            _add_usage(usage, exc.usage)
            errors.append(f"{exc.kind}: {exc}")
            raise
        latency += result.latency_ms
        _add_usage(usage, result.usage)
        try:
            value = parse(result.text)
        except ValueError as exc:
            kind: ErrorKind = "unusable" if isinstance(exc, UnusableAnswer) else "parse"
            record_llm_call(schema_name, ok=False, reason=kind)
            reason = " ".join(str(exc).split())[:300]
            errors.append(f"{kind}: {reason}")
            raise LLMError(kind, reason, latency_ms=result.latency_ms, usage=result.usage) from None
        record_llm_call(schema_name, ok=True)
        return LLMCall(value, result, len(errors) + 1, latency, usage, tuple(errors))

    try:
        return await AsyncRetrying(
            stop=stop_after_attempt(retries + 1),
            retry=retry_if_exception(lambda exc: isinstance(exc, LLMError) and exc.retryable),
            reraise=True,
        )(once)
    except LLMError as last:
        raise LLMError(
            last.kind,
            str(last),
            status=last.status,
            attempts=len(errors),
            latency_ms=latency,
            usage=usage,
            errors=tuple(errors),
        ) from None


def build_llm(settings: Settings) -> LLMClient | None:
    """The configured client, or ``None`` when no endpoint is set (``MEMSTREAM_EXTRACTION_LLM_BASE_URL``
    unset): the extractor then runs its documented heuristic instead."""
    if not settings.extraction.llm_base_url:
        return None
    return LLMClient.from_settings(settings)


def _answer(response: Any, default_model: str, mode: OutputMode, latency: float) -> ChatResult:
    """The text of a chat completion, or :class:`LLMError` (``empty``) when it has none."""
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
        model=getattr(response, "model", None) or default_model,
        usage=usage,
        latency_ms=latency,
        mode=mode,
        finish_reason=getattr(choices[0], "finish_reason", None),
    )
