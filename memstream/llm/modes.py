"""What each LLM endpoint accepts: the output mode learned per endpoint and model.

:class:`memstream.llm.client.LLMClient` asks in the strongest JSON mode first and steps down
when the endpoint refuses it. The first success is the endpoint's mode; this module
keeps it, so that every later call (in this process and in the next ones) starts
there instead of paying the refusals again.

The memory is a small JSON file (``<home>/llm-modes.json``, one entry per
``endpoint|model``: the mode, the modes refused on the way down, when it was learned),
with a copy in memory in front of it. It is written only when something new is
learned, atomically (a temporary file renamed over the old one, other entries
re-read first, so two processes learning different endpoints both keep theirs).

An entry older than ``ttl_s`` is forgotten and the endpoint probed again from the
strongest mode: servers gain modes when they are upgraded (Ollama and llama.cpp both
added JSON-schema output after JSON mode), and a stale weaker mode would otherwise
stay forever. An unreadable file is treated as empty (it is a cache, not state).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["LearnedMode", "ModeMemory", "endpoint_key", "DEFAULT_OPENAI_URL"]

log = logging.getLogger(__name__)

DEFAULT_OPENAI_URL = "https://api.openai.com/v1"
"""Where the openai client goes without a base URL (the key of such an endpoint)."""


def endpoint_key(base_url: str | None, model: str) -> str:
    """``<base url without trailing slash>|<model>``."""
    return f"{(base_url or DEFAULT_OPENAI_URL).rstrip('/')}|{model}"


@dataclass(frozen=True)
class LearnedMode:
    """The mode an endpoint answered in, and the stronger modes it refused first."""

    mode: str
    refused: tuple[str, ...]
    learned_at: float

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "refused": list(self.refused), "learned_at": self.learned_at}


def _entry(value: Any, modes: Sequence[str]) -> LearnedMode | None:
    if not isinstance(value, dict) or value.get("mode") not in modes:
        return None
    learned_at = value.get("learned_at")
    if not isinstance(learned_at, (int, float)) or isinstance(learned_at, bool):
        return None
    refused = tuple(m for m in value.get("refused") or () if m in modes)
    return LearnedMode(str(value["mode"]), refused, float(learned_at))


class ModeMemory:
    """Learned modes, in memory and (with ``path``) in a JSON file; see the module
    docstring. ``modes`` are the valid mode names (anything else in the file is
    ignored)."""

    def __init__(
        self,
        path: Path | None,
        modes: Sequence[str],
        *,
        ttl_s: float = 7 * 86400.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.modes = tuple(modes)
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: dict[str, LearnedMode] | None = None
        self._lock = threading.Lock()

    def get(self, key: str) -> LearnedMode | None:
        """The learned mode of ``key``, or ``None`` (never learned, or expired)."""
        with self._lock:
            if self._entries is None:
                self._entries = self._read()
            entry = self._entries.get(key)
        if entry is None or self.clock() - entry.learned_at > self.ttl_s:
            return None
        return entry

    def learn(self, key: str, mode: str, refused: Sequence[str]) -> LearnedMode:
        """Keep ``mode`` for ``key`` (``refused``: the modes refused before it)."""
        entry = LearnedMode(mode, tuple(dict.fromkeys(refused)), self.clock())
        with self._lock:
            if self._entries is None:
                self._entries = self._read()
            self._entries[key] = entry
            if self.path is not None:
                merged = self._read()
                merged[key] = entry
                self._entries.update(merged)
                self._write(merged)
        return entry

    def _read(self) -> dict[str, LearnedMode]:
        if self.path is None:
            return {}
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring the learned LLM modes in %s: %s", self.path, exc)
            return {}
        if not isinstance(raw, dict):
            return {}
        out: dict[str, LearnedMode] = {}
        for key, value in raw.items():
            entry = _entry(value, self.modes)
            if entry is not None:
                out[str(key)] = entry
        return out

    def _write(self, entries: dict[str, LearnedMode]) -> None:
        assert self.path is not None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".llm-modes-", dir=self.path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump({k: v.as_dict() for k, v in sorted(entries.items())}, out, indent=1)
            os.replace(tmp, self.path)
        except OSError as exc:  # a cache that cannot be written costs a re-probe, no more
            log.warning("could not keep the learned LLM modes in %s: %s", self.path, exc)
