"""``memstream mcp --print-config``: the snippet an MCP host runs from a directory of its
own choosing (the live round trip is tests/interfaces/test_any_cwd.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from memstream.cli.mcp_config import mcp_snippet, secrets_left_out, snippet_json
from memstream.settings.model import Settings


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("MEMSTREAM_")]:
        monkeypatch.delenv(name)


def _server(settings: Settings, bank: str = "ops") -> dict:
    return mcp_snippet(settings, bank)["mcpServers"]["memstream"]


def test_the_snippet_carries_absolute_paths_and_the_broker(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, bootstrap_servers="kafka.internal:9092")
    server = _server(settings)
    assert Path(server["command"]).is_absolute()
    assert server["args"][server["args"].index("--bank") + 1] == "ops"
    assert server["args"][server["args"].index("--bootstrap-servers") + 1] == "kafka.internal:9092"
    assert server["env"]["MEMSTREAM_HOME"] == str(tmp_path)


def test_only_settings_that_differ_from_their_default_are_carried(tmp_path: Path) -> None:
    plain = _server(Settings(home=tmp_path))["env"]
    assert plain == {"MEMSTREAM_HOME": str(tmp_path)}
    tuned = _server(Settings(home=tmp_path, embedder="local", embedding_dim=64, lance_dir=tmp_path / "elsewhere"))["env"]
    assert tuned["MEMSTREAM_EMBEDDINGS_PROVIDER"] == "local"
    assert tuned["MEMSTREAM_EMBEDDINGS_DIM"] == "64"
    assert tuned["MEMSTREAM_STORAGE_ROOT"] == str(tmp_path / "elsewhere")


def test_secrets_never_go_into_the_snippet(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, llm_api_key="sk-very-secret")
    text = snippet_json(settings, "ops")
    assert "sk-very-secret" not in text
    assert "MEMSTREAM_EXTRACTION_LLM_API_KEY" not in json.loads(text)["mcpServers"]["memstream"]["env"]
    assert secrets_left_out(settings) == ["MEMSTREAM_EXTRACTION_LLM_API_KEY"]
