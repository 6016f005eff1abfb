"""The chat model behind the ``openai`` client: JSON-schema calls with retries and
repair (``client``), the structured-output modes a server supports (``modes``) and
``memstream llm check`` (``check``)."""

from __future__ import annotations

from memstream.llm.client import (
    ChatModel,
    ChatResult,
    LLMCall,
    LLMClient,
    LLMError,
    MODES,
    OutputMode,
    UnusableAnswer,
    build_llm,
    call_with_retry,
    modes_path,
)

__all__ = [
    "ChatModel",
    "ChatResult",
    "LLMCall",
    "LLMClient",
    "LLMError",
    "MODES",
    "OutputMode",
    "UnusableAnswer",
    "build_llm",
    "call_with_retry",
    "modes_path",
]
