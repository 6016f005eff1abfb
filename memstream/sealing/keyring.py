"""The data keys one node knows: built from the records of the compacted key topic.

A record's key is ``["team", "user", "<kid hex>"]`` (JSON, so ids holding ``/`` stay
unambiguous) and its value the data key wrapped by the master key. A subject may hold
several keys (two nodes that created one at once both keep theirs, and events sealed
under either stay readable); new events are sealed under the lowest key id, so every
node converges on the same one. Forgetting tombstones every key of the subject.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from typing import Any, NamedTuple

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from memstream.sealing.master import KeyWrapper, MasterKeyError

__all__ = ["Subject", "DataKey", "Keyring", "KeyRecordError", "key_record_key", "ROLL_KEY", "KID_BYTES"]

KID_BYTES = 16
DATA_KEY_BYTES = 32
ROLL_KEY = b'["roll"]'
"""Key of the keep-alive record the worker appends so the broker rolls the segment
holding a tombstone (only rolled segments are compacted); the keyring ignores it."""


class KeyRecordError(ValueError):
    """A record of the key topic that is not a key record."""


class Subject(NamedTuple):
    """A data subject: one memory space (a tuple: made and hashed once per event)."""

    team_id: str
    user_id: str

    def __str__(self) -> str:
        return f"team {self.team_id!r} user {self.user_id!r}"


class DataKey:
    """One subject's data key: the AEAD that seals its events and a keyed hash."""

    __slots__ = ("kid", "subject", "aead", "_mac")

    def __init__(self, kid: bytes, subject: Subject, secret: bytes) -> None:
        self.kid = kid
        self.subject = subject
        self.aead = AESGCM(secret)
        self._mac = hmac.new(secret, b"memstream keyed hash", hashlib.sha256).digest()

    def keyed_hash(self, text: str) -> str:
        """HMAC-SHA256 of ``text`` under a key derived from the data key: a hash that
        nobody can recompute for a guessed text once the key is gone."""
        return hmac.new(self._mac, text.encode("utf-8"), hashlib.sha256).hexdigest()


def key_record_key(subject: Subject, kid: bytes) -> bytes:
    return json.dumps([subject.team_id, subject.user_id, kid.hex()], separators=(",", ":")).encode("utf-8")


def _parse_record_key(key: bytes | None) -> tuple[Subject, bytes] | None:
    """``(subject, kid)``, or None for the roll record; raises for anything else."""
    if key == ROLL_KEY:
        return None
    try:
        team, user, kid_hex = json.loads(key or b"")
        kid = bytes.fromhex(kid_hex)
    except (ValueError, TypeError):
        raise KeyRecordError(f"not a key record key: {key!r:.80}") from None
    if not isinstance(team, str) or not isinstance(user, str) or len(kid) != KID_BYTES:
        raise KeyRecordError(f"not a key record key: {key!r:.80}")
    return Subject(team, user), kid


