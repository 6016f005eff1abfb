"""Ids that must appear in logs, as keyed hashes: never a personal field in plain.

Session ids, decision and outcome ids, subjects (team/user) and memory spaces are
personal (docs/security.md); a log line that needs to tell one from another shows
:func:`log_id` of it instead: HMAC-SHA256 under a key derived from the home's worker
key, so lines of one deployment correlate while nobody without the key can test a
guess. Without a worker key (an API node), a random per-process key is used."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading

from memstream.settings import get_settings
from memstream.streams.trust.worker_identity import worker_key

__all__ = ["log_id"]

_lock = threading.Lock()
_key: bytes | None = None


def _log_key() -> bytes:
    global _key
    with _lock:
        if _key is None:
            try:
                base = worker_key(get_settings().resolved_worker_key_file, create=False)
            except (OSError, ValueError):
                base = secrets.token_bytes(32)
            _key = hmac.new(base, b"memstream log ids", hashlib.sha256).digest()
        return _key


def log_id(value: object) -> str:
    """A short keyed hash of ``value`` (its ``str``) for log lines."""
    return "h:" + hmac.new(_log_key(), str(value).encode("utf-8"), hashlib.sha256).hexdigest()[:12]
