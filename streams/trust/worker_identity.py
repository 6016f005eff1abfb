"""The worker's producer identity on Kafka: what makes a system event believable.

Client events (turns, memories, client links, decisions, outcomes) may come from any
producer. System events (``memstream.domain.access.system_claim``: lessons, expiries,
judgment links, anything claiming the extractor, reflector or projector) come only
from the worker. Kafka's own producers are trusted services, but a plaintext broker
cannot say *which* service wrote a record, so the worker signs what it writes: every
record it produces carries the header ``memstream-worker`` holding an HMAC-SHA256 of
the record's value under the worker key. The projector dead-letters a system event
whose record lacks a valid signature, with the reason.

The key is 32 random bytes in ``MEMSTREAM_SECURITY_WORKER_KEY_FILE`` (default
``<home>/worker.key``, mode 0600), created by the first worker that needs it. Limits
(docs/security.md): whoever can read that file can sign; a signed record copied
verbatim is the same event (same id, same scope) and changes nothing; a rotated key
makes older system events fail verification on replay unless the old key is kept.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path

from memstream.domain.extraction.dedup import memory_id_key

__all__ = [
    "HEADER",
    "worker_key",
    "memory_ids_key",
    "signature",
    "signed_headers",
    "verifier",
    "Verifier",
    "key_record_signature",
    "key_record_signed",
]

HEADER = "memstream-worker"
_KEY_BYTES = 32

Verifier = Callable[[bytes | None, Sequence[tuple[str, bytes]] | None], bool]
"""``(value, headers) -> True`` when the record carries the worker's valid signature."""


def worker_key(path: Path, *, create: bool = True) -> bytes:
    """The worker key in ``path`` (``Settings.resolved_worker_key_file``), created (0600)
    when absent and ``create``; raises ``FileNotFoundError`` otherwise, ``ValueError``
    for a file that is not one."""
    if not path.exists() and create:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it first: read theirs
        else:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(_KEY_BYTES) + "\n")
    text = path.read_text(encoding="ascii").strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{path}: not a worker key (64 hex characters)") from None
    if len(key) != _KEY_BYTES:
        raise ValueError(f"{path}: not a worker key (64 hex characters)")
    return key


def memory_ids_key(worker_key_file: Path, *, create: bool = True) -> bytes | None:
    """The key of content-derived memory ids (derived from the worker key, never the
    key itself); None without ``create`` when this host holds no worker key (a client
    elsewhere: its memories then get random ids)."""
    try:
        return memory_id_key(worker_key(worker_key_file, create=create))
    except (FileNotFoundError, ValueError):
        return None


def signature(key: bytes, value: bytes) -> bytes:
    return hmac.new(key, value, hashlib.sha256).hexdigest().encode("ascii")


def signed_headers(key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """``headers`` with the worker's signature of ``value`` (any earlier one replaced)."""
    return [*(h for h in headers if h[0] != HEADER), (HEADER, signature(key, value))]


def key_record_signature(key: bytes, record_key: bytes | None, value: bytes | None) -> bytes:
    """The worker's signature of a key-topic record. It covers the record key too (a
    tombstone has no value) and is domain-separated from event signatures, so neither
    can be replayed as the other."""
    body = b"memstream.keys\x00" + len(record_key or b"").to_bytes(4, "big") + (record_key or b"")
    body += b"\x00" if value is None else b"\x01" + value
    return signature(key, body)


def key_record_signed(key: bytes, record_key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None) -> bool:
    """True when a key-topic record carries exactly one valid worker signature."""
    found = [v for k, v in headers or () if k == HEADER]
    return len(found) == 1 and found[0] is not None and hmac.compare_digest(found[0], key_record_signature(key, record_key, value))


def verifier(key: bytes) -> Verifier:
    """A check of records against ``key`` (constant-time comparison)."""

    def verify(value: bytes | None, headers: Sequence[tuple[str, bytes]] | None) -> bool:
        if value is None:
            return False
        found = [v for k, v in headers or () if k == HEADER]
        return len(found) == 1 and found[0] is not None and hmac.compare_digest(found[0], signature(key, value))

    return verify