class Keyring:
    """Data keys by key id and by subject, following the key topic's records."""

    def __init__(self, wrapper: KeyWrapper) -> None:
        self._wrapper = wrapper
        self._by_kid: dict[bytes, DataKey] = {}
        self._by_subject: dict[Subject, dict[bytes, DataKey]] = {}
        self._current: dict[Subject, DataKey] = {}
        self._forgotten: set[bytes] = set()
        self._forgotten_subjects: set[Subject] = set()

    def __len__(self) -> int:
        return len(self._by_kid)

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """Take in one record of the key topic: a key, or a tombstone that drops one.
        Raises :class:`MasterKeyError` for a key this node's master key did not wrap."""
        parsed = _parse_record_key(key)
        if parsed is None:
            return
        subject, kid = parsed
        if value is None:
            self._drop(subject, kid)
            return
        if kid in self._forgotten:  # a copy of a key record written again after its tombstone
            return
        self._add(DataKey(kid, subject, self._unwrap(key or b"", value)))

    def _unwrap(self, key: bytes, value: bytes) -> bytes:
        try:
            record: dict[str, Any] = json.loads(value)
            wrapped = base64.b64decode(record["wrapped"], validate=True)
            wrapped_by = str(record["wrapped_by"])
        except (ValueError, KeyError, TypeError):
            raise KeyRecordError(f"not a key record value for {key!r:.80}") from None
        if wrapped_by != self._wrapper.key_id:
            raise MasterKeyError(
                f"the stored data keys were wrapped by master key {wrapped_by}, this node holds "
                f"{self._wrapper.key_id}: restore the original master key (MEMSTREAM_SECURITY_MASTER_KEY or "
                "<home>/master.key); nothing is read or written in plaintext meanwhile"
            )
        return self._wrapper.unwrap(wrapped, key)

    def _add(self, data_key: DataKey) -> None:
        self._forgotten_subjects.discard(data_key.subject)
        self._by_kid[data_key.kid] = data_key
        keys = self._by_subject.setdefault(data_key.subject, {})
        keys[data_key.kid] = data_key
        self._current[data_key.subject] = keys[min(keys)]
        self._forgotten.discard(data_key.kid)

    def _drop(self, subject: Subject, kid: bytes) -> None:
        self._by_kid.pop(kid, None)
        keys = self._by_subject.get(subject)
        if keys is not None:
            keys.pop(kid, None)
            if keys:
                self._current[subject] = keys[min(keys)]
            else:
                del self._by_subject[subject]
                self._current.pop(subject, None)
        self._forgotten.add(kid)
        self._forgotten_subjects.add(subject)

    def new_key(self, subject: Subject) -> tuple[DataKey, bytes, bytes]:
        """A fresh data key for ``subject``, already in this keyring, and the record
        ``(key, value)`` that publishes it (write it before sealing anything with it)."""
        kid = os.urandom(KID_BYTES)
        secret = AESGCM.generate_key(bit_length=DATA_KEY_BYTES * 8)
        record_key = key_record_key(subject, kid)
        value = json.dumps(
            {
                "v": 1,
                "team_id": subject.team_id,
                "user_id": subject.user_id,
                "kid": kid.hex(),
                "wrapped_by": self._wrapper.key_id,
                "wrapped": base64.b64encode(self._wrapper.wrap(secret, record_key)).decode("ascii"),
            },
            separators=(",", ":"),
        ).encode("utf-8")
        data_key = DataKey(kid, subject, secret)
        self._add(data_key)
        return data_key, record_key, value

    def key_for(self, subject: Subject) -> DataKey | None:
        """The key new events of ``subject`` are sealed under (the lowest key id)."""
        return self._current.get(subject)

    def by_kid(self, kid: bytes) -> DataKey | None:
        return self._by_kid.get(kid)

    def subject_of(self, kid: bytes) -> Subject | None:
        """The subject holding ``kid`` (None for a key this node does not hold)."""
        found = self._by_kid.get(kid)
        return None if found is None else found.subject

    def was_forgotten(self, kid: bytes) -> bool:
        """True when this node saw the tombstone of ``kid`` (and no key since)."""
        return kid in self._forgotten

    def subjects(self, team_id: str, user_id: str | None = None) -> list[Subject]:
        """The known subjects of a team (all its users), or of one user of it."""
        return sorted(
            s for s in self._by_subject if s.team_id == team_id and (user_id is None or s.user_id == user_id)
        )

    def known_subjects(self) -> list[Subject]:
        """Every subject this node holds a key of."""
        return sorted(self._by_subject)

    def forgotten_subjects(self, team_id: str, user_id: str | None = None) -> list[Subject]:
        """Subjects whose keys this node saw tombstoned (tombstones outlive compaction
        for the key topic's ``delete.retention.ms`` only)."""
        return sorted(
            s for s in self._forgotten_subjects if s.team_id == team_id and (user_id is None or s.user_id == user_id)
        )

    def kids_of(self, subject: Subject) -> list[bytes]:
        return sorted(self._by_subject.get(subject, {}))

    def record_keys(self, subject: Subject) -> list[bytes]:
        """The key-topic record keys of every key of ``subject`` (what forgetting tombstones)."""
        return [key_record_key(subject, kid) for kid in sorted(self._by_subject.get(subject, {}))]

    def forget_kids(self, subject: Subject, kids: list[bytes]) -> None:
        """Drop the named keys of ``subject`` now (a ``SubjectForgotten`` names them)."""
        for kid in kids:
            self._drop(subject, kid)

    def forget_locally(self, subject: Subject) -> list[bytes]:
        """Drop every key of ``subject`` now (the tombstones follow); their key ids."""
        kids = sorted(self._by_subject.get(subject, {}))
        for kid in kids:
            self._drop(subject, kid)
        return kids
