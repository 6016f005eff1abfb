"""Shared builders for the local broker tests: settings on free ports, a .properties reader."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import free_port

from memstream.settings.model import Settings


def broker_settings(tmp_path: Path, **overrides: object) -> Settings:
    broker_port = int(overrides.pop("broker_port", free_port()))  # type: ignore[call-overload]
    values: dict[str, object] = {
        "home": tmp_path / "home",
        "broker_port": broker_port,
        "controller_port": free_port(),
        "bootstrap_servers": f"127.0.0.1:{broker_port}",
        "broker_heap": "256m",
        "broker_start_timeout_s": 90.0,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


def parse_properties(text: str) -> dict[str, str]:
    """Read a .properties file the way java.util.Properties does for the subset the
    generator writes (key=value lines, whole-line comments, backslash and \\uXXXX
    escapes)."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {line!r}"
        value = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), value)
        props[key.strip()] = value.replace("\\\\", "\\")
    return props
