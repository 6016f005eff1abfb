"""Table sets under one LanceDB storage root, which one is current, and the hand-over
of a replayed set to a running worker.

Why: ``memstream replay`` rebuilds every table from offset 0 into a *new* set while
the worker keeps projecting into the current one and readers keep searching it. The
switch must be atomic for readers (a search runs on one set, whole) and must not
lose what the worker wrote meanwhile. Layout::

    <lance_dir>/                the storage root (``settings.storage.root``)
      <table>.lance             the first set, before any replay ("legacy" set: the root)
      CURRENT                   name of the current set, replaced atomically (os.replace)
      PREVIOUS                  the set CURRENT replaced (kept for readers still on it)
      PREVIOUS.at               when it was replaced (epoch seconds)
      sets/<name>/              a set built by a replay
      swap.request / swap.paused  the hand-over (see below)

Readers resolve the current set when they open and follow a change through
:class:`CurrentStore` (a ``stat`` per use); the replaced set is removed by the worker
once the readers' grace has passed since the switch (:meth:`TableSets.retire_previous`),
or by the next replay: a forget applied to the current set leaves no copy of the
subject in a set nobody serves any more. Hand-over with a running worker (which holds the
root's :class:`~memstream.services.projector.service.LanceDirLock`): the replay writes
``swap.request`` (id, target set, its pid); the worker finishes the write in flight,
stops applying and answers ``swap.paused`` with the same id; the replay catches the
new set up to the paused worker's positions, verifies, points ``CURRENT`` at it and
the worker resumes writing into the new set. A request whose replay died, or that is
withdrawn, lets the worker resume on its set. Sharding (``projections/store/shards.py``) can make a set a
directory of per-partition databases without changing any of this.

The root may be an object-store prefix (``s3://bucket/prefix``): the small files are
then objects, each replaced by one atomic PUT (:mod:`memstream.projections.store.object_paths`).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from memstream.projections.store.object_paths import RootPath, as_path, remove_tree, write_atomically
from memstream.projections.store.shards import is_sharded

__all__ = ["TableSets", "SwapRequest", "CurrentStore", "pid_alive"]

_CURRENT = "CURRENT"
_PREVIOUS = "PREVIOUS"
_PREVIOUS_AT = "PREVIOUS.at"
_SETS = "sets"
_REQUEST = "swap.request"
_PAUSED = "swap.paused"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class SwapRequest:
    """A replay's request that the worker pause before the switch to ``target``."""

    id: str
    target: str
    pid: int

    @property
    def alive(self) -> bool:
        return pid_alive(self.pid)


_write_atomically = write_atomically


def _read(path: RootPath) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None


