"""The reflector's own state, sealed: what it keeps of a decision dies with its subject.

The reflector keeps open decisions, early outcomes and chosen reflections in Faust
tables (compacted changelog topics, kept as long as the entry lives) and passes them
through its work topic (30 days). With sealing on, every event it keeps there is
sealed under its subject's data key, like the log itself (:class:`ReflectorSeal`):

* a work record carries ``{"kind", "sealed"}`` (the event's JSON, sealed) instead of
  the event;
* a table entry keeps its bookkeeping plain (state, partition, times) and its events
  (``decision``, ``outcome``, ``reflection``; an early outcome's ``outcome``) sealed
  (:class:`SealedEntries`);
* the subject index and the work topic are keyed by ``team|user|#`` and a keyed hash
  of the decision's subject (HMAC under the data key), not the subject's text;
* the decision table is keyed (and the subject index lists its decisions) by
  ``team|user|#`` and a keyed hash of the decision's agent and id, not the id: a
  decision id is personal, and once the subject is forgotten nobody can tell which
  decision a finished entry's marker was about.

Once the subject is forgotten, none of it opens: entries read as absent, work records
are skipped, and each tick deletes the unreadable entries of its partition (so the
changelog compacts them away).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from memstream.domain.events import Scope
from memstream.domain.reflection import decision_key as plain_decision_key
from memstream.domain.reflection import subject_key as plain_subject_key
from memstream.sealing import DataKey, SealedHeader, TamperedRecord, UnreadableRecord, open_sealed, seal
from memstream.streams.sealing.keys import SubjectKeys
from memstream.streams.sealing.sealed_records import subject_of

__all__ = ["SubjectGone", "ReflectorSeal", "SealedEntries", "DECISION_FIELDS"]

DECISION_FIELDS = ("decision", "outcome", "reflection")
"""The fields of a decision entry that hold events (sealed)."""

_CACHE_MAX = 50_000


class SubjectGone(Exception):
    """The subject holds no data key here (forgotten): nothing of it is kept."""


class ReflectorSeal:
    """Seals and opens what the reflector keeps; ``keys`` None means sealing is off."""

    def __init__(self) -> None:
        self.keys: SubjectKeys | None = None
        self._opened: dict[str, Any] = {}

    def _key(self, team_id: str, user_id: str) -> DataKey:
        assert self.keys is not None and self.keys.keyring is not None
        key = self.keys.keyring.key_for(subject_of(Scope(team_id=team_id, user_id=user_id)))
        if key is None:
            raise SubjectGone(f"team {team_id!r} user {user_id!r}")
        return key

    def forget_cache(self) -> None:
        """Drop every opened value held in memory (a subject was forgotten)."""
        self._opened.clear()

    def subject_key(self, scope: Scope, subject: str) -> str:
        """The key of a subject's decisions within its space: keyed when sealing."""
        if self.keys is None:
            return plain_subject_key(scope, subject)
        hashed = self._key(scope.team_id, scope.user_id).keyed_hash(subject)[:32]
        return f"{scope.team_id}|{scope.user_id}|#{hashed}"

    def decision_key(self, scope: Scope, decision_id: str) -> str:
        """The key of a decision (an id belongs to its agent): keyed when sealing."""
        if self.keys is None:
            return plain_decision_key(scope, decision_id)
        hashed = self._key(scope.team_id, scope.user_id).keyed_hash(f"decision\x1f{scope.agent_id}\x1f{decision_id}")
        return f"{scope.team_id}|{scope.user_id}|#{hashed[:32]}"

    def seal_json(self, value: Mapping[str, Any], team_id: str, user_id: str) -> str:
        """``value`` (an event as JSON) sealed, as base64 text for a JSON store."""
        key = self._key(team_id, user_id)
        scope = value.get("scope") or {}
        header = SealedHeader(
            str(value.get("event_id", "")),
            str(value.get("type", "")),
            int(value.get("schema_version", 1)),
            team_id,
            user_id,
            str(scope.get("agent_id", "default")),
        )
        plain = json.dumps(value, separators=(",", ":")).encode("utf-8")
        return base64.b64encode(seal(plain, header, key)).decode("ascii")

    def open_json(self, sealed: str) -> Any:
        """The value :meth:`seal_json` sealed; raises :class:`SubjectGone` when its key
        is gone (or it does not open)."""
        found = self._opened.get(sealed)
        if found is not None:
            return found
        assert self.keys is not None and self.keys.keyring is not None
        try:
            value = json.loads(open_sealed(base64.b64decode(sealed), self.keys.keyring))
        except (UnreadableRecord, TamperedRecord, ValueError) as exc:
            raise SubjectGone(str(exc)) from None
        if len(self._opened) >= _CACHE_MAX:
            self._opened.clear()
        self._opened[sealed] = value
        return value

    # -- work records ---------------------------------------------------------------------
    def work_value(self, kind: str, event: Mapping[str, Any], scope: Scope) -> dict[str, Any]:
        if self.keys is None:
            return {"kind": kind, "event": dict(event)}
        return {"kind": kind, "sealed": self.seal_json(event, scope.team_id, scope.user_id)}

    def work_event(self, value: Mapping[str, Any]) -> Any:
        """The event of a work record (raises :class:`SubjectGone` when it is sealed
        under a forgotten key)."""
        if "sealed" in value:
            return self.open_json(value["sealed"])
        return value["event"]


