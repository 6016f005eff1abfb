"""``StartStop``: ``async with`` starts a client and stops it, an exception included."""

from __future__ import annotations

import pytest

from memstream.streams.lifecycle import StartStop


class Recorder(StartStop):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def start(self) -> None:
        self.calls.append("start")

    async def stop(self) -> None:
        self.calls.append("stop")


async def test_a_block_starts_the_client_gives_it_and_stops_it() -> None:
    client = Recorder()
    async with client as entered:
        assert entered is client and client.calls == ["start"]
    assert client.calls == ["start", "stop"]


async def test_a_block_that_raises_still_stops_the_client_and_the_error_propagates() -> None:
    client = Recorder()
    with pytest.raises(KeyError):
        async with client:
            raise KeyError("boom")
    assert client.calls == ["start", "stop"]
