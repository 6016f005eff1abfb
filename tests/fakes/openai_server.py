"""The tests' door to the one fake memstream allows: a scripted OpenAI-compatible server.

The server itself is :mod:`memstream.bench.openai_fake` (the benchmarks need it too and
cannot import from ``tests/``, which is not in the wheel); see that module for the
endpoints and how replies are scripted. This module keeps the names the tests have
always used (``FakeOpenAI``, ``Reply``, ``hashed_embedding``) and adds the pytest
fixture, which cannot live in the package because the package does not depend on pytest.

Usage in a test module (the repo root is on pytest's pythonpath)::

    from tests.fakes.openai_server import FakeOpenAI, Reply, fake_llm  # noqa: F401 - the fixture

    def test_x(fake_llm: FakeOpenAI) -> None:
        fake_llm.chat.push_json({"scenes": []})
        settings = Settings(llm_base_url=fake_llm.base_url, ...)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeAlias

import pytest

from memstream.bench.openai_fake import OpenAICompatServer, Reply, Script, hashed_embedding

__all__ = ["Reply", "Script", "FakeOpenAI", "fake_llm", "hashed_embedding"]

FakeOpenAI: TypeAlias = OpenAICompatServer
"""The tests' name for :class:`~memstream.bench.openai_fake.OpenAICompatServer`."""


@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAI]:
    """A running :class:`FakeOpenAI` for one test (import this name into a test module
    to use it as a fixture)."""
    with FakeOpenAI() as server:
        yield server
