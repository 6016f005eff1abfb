"""An exclusive, expiring write lease kept in one object of an S3 bucket.

Why: on an object-store root, writers run on different machines, so no file lock can
keep two of them off one shard. The lease object is only ever written conditionally
(``If-None-Match: *`` to create it, ``If-Match: <etag>`` to change it), so of two
processes racing for it exactly one write wins. Design (docs/operations-storage.md):

- The holder renews it every ``ttl/4`` (each renewal changes its ETag) and counts
  itself valid until ``ttl - ttl/4`` after the start of its last successful renewal;
  writers check :meth:`ObjectLease.valid` before each commit.
- A contender takes a held lease only after it saw the *same* ETag for a whole
  ``ttl`` on its own monotonic clock: no wall clocks are compared between machines.
- Each take increments ``generation`` (a fencing number shown by ``memstream shards``);
  a holder whose renewal finds another ETag has lost the lease and is told so
  (``on_lost``).
- Release writes a "released" body, which the next contender takes at once.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from memstream.projections.store.object_paths import ObjectPath, PreconditionFailed

__all__ = ["ObjectLease", "LeaseBusyError"]

log = logging.getLogger(__name__)


class LeaseBusyError(RuntimeError):
    """Another process holds the lease (and renews it)."""


class ObjectLease:
    """The lease object at ``path`` (see the module docstring)."""

    def __init__(self, path: ObjectPath, ttl_s: float, on_lost: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.ttl_s = float(ttl_s)
        self.on_lost = on_lost
        self.generation = 0
        self._token = uuid.uuid4().hex
        self._etag: str | None = None
        self._valid_until = float("-inf")
        self._seen: tuple[str, float] | None = None  # a held lease's ETag and when first seen
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._renewals = 0
        self._owner = ""

    @property
    def held(self) -> bool:
        return self._etag is not None

    def valid(self) -> bool:
        """Whether this process may still write under the lease."""
        return self.held and time.monotonic() < self._valid_until

    def _body(self, owner: str | None) -> bytes:
        return json.dumps(
            {
                "owner": owner,
                "token": self._token if owner else None,
                "generation": self.generation,
                "renewal": self._renewals,
                "ttl_s": self.ttl_s,
                "nonce": uuid.uuid4().hex,
            }
        ).encode()

    def read(self) -> tuple[dict[str, Any], str] | None:
        """The lease's content and ETag (None: no lease was ever taken here)."""
        got = self.path.read_bytes_and_etag()
        if got is None:
            return None
        try:
            body = json.loads(got[0])
        except ValueError:
            body = {"owner": "an unreadable lease"}
        return (body if isinstance(body, dict) else {}), got[1]

    def holder(self) -> str | None:
        """Who the lease names (it may have stopped renewing), or None when released."""
        got = self.read()
        if got is None or not got[0].get("owner"):
            return None
        return f"{got[0]['owner']} (generation {got[0].get('generation', '?')})"

    def try_acquire(self, owner: str) -> bool:
        """Take the lease if it is free, released, or was not renewed for ``ttl_s``."""
        if self.held:
            return True
        got = self.read()
        started = time.monotonic()
        etag: str | None = None
        generation = 0
        if got is not None:
            body, etag = got
            generation = int(body.get("generation") or 0)
            if body.get("owner") and body.get("token") != self._token:
                seen = self._seen
                if seen is None or seen[0] != etag:
                    self._seen = (etag, started)
                    return False
                # the holder's own ttl counts: it believes itself valid that long
                if started - seen[1] < max(self.ttl_s, float(body.get("ttl_s") or 0)):
                    return False
                log.warning("taking over %s: %s did not renew it for %.0f s", self.path, body.get("owner"), self.ttl_s)
        self.generation = generation + 1
        self._renewals = 0
        self._owner = f"{owner} on {socket.gethostname()} (pid {os.getpid()})"
        try:
            new_etag = self.path.put_if(self._body(self._owner), etag=etag)
        except PreconditionFailed:
            self._seen = None
            return False
        with self._lock:
            self._etag, self._seen = new_etag, None
            self._valid_until = started + self._valid_for()
        self._start_renewing()
        return True

    def acquire(self, owner: str, wait_s: float = 0.0, poll_s: float = 0.5) -> None:
        """Take the lease, waiting up to ``wait_s`` (a held one needs ``ttl_s`` to expire)."""
        deadline = time.monotonic() + wait_s
        while not self.try_acquire(owner):
            if time.monotonic() >= deadline:
                raise LeaseBusyError(f"{self.path} is held by {self.holder() or 'another process'}")
            time.sleep(min(poll_s, self.ttl_s / 4))

    def _valid_for(self) -> float:
        return self.ttl_s - self.ttl_s / 4

    def _start_renewing(self) -> None:
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew_loop, name=f"lease {self.path.name}", daemon=True)
        self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            if not self.renew():
                return

    def renew(self) -> bool:
        """One renewal; False once the lease is lost (another process took it)."""
        with self._lock:
            etag = self._etag
            if etag is None:
                return False
            started = time.monotonic()
            self._renewals += 1
            try:
                new_etag = self.path.put_if(self._body(self._owner), etag=etag)
            except PreconditionFailed:
                self._etag, self._valid_until = None, float("-inf")
                lost = True
            except Exception as exc:  # noqa: BLE001 - the store is unreachable: retry until invalid
                log.warning("renewing %s failed (%s); retrying", self.path, exc)
                return True
            else:
                self._etag, self._valid_until = new_etag, started + self._valid_for()
                return True
        if lost:
            message = f"lost the lease {self.path}: another process took it over"
            log.critical(message)
            if self.on_lost is not None:
                self.on_lost(message)
        return False

    def pause_renewals(self) -> None:
        """Stop renewing without releasing (what a stalled or partitioned holder does)."""
        self._stop.set()
        renewer, self._renewer = self._renewer, None
        if renewer is not None and renewer is not threading.current_thread():
            renewer.join()

    def release(self) -> None:
        """Let go: the next contender takes the lease at once."""
        self.pause_renewals()
        with self._lock:
            etag, self._etag = self._etag, None
            self._valid_until = float("-inf")
            if etag is None:
                return
            try:
                self.path.put_if(self._body(None), etag=etag)
            except PreconditionFailed:
                pass  # already taken over: nothing of ours to release
