"""Does a model server really answer? One real chat completion, and the server's fate.

A model server that accepts connections and lists its models may still crash on the
first completion (a llama.cpp build compiled for another CPU does exactly that), so
"the port answers" proves nothing. :func:`check_chat` asks for one short plain chat
completion and insists on non-empty content; ``.ci/run`` runs it
(``python -m memstream.llm.check URL MODEL``) before any test uses the server, and the
``real_llm`` tier runs it once per session.

:func:`server_fate` reads what became of a server process the caller watches: alive,
or dead with its exit status (written by ``.ci/run``'s launcher to a file), named as a
signal when a signal killed it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import openai

__all__ = ["ChatCheck", "ServerDown", "check_chat", "server_fate", "describe_status"]

CHECK_PROMPT = "Say hello in one short sentence."


class ServerDown(RuntimeError):
    """The model server gave no content to one plain chat completion."""


@dataclass(frozen=True)
class ChatCheck:
    content: str
    seconds: float


def check_chat(base_url: str, model: str, *, timeout_s: float = 120.0, max_tokens: int = 32) -> ChatCheck:
    """One plain chat completion against ``base_url``; raises :class:`ServerDown`
    unless it comes back with non-empty content within ``timeout_s``."""
    client = openai.OpenAI(base_url=base_url, api_key="not-needed", timeout=timeout_s, max_retries=0)
    start = time.monotonic()
    try:
        response = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": CHECK_PROMPT}],
            max_tokens=max_tokens,
        )
        content = (response.choices[0].message.content or "").strip() if response.choices else ""
    except (openai.OpenAIError, ValueError, TypeError, AttributeError) as exc:
        raise ServerDown(f"no chat completion from {base_url} ({model}): {type(exc).__name__}: {exc}") from None
    finally:
        client.close()
    if not content:
        raise ServerDown(f"the chat completion from {base_url} ({model}) came back with no content")
    return ChatCheck(content, time.monotonic() - start)


def describe_status(status: int) -> str:
    """A shell exit status in words: ``killed by SIGSEGV (exit 139)``, ``exit 1``."""
    if status > 128 and status - 128 in {s.value for s in signal.Signals}:
        return f"killed by {signal.Signals(status - 128).name} (exit {status})"
    if status < 0 and -status in {s.value for s in signal.Signals}:
        return f"killed by {signal.Signals(-status).name}"
    return f"exit {status}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead, whatever kill(0) says
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def server_fate(pid: int, exit_file: Path | None, *, settle_s: float = 2.0, die_within_s: float = 0.0) -> str | None:
    """``None`` while process ``pid`` lives (waited for up to ``die_within_s``: a server
    that crashed mid-answer drops the connection a moment before it is reaped); else
    how it ended, from ``exit_file`` (its exit status, written by the launcher; waited
    for up to ``settle_s``)."""
    dying = time.monotonic() + die_within_s
    while _alive(pid):
        if time.monotonic() >= dying:
            return None
        time.sleep(0.1)
    deadline = time.monotonic() + settle_s
    while exit_file is not None:
        try:
            text = exit_file.read_text().strip()
        except OSError:
            text = ""
        if text:
            return describe_status(int(text))
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return "exited (status unknown)"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m memstream.llm.check BASE_URL MODEL", file=sys.stderr)
        return 2
    try:
        checked = check_chat(argv[0], argv[1])
    except ServerDown as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"the model answered in {checked.seconds:.1f} s: {checked.content[:120]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
