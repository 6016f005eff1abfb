"""The real-model tier fails when the model never spoke.

Each case runs the tier (tests/real_llm/test_real_llm.py) in a pytest subprocess against
tests/real_llm/stub_server.py, a server process started here the way `.ci/run` starts
the model (its pid and a file with its exit status handed to the tier), and asserts that
the tier fails, and why. Runs on the real broker (the extraction and reflection tests
write to Kafka), with no real model needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIER = ROOT / "tests" / "real_llm" / "test_real_llm.py"
STUB = ROOT / "tests" / "real_llm" / "stub_server.py"

pytestmark = [pytest.mark.kafka]


class Stub:
    def __init__(self, mode: str, tmp: Path) -> None:
        url_file, self.exit_file = tmp / "url", tmp / "exit"
        self.proc = subprocess.Popen([sys.executable, str(STUB), mode, str(url_file)], cwd=ROOT)
        # what .ci/run's watcher does: keep the exit status where the tier can read it
        threading.Thread(target=self._watch, daemon=True).start()
        deadline = time.monotonic() + 60
        while not (url_file.exists() and url_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.url = url_file.read_text()

    def _watch(self) -> None:
        rc = self.proc.wait()
        self.exit_file.write_text(str(128 - rc if rc < 0 else rc))

    def run_tier(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        environ = {
            **os.environ,
            "MEMSTREAM_TEST_LLM_URL": self.url,
            "MEMSTREAM_TEST_LLM_MODEL": "stub",
            "MEMSTREAM_TEST_LLM_PID": str(self.proc.pid),
            "MEMSTREAM_TEST_LLM_EXIT_FILE": str(self.exit_file),
            **env,
        }
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", str(TIER), *args],
            cwd=ROOT, env=environ, capture_output=True, text=True, timeout=600,
        )


@pytest.fixture
def stub(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Stub]:
    server = Stub(request.param, tmp_path)
    yield server
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait()


@pytest.mark.parametrize("stub", ["crash"], indirect=True)
def test_a_server_that_crashes_on_a_completion_fails_the_tier_naming_the_signal(stub: Stub) -> None:
    result = stub.run_tier()
    assert result.returncode != 0, result.stdout
    assert "no chat completion" in result.stdout
    assert "killed by SIGSEGV" in result.stdout, result.stdout[-3000:]


@pytest.mark.parametrize("stub", ["500", "close"], indirect=True)
def test_a_server_that_never_answers_a_completion_fails_the_tier(stub: Stub) -> None:
    result = stub.run_tier()
    assert result.returncode != 0, result.stdout
    assert "no chat completion" in result.stdout and " passed" not in result.stdout.splitlines()[-1]


@pytest.mark.parametrize("stub", ["useless"], indirect=True)
def test_without_the_preflight_each_test_fails_when_the_model_never_says_anything_usable(stub: Stub) -> None:
    result = stub.run_tier("-k", "extractor or reflection", MEMSTREAM_TEST_LLM_PREFLIGHT="0")
    assert result.returncode != 0, result.stdout
    assert "FAILED tests/real_llm/test_real_llm.py::test_conversations_through_the_extractor" in result.stdout
    assert "no window was extracted by the model" in result.stdout
    assert "FAILED tests/real_llm/test_real_llm.py::test_decisions_and_outcomes" in result.stdout
    assert "the model wrote no usable reflection" in result.stdout


@pytest.mark.parametrize("stub", ["500"], indirect=True)
def test_without_the_preflight_the_mode_test_fails_against_a_server_that_only_errs(stub: Stub) -> None:
    result = stub.run_tier("-k", "json_mode", MEMSTREAM_TEST_LLM_PREFLIGHT="0")
    assert result.returncode != 0, result.stdout
    assert "the model never answered" in result.stdout
