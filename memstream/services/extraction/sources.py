"""Extracted memories never outlive the keys of the turns they came from.

The extractor holds turns in memory (a window waiting for more turns, an LLM call in
flight) for seconds to minutes. If their subject is forgotten meanwhile, what it makes
of them must not reach the log under a key made afterwards: that would bring the
forgotten content back to life, readable. So each window carries the data keys its
turns were sealed under, and its events are sealed only while every one of those keys
is still held, under the subject's current key (which then exists: nothing creates
one). A window whose keys are gone is dropped, its turns done with. A subject that
writes again after a forget gets a new key from its new writes (a new life of the
subject); turns of its earlier life are never sealed under it.

The check and the sealing run without yielding to the event loop in between (the
keyring changes only on the loop), so a tombstone cannot slip between them.
"""

from __future__ import annotations

from collections.abc import Iterable

from memstream.domain.events import Scope
from memstream.sealing import is_sealed, sealed_kid
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.sealing.sealed_records import subject_of

__all__ = ["SourceKeys", "kid_of"]


def kid_of(value: bytes | None) -> bytes | None:
    """The data key a record's value was sealed under (None: plaintext)."""
    return sealed_kid(value) if value is not None and is_sealed(value) else None


class SourceKeys:
    """Decides, against this node's keyring, whether a window's events may be sealed."""

    def __init__(self, keys: SubjectKeys) -> None:
        self._keys = keys
        self.dropped_windows = 0

    async def prepare(self, windows: Iterable[tuple[Scope, frozenset[bytes]]]) -> None:
        """Create the key of a subject whose turns came unsealed (a log from before
        sealing), the one case where extraction may make a key; never for a subject
        this node saw forgotten."""
        ring = self._keys.keyring
        assert ring is not None
        for scope, kids in windows:
            subject = subject_of(scope)
            if kids or ring.key_for(subject) is not None:
                continue
            if subject in ring.forgotten_subjects(subject.team_id, subject.user_id):
                continue
            await self._keys.key_for(subject)

    def live(self, scope: Scope, kids: frozenset[bytes]) -> bool:
        """Whether every key of the window's turns is still held (and so the subject
        has a key to seal its events under)."""
        ring = self._keys.keyring
        assert ring is not None
        if ring.key_for(subject_of(scope)) is None:
            return False
        return all(ring.by_kid(kid) is not None for kid in kids)