class TableSets:
    """The table sets of one storage root (see the module docstring)."""

    def __init__(self, root: Any) -> None:
        """``root``: a local path, or an object-store root (``settings.storage.root``)."""
        self.root: Any = as_path(root)

    # --- which set ----------------------------------------------------------------
    def current_name(self) -> str | None:
        """The current set's name; None for the root's own (legacy) set."""
        return _read(self.root / _CURRENT) or None

    def path_of(self, name: str | None) -> Any:
        return self.root if name is None else self.root / _SETS / name

    def current(self) -> Any:
        """The directory of the current set."""
        return self.path_of(self.current_name())

    def has_projection(self) -> bool:
        current = self.current()
        return (current / "memories.lance").exists() or is_sharded(current)

    def new_set(self, name: str) -> Any:
        path = self.path_of(name)
        if path.exists():
            raise FileExistsError(f"{path} already exists")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def point_to(self, name: str) -> None:
        """Make ``name`` current in one atomic rename; the replaced set is recorded."""
        old = self.current_name()
        _write_atomically(self.root / _PREVIOUS_AT, f"{time.time():.3f}")
        _write_atomically(self.root / _PREVIOUS, old or "")
        _write_atomically(self.root / _CURRENT, name)

    def retire_previous(self, grace_s: float, now: float | None = None) -> str | None:
        """Remove the set ``CURRENT`` replaced once ``grace_s`` has passed since the
        switch (readers still on it have moved on by then): a copy nobody serves must
        not keep a forgotten subject. Returns what was removed, if anything."""
        at = _read(self.root / _PREVIOUS_AT)
        current = self.current_name()
        if at is None or current is None:
            return None
        try:
            due = float(at) + grace_s
        except ValueError:
            due = 0.0
        if (time.time() if now is None else now) < due:
            return None
        previous = _read(self.root / _PREVIOUS) or None
        if previous == current:
            removed = None
        elif previous is None:  # the root's own (legacy) tables
            for table in self.root.glob("*.lance"):
                remove_tree(table)
            removed = "(root tables)"
        else:
            remove_tree(self.path_of(previous))
            removed = previous
        (self.root / _PREVIOUS).unlink(missing_ok=True)
        (self.root / _PREVIOUS_AT).unlink(missing_ok=True)
        return removed

    def remove_set(self, name: str) -> None:
        remove_tree(self.path_of(name))

    def cleanup(self, keep: tuple[str, ...] = ()) -> list[str]:
        """Delete every set but the current one, the one it replaced and ``keep``
        (the caller holds the replay lock, so no other build is in progress). The
        root's legacy tables go once neither current nor previous. Returns what was
        removed."""
        current, previous = self.current_name(), _read(self.root / _PREVIOUS) or None
        removed: list[str] = []
        sets_dir = self.root / _SETS
        for entry in sorted(sets_dir.iterdir()) if sets_dir.is_dir() else ():
            if entry.name not in {current, previous, *keep}:
                remove_tree(entry)
                removed.append(entry.name)
        if current is not None and previous is not None:
            for table in self.root.glob("*.lance"):
                remove_tree(table)
                removed.append(table.name)
        return removed

    # --- the hand-over ------------------------------------------------------------
    def request_swap(self, target: str) -> SwapRequest:
        request = SwapRequest(id=uuid.uuid4().hex, target=target, pid=os.getpid())
        _write_atomically(self.root / _REQUEST, json.dumps(request.__dict__))
        return request

    def swap_request(self) -> SwapRequest | None:
        text = _read(self.root / _REQUEST)
        if not text:
            return None
        try:
            return SwapRequest(**json.loads(text))
        except (ValueError, TypeError):
            return None

    def withdraw(self, request: SwapRequest) -> None:
        if self.swap_request() == request:
            (self.root / _REQUEST).unlink(missing_ok=True)
        if self.paused_for() == request.id:
            (self.root / _PAUSED).unlink(missing_ok=True)

    def pause(self, request: SwapRequest) -> None:
        """The worker's answer: it applies nothing until the request is settled."""
        _write_atomically(self.root / _PAUSED, json.dumps({"id": request.id, "pid": os.getpid()}))

    def paused_for(self) -> str | None:
        text = _read(self.root / _PAUSED)
        try:
            return str(json.loads(text)["id"]) if text else None
        except (ValueError, KeyError, TypeError):
            return None

    def resume(self) -> None:
        (self.root / _PAUSED).unlink(missing_ok=True)


_S = TypeVar("_S")


class CurrentStore(Generic[_S]):
    """A reader's store that follows ``CURRENT``: each :meth:`get` checks which set is
    current and opens it when it changed (the old store object stays valid for
    whoever still holds it: a search runs on one set from start to end)."""

    def __init__(self, root: Any, opener: Callable[[Any], _S]) -> None:
        self._sets = TableSets(root)
        self._opener = opener
        self._lock = threading.Lock()
        self._path: RootPath | None = None
        self._store: _S | None = None

    def get(self) -> _S:
        path = self._sets.current()
        store = self._store
        if path == self._path and store is not None:
            return store
        with self._lock:
            store = self._store
            if path != self._path or store is None:
                store = self._store = self._opener(path)
                self._path = path
            return store

    @property
    def opened(self) -> _S | None:
        """The store opened last (None before the first :meth:`get`), without a check."""
        return self._store
