"""The README, run line by line: its shell (and Python) blocks in order, in a fresh
directory, against a fresh MEMSTREAM_HOME and the real broker, so the README cannot
drift from the code. And every setting is in its configuration table.

Blocks are run as written, in one bash session (so ``KEY=...`` from one block is
there in the next). A comment line right before a block changes that:

* ``<!-- readme-test: skip (why) -->``: not run (installation, CI itself);
* ``<!-- readme-test: background (why) -->``: started in the background (``memstream
  up``); the rest runs once the API answers ``/healthz``, and Ctrl-C stops it at the end.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from tests.support import free_port

README = Path(__file__).parents[1] / "README.md"
MARKER = re.compile(r"<!--\s*readme-test:\s*(skip|background)\b")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


@dataclass(frozen=True)
class Block:
    language: str
    code: str
    mode: str  # "run", "skip" or "background"


def readme_blocks(text: str) -> list[Block]:
    blocks = []
    for match in FENCE.finditer(text):
        language = match.group(1)
        if language not in ("bash", "python"):
            continue
        before = text[: match.start()].rstrip().splitlines()
        marker = MARKER.search(before[-1]) if before else None
        blocks.append(Block(language, match.group(2), marker.group(1) if marker else "run"))
    return blocks


def as_script(blocks: list[Block]) -> str:
    parts = ["set -euo pipefail"]
    for i, block in enumerate(blocks):
        parts.append(f"echo '=== README block {i} ({block.language}) ==='")
        if block.language == "bash":
            parts.append(block.code)
        else:
            parts.append(f"python3 - <<'README_PY'\n{block.code}README_PY")
    return "\n".join(parts) + "\n"


def test_the_markers_are_recognised() -> None:
    blocks = readme_blocks(README.read_text())
    modes = [b.mode for b in blocks]
    assert modes.count("background") == 1 and modes.count("skip") >= 2
    background = next(b for b in blocks if b.mode == "background")
    assert background.code.strip() == "memstream up"


def test_the_configuration_section_points_to_the_reference() -> None:
    text = README.read_text()
    section = text[text.index("## Configuration") :]
    section = section[: section.index("\n## ", 1)]
    assert "docs/configuration.md" in section


@pytest.mark.kafka
@pytest.mark.slow
def test_the_readme_runs_line_by_line(kafka_bootstrap: str, tmp_path: Path) -> None:
    blocks = readme_blocks(README.read_text())
    cwd, home = tmp_path / "fresh", tmp_path / "home"
    cwd.mkdir()
    api_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        MEMSTREAM_HOME=str(home),
        MEMSTREAM_BROKER_BOOTSTRAP_SERVERS=kafka_bootstrap,
        MEMSTREAM_BROKER_TOPIC_PREFIX=f"t{uuid.uuid4().hex[:10]}.",
        MEMSTREAM_WORKER_APP_ID=f"app-{uuid.uuid4().hex[:8]}",
        MEMSTREAM_API_PORT=str(api_port),
        MEMSTREAM_WORKER_PROJECTOR_BATCH_SECONDS="0.05",
        MEMSTREAM_API_READ_WAIT_MAX_S="60",
        PYTHONUNBUFFERED="1",
    )
    background = next(b for b in blocks if b.mode == "background")
    up_log = tmp_path / "up.log"
    with open(up_log, "wb") as log:
        up = subprocess.Popen(["bash", "-c", background.code], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert up.poll() is None, up_log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{api_port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, up_log.read_text()
            time.sleep(0.5)
        script = as_script([b for b in blocks if b.mode == "run"])
        run = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, f"{run.stdout[-4000:]}\n{run.stderr[-4000:]}\n{up_log.read_text()[-3000:]}"
    finally:
        os.killpg(up.pid, signal.SIGINT)  # Ctrl-C in the terminal that runs `memstream up`
        code = up.wait(120)
    assert code == 0, up_log.read_text()[-3000:]

    outputs = dict(re.findall(r"=== README block (\d+) \(\w+\) ===\n(.*?)(?==== README block|\Z)", run.stdout, re.S))
    runnable = [b for b in blocks if b.mode == "run"]
    talk = next(str(i) for i, b in enumerate(runnable) if "/v1/search" in b.code)
    # The quick start reads back what it wrote: the last line is the search answer.
    assert "Alice prefers window seats" in outputs[talk].strip().splitlines()[-1], outputs[talk]
    cli = next(str(i) for i, b in enumerate(runnable) if "memstream replay" in b.code)
    assert "Alice prefers window seats" in outputs[cli], outputs[cli]
    assert "swapped in" in outputs[cli], outputs[cli]
    assert (cwd / "out").is_dir()
    assert {p.name for p in cwd.iterdir()} == {"out"}, "nothing but the export in the working directory"
