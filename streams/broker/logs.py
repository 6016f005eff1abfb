"""What a person needs to read when the broker did not come up."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from memstream.streams.broker.paths import BrokerPaths

__all__ = ["last_lines", "file_size", "log_report"]


def last_lines(text: str, count: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-count:])


_STACK_FRAME = re.compile(r"^\s+(at |\.\.\. \d+ (more|common frames omitted))")
_LOG_ENTRY = re.compile(r"^\[[^\]]+\] (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ")
_ERROR_LINES = 12
_LAST_LINES = 15


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _condensed_lines(path: Path, offset: int = 0) -> list[str]:
    """The log's lines written since ``offset`` (at most its last 256 KiB), with Java
    stack frames left out: the messages and "Caused by:" lines say what went wrong,
    the frames do not."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(offset, size - 256 * 1024) if offset <= size else 0)
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip() and not _STACK_FRAME.match(line)]


def _error_entries(lines: list[str]) -> list[str]:
    """ERROR and FATAL entries with their continuation lines (exception messages)."""
    picked: list[str] = []
    keep = False
    for line in lines:
        entry = _LOG_ENTRY.match(line)
        if entry:
            keep = entry.group(1) in ("ERROR", "FATAL")
        if keep:
            picked.append(line)
    return picked


def log_report(paths: BrokerPaths, offsets: Mapping[Path, int] | None = None) -> str:
    """What a person needs to see when the broker did not come up: the errors it
    logged during this start, then the last lines of its log and of the JVM's output."""
    offsets = offsets or {}
    parts = []
    server = _condensed_lines(paths.server_log, offsets.get(paths.server_log, 0))
    errors = _error_entries(server)
    if errors:
        parts.append(f"--- errors in {paths.server_log} ---\n" + "\n".join(errors[-_ERROR_LINES:]))
    if server:
        parts.append(f"--- last lines of {paths.server_log} ---\n" + "\n".join(server[-_LAST_LINES:]))
    jvm = _condensed_lines(paths.jvm_out, offsets.get(paths.jvm_out, 0))
    if jvm:
        parts.append(f"--- last lines of {paths.jvm_out} ---\n" + "\n".join(jvm[-_LAST_LINES:]))
    return "\n".join(parts) if parts else f"(nothing was logged in {paths.logs_dir})"
