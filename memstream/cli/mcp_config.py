"""``memstream mcp --print-config``: the JSON snippet an MCP host (Claude Desktop,
Cursor, VS Code) needs to start ``memstream mcp`` for this installation.

Why its own module: a host starts the server in a directory of its own choosing with
only the variables the snippet names, so the snippet must carry absolute paths (the
``memstream`` executable, ``MEMSTREAM_HOME``), the broker's address, and every setting
that differs from its default for that home. Secrets never go into it: they belong in
``<home>/config.env``, which the server reads from any directory.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from pydantic.fields import FieldInfo

from memstream.settings import HOME_RELATIVE_PATHS, Settings, setting_fields, settings_env
from memstream.settings import env_name

__all__ = ["mcp_command", "mcp_snippet", "snippet_json", "secrets_left_out"]

_NOT_FOR_MCP = frozenset({"home", "broker.bootstrap_servers", "log_level"})
"""Carried otherwise (``MEMSTREAM_HOME``, ``--bootstrap-servers``) or host-specific."""


def mcp_command() -> tuple[str, list[str]]:
    """The absolute command that starts memstream with this interpreter: the
    ``memstream`` script beside it when there is one, else ``python -m memstream``."""
    script = Path(sys.executable).parent / "memstream"
    if script.is_file():
        return str(script), []
    return sys.executable, ["-m", "memstream"]


def _default(settings: Settings, path: str, info: FieldInfo) -> Any:
    default = info.get_default(call_default_factory=True)
    if path in HOME_RELATIVE_PATHS and default is not None:
        return settings.home / default
    if path == "broker.bootstrap_servers":
        return f"127.0.0.1:{settings.broker.port}"
    return default


def _differing_env(settings: Settings) -> dict[str, str]:
    """``MEMSTREAM_*`` variables of every non-secret setting that differs from its
    default for this home (so the host's server agrees with the worker)."""
    env = settings_env(settings)
    out: dict[str, str] = {}
    for path, info, value in setting_fields(settings):
        if path in _NOT_FOR_MCP or value is None or isinstance(value, SecretStr):
            continue
        if value != _default(settings, path, info):
            key = env_name(path)
            out[key] = env[key]
    return out


def secrets_left_out(settings: Settings) -> list[str]:
    """Names of the secret settings that are set but not printed."""
    return [
        env_name(path)
        for path, _info, value in setting_fields(settings)
        if isinstance(value, SecretStr) and value.get_secret_value()
    ]


def mcp_snippet(settings: Settings, bank: str, server_name: str = "memstream") -> dict[str, Any]:
    """The ``mcpServers`` entry for ``bank`` with this installation's real paths."""
    command, prefix = mcp_command()
    env = {env_name("home"): str(settings.home), **_differing_env(settings)}
    args = [*prefix, "mcp", "--bank", bank, "--bootstrap-servers", settings.broker.bootstrap_servers]
    return {"mcpServers": {server_name: {"command": command, "args": args, "env": env}}}


def snippet_json(settings: Settings, bank: str) -> str:
    return json.dumps(mcp_snippet(settings, bank), indent=2)
