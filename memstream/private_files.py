"""Files private by default: every entry point starts with :func:`private_by_default`.

Everything memstream writes to disk holds tenants' data or the keys to it: the LanceDB
tables (plaintext memories), the home (master and worker keys, the local broker's log
segments, checkpoints). The process's umask decides the mode of every file and
directory it and its children (the local Kafka broker, the worker and API that
``memstream up`` starts) create, whichever library creates them, so one call at the
start of each entry point makes them all 0600 files and 0700 directories, by
construction rather than file by file. Hosts that must share the files with a group
run every memstream process as one user instead (docs/security.md).
"""

from __future__ import annotations

import os

__all__ = ["PRIVATE_UMASK", "private_by_default"]

PRIVATE_UMASK = 0o077
"""No permission for group or others on anything created afterwards."""


def private_by_default() -> None:
    """Make every file and directory this process (and its children) creates
    private to its user. Only ever narrows: a stricter umask already set stays."""
    current = os.umask(PRIVATE_UMASK)
    os.umask(current | PRIVATE_UMASK)
