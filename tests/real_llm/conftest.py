"""The real-model tier's guards: the model must answer before the tier starts, and a
model server that dies during the tier fails it, naming how it died.

``MEMSTREAM_TEST_LLM_URL`` (and ``MEMSTREAM_TEST_LLM_MODEL``) point the tier at the
server; ``MEMSTREAM_TEST_LLM_PID`` names its process and ``MEMSTREAM_TEST_LLM_EXIT_FILE``
the file its launcher writes the exit status to (``.ci/run`` sets all four).
``MEMSTREAM_TEST_LLM_PREFLIGHT=0`` leaves the preflight completion out (the tier's own
test uses it to show that each test fails by itself against a useless model).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from memstream.llm.check import ServerDown, check_chat, server_fate

URL = os.environ.get("MEMSTREAM_TEST_LLM_URL", "").strip()
MODEL = os.environ.get("MEMSTREAM_TEST_LLM_MODEL", "").strip() or "smollm2"
PREFLIGHT_TIMEOUT_S = 180.0
"""A loaded 2-core machine answers a 32-token completion in seconds; this is slack."""


def _fate(die_within_s: float = 0.0) -> str | None:
    pid = os.environ.get("MEMSTREAM_TEST_LLM_PID", "").strip()
    if not pid:
        return None
    exit_file = os.environ.get("MEMSTREAM_TEST_LLM_EXIT_FILE", "").strip()
    return server_fate(int(pid), Path(exit_file) if exit_file else None, die_within_s=die_within_s)


def _fail_if_dead(when: str) -> None:
    fate = _fate()
    if fate is not None:
        pytest.fail(f"the model server died {when}: {fate}", pytrace=False)


@pytest.fixture(scope="session")
def model_answers() -> None:
    """One real chat completion with content, or the whole tier fails."""
    if os.environ.get("MEMSTREAM_TEST_LLM_PREFLIGHT", "1").strip() == "0":
        return
    try:
        check_chat(URL, MODEL, timeout_s=PREFLIGHT_TIMEOUT_S)
    except ServerDown as exc:
        fate = _fate(die_within_s=5.0)  # a crash drops the connection before the process is reaped
        pytest.fail(f"{exc}" + (f"; the model server {fate}" if fate else ""), pytrace=False)


@pytest.fixture
def model_server(model_answers: None) -> Iterator[None]:
    """Fails the test when the model server is dead before or after it."""
    _fail_if_dead("before this test")
    yield
    _fail_if_dead("during this test")
