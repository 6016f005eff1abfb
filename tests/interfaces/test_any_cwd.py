"""One ``MEMSTREAM_HOME``, any working directory: the worker started in one directory,
``memstream mcp`` started the way an MCP host starts it (the official MCP client, the
JSON snippet ``memstream mcp --print-config`` printed, another working directory, only
the snippet's environment), and ``search`` / ``sql`` from a third directory, all read
and write the same projection on the same broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from tests.interfaces.iface_stack import stop_process

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MEMSTREAM = str(Path(sys.executable).parent / "memstream")


def host_env(home: Path) -> dict[str, str]:
    """What a desktop host passes a server: a bare environment and MEMSTREAM_HOME."""
    keep = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    return {**keep, "MEMSTREAM_HOME": str(home)}


def cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([MEMSTREAM, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


@pytest.fixture
def installed(kafka_bootstrap: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A home with its config file (private topics, the test broker's port not named:
    the snippet's --bootstrap-servers carries it), a bank, and a worker running in a
    directory of its own."""
    home = tmp_path / "home"
    home.mkdir()
    prefix = f"t{uuid.uuid4().hex[:10]}."
    (home / "config.env").write_text(
        f"MEMSTREAM_BROKER_TOPIC_PREFIX={prefix}\nMEMSTREAM_WORKER_APP_ID=app-{uuid.uuid4().hex[:8]}\n"
        "MEMSTREAM_WORKER_PROJECTOR_BATCH_SECONDS=0.05\nMEMSTREAM_API_READ_WAIT_MAX_S=30\n"
    )
    dirs = {name: tmp_path / name for name in ("worker_cwd", "host_cwd", "cli_cwd")}
    for d in dirs.values():
        d.mkdir()
    env = {**host_env(home), "MEMSTREAM_BROKER_BOOTSTRAP_SERVERS": kafka_bootstrap}
    added = cli(["banks", "add", "ops", "--team", "acme", "--user", "alice", "--description", "Alice's notes."],
                dirs["worker_cwd"], env)
    assert added.returncode == 0, added.stderr
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 - closed below
    worker = subprocess.Popen([MEMSTREAM, "worker"], cwd=dirs["worker_cwd"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while not (home / "lance" / "memories.lance").exists():
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
            time.sleep(0.3)
        yield {"home": home, "env": env, "dirs": dirs, "bootstrap": kafka_bootstrap}
    finally:
        assert stop_process(worker) == 0, (tmp_path / "worker.log").read_text()
        log.close()
        # Nothing was created relative to any working directory.
        for d in dirs.values():
            assert sorted(p.name for p in d.iterdir()) == [], d


async def test_mcp_snippet_works_as_a_host_runs_it(installed: dict[str, Any]) -> None:
    home, dirs = installed["home"], installed["dirs"]
    printed = cli(["mcp", "--bank", "ops", "--print-config", "--bootstrap-servers", installed["bootstrap"]],
                  dirs["worker_cwd"], host_env(home))
    assert printed.returncode == 0, printed.stderr
    server = json.loads(printed.stdout)["mcpServers"]["memstream"]
    assert Path(server["command"]).is_absolute()
    assert server["env"]["MEMSTREAM_HOME"] == str(home)
    assert server["args"][-2:] == ["--bootstrap-servers", installed["bootstrap"]]

    params = StdioServerParameters(command=server["command"], args=server["args"], env=server["env"], cwd=dirs["host_cwd"])
    marker = uuid.uuid4().hex[:8]
    async with Client(params, read_timeout_seconds=60) as client:
        added = await client.call_tool("add_memory", {"content": f"Alice flies with a window seat {marker}"})
        assert not added.is_error, added.content
        found = await client.call_tool("query_memory", {"query": f"window seat {marker}"})
        assert not found.is_error, found.content
        result = found.structured_content
        assert result is not None and result["up_to_date"] is True
        assert [m["memory_id"] for m in result["memories"]][:1] == [added.structured_content["memory_id"]]

    # The CLI from a third directory, with the same variables, reads the same set.
    env = installed["env"]
    search = cli(["search", f"window seat {marker}", "--team", "acme", "--user", "alice", "--json"], dirs["cli_cwd"], env)
    assert search.returncode == 0, search.stderr
    assert marker in search.stdout
    replayed = cli(["replay", "--dry-run", "--no-progress"], dirs["cli_cwd"], env)
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed" in replayed.stdout and "live set identical" in replayed.stdout, replayed.stdout
    sql = cli(["sql", "SELECT count(*) AS n FROM memories", "--json"], dirs["cli_cwd"], env)
    assert sql.returncode == 0, sql.stderr
    assert '"n": 1' in sql.stdout.replace(" ", "").replace('"n":1', '"n": 1')


def test_mcp_without_a_projection_names_the_home(installed: dict[str, Any], tmp_path: Path) -> None:
    elsewhere = tmp_path / "empty-home"
    elsewhere.mkdir()
    (elsewhere / "banks.toml").write_bytes((installed["home"] / "banks.toml").read_bytes())
    run = cli(["mcp", "--bank", "ops"], installed["dirs"]["host_cwd"], host_env(elsewhere))
    assert run.returncode != 0
    line = run.stderr.replace("\n", "")  # the console wraps long paths
    assert "MEMSTREAM_HOME" in line and str(elsewhere) in line
    assert not (elsewhere / "lance").exists()
