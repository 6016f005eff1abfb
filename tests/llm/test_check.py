"""The one-completion check and the server's fate (memstream/llm/check.py), against the
scripted OpenAI-compatible server and real child processes."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
from tests.fakes.openai_server import FakeOpenAI, Reply, fake_llm  # noqa: F401 - the fixture

from memstream.llm.check import ServerDown, check_chat, describe_status, server_fate


def test_content_passes_and_no_content_or_an_error_fails(fake_llm: FakeOpenAI) -> None:  # noqa: F811
    fake_llm.chat.push(Reply(content="Hello there."), Reply(content="  "), Reply(status=500), Reply(drop=True))
    assert check_chat(fake_llm.base_url, "m").content == "Hello there."
    with pytest.raises(ServerDown, match="no content"):
        check_chat(fake_llm.base_url, "m")
    with pytest.raises(ServerDown, match="InternalServerError"):
        check_chat(fake_llm.base_url, "m")
    with pytest.raises(ServerDown, match="no chat completion"):
        check_chat(fake_llm.base_url, "m")


def test_statuses_are_named_by_their_signal() -> None:
    assert describe_status(139) == "killed by SIGSEGV (exit 139)"
    assert describe_status(-9) == "killed by SIGKILL"
    assert describe_status(1) == "exit 1"


def test_a_live_process_has_no_fate_and_a_dead_one_reads_its_exit_file(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert server_fate(proc.pid, tmp_path / "exit") is None
    finally:
        proc.kill()
    proc.wait()
    (tmp_path / "exit").write_text("139\n")
    assert server_fate(proc.pid, tmp_path / "exit") == "killed by SIGSEGV (exit 139)"
    assert server_fate(proc.pid, None) == "exited (status unknown)"


def test_a_process_that_dies_a_moment_after_the_connection_drops_is_named(tmp_path: Path) -> None:
    # The stub crashes mid-answer: the client sees the connection drop before the process
    # is gone; asked at once the process still lives, asked with a wait it has a fate.
    exit_file = tmp_path / "exit"
    script = f"import time, pathlib; time.sleep(0.5); pathlib.Path({str(exit_file)!r}).write_text('139')"
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        assert server_fate(proc.pid, exit_file) is None
        threading.Thread(target=proc.wait, daemon=True).start()  # reaped as its launcher would
        assert server_fate(proc.pid, exit_file, die_within_s=10.0) == "killed by SIGSEGV (exit 139)"
    finally:
        proc.kill()