def _space(key: str) -> tuple[str, str]:
    team, user, _ = key.split("|", 2)  # "|" cannot occur in an identifier
    return team, user


class SealedEntries(MutableMapping[str, Any]):
    """A reflector table whose entries' events are sealed (see the module doc).

    ``mode`` is ``"decision"`` (a dict whose :data:`DECISION_FIELDS` are events) or
    ``"early"`` (a list of items, each with an ``outcome`` event). Reads skip the
    entries that no longer open, and remember them for :meth:`take_unreadable`."""

    def __init__(self, table: MutableMapping[str, Any], seal_: ReflectorSeal, mode: str) -> None:
        self.table = table
        self._seal = seal_
        self._mode = mode
        self._unreadable: dict[str, Any] = {}

    def _fields(self, value: Any, change: Any) -> Any:
        if value is None:
            return None
        if self._mode == "decision":
            return {k: (change(v) if k in DECISION_FIELDS and v is not None else v) for k, v in value.items()}
        return [{**item, "outcome": change(item["outcome"])} for item in value]

    def _open(self, key: str, stored: Any) -> Any:
        if self._seal.keys is None or stored is None:
            return stored
        try:
            return self._fields(stored, lambda v: self._seal.open_json(v["sealed"]) if "sealed" in v else v)
        except SubjectGone:
            self._unreadable[key] = stored
            return None

    def __getitem__(self, key: str) -> Any:
        value = self._open(key, self.table[key])
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        stored = self.table.get(key)
        value = self._open(key, stored)
        return default if value is None else value

    def __setitem__(self, key: str, value: Any) -> None:
        if self._seal.keys is None:
            self.table[key] = value
            return
        team, user = _space(key)
        self.table[key] = self._fields(value, lambda v: {"sealed": self._seal.seal_json(v, team, user)})

    def __delitem__(self, key: str) -> None:
        del self.table[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.table.keys()))

    def __len__(self) -> int:
        return len(self.table)

    def items(self) -> Iterator[tuple[str, Any]]:  # type: ignore[override]
        for key, stored in list(self.table.items()):
            value = self._open(key, stored)
            if value is not None:
                yield key, value

    def values(self) -> list[Any]:  # type: ignore[override]
        return [value for _, value in self.items()]

    def take_unreadable(self, partition: int) -> list[str]:
        """Keys of the entries of ``partition`` found unreadable (forgotten), to delete
        while a record of that partition is handled (a Faust table writes its
        changelog to the partition of the record being handled)."""
        out = []
        for key, stored in list(self._unreadable.items()):
            parts = [stored.get("partition")] if isinstance(stored, dict) else [i.get("partition") for i in stored]
            if partition in parts:
                out.append(key)
                del self._unreadable[key]
        return out
