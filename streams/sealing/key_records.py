"""Who may change a keyring: key tombstones and ``SubjectForgotten`` orders take effect
only when the worker (or the operator's ``memstream forget``, which holds the worker
key) signed them, or when they sit in the unsigned past the operator trusts
(``memstream trust-legacy``). A key record is believed when signed so, or, unsigned,
when it unwraps under the master key (AES-GCM bound to its record key: only a holder
of the master key can write one); only signed ones say "keys exist" at start. Anything else is ignored, logged and counted
(``memstream_forged_records_total``): it never drops a key and never stops a start.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from memstream.codec.wire import HEADER_TYPE
from memstream.metrics import record_forged
from memstream.sealing import Subject, is_sealed
from memstream.streams.trust.worker_identity import key_record_signed, verifier

__all__ = ["forgotten_keys", "forget_order", "key_record_signed_or_trusted", "refuse_key_record"]

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, bytes | None]]

_FORGOTTEN_TYPE = b"SubjectForgotten"


def forgotten_keys(value: bytes) -> tuple[Subject, list[bytes]] | None:
    """The subject and key ids a ``SubjectForgotten`` body names (None if unreadable)."""
    try:
        body = json.loads(value)
        scope = body["scope"]
        return Subject(scope["team_id"], scope.get("user_id", "default")), [bytes.fromhex(k) for k in body.get("key_ids", ())]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def forget_order(value: bytes | None, headers: Headers | None, worker_key: bytes | None) -> tuple[Subject, list[bytes]] | None:
    """The keys a record orders dropped: only a plaintext ``SubjectForgotten`` the
    worker signed orders anything; an unsigned one is logged, counted and ignored
    (the decoder dead-letters it)."""
    if value is None or is_sealed(value):
        return None
    if not any(k == HEADER_TYPE and v == _FORGOTTEN_TYPE for k, v in headers or ()):
        return None
    if worker_key is None or not verifier(worker_key)(value, headers):  # type: ignore[arg-type]
        log.warning("a SubjectForgotten without the worker's signature was ignored (forged)")
        record_forged("events", "forget")
        return None
    return forgotten_keys(value)


def key_record_signed_or_trusted(
    worker_key: bytes | None, key: bytes | None, value: bytes | None, headers: Headers | None, *, trusted: bool
) -> bool:
    """True when a key-topic record carries the worker's signature, or is ``trusted``
    (its offset in the legacy past)."""
    return trusted or (worker_key is not None and key_record_signed(worker_key, key, value, headers))


def refuse_key_record(key: bytes | None, value: bytes | None, why: str) -> None:
    """Log and count a key-topic record that takes no effect."""
    kind = "tombstone" if value is None else "key"
    log.warning("a %s on the key topic was ignored (forged: %s): key %r", kind, why, (key or b"")[:80])
    record_forged("keys", kind)
