"""``memstream shards`` as a user runs it (``python -m memstream shards``): one JSON
object per shard or a table, ``--offline`` without Kafka, and one-line errors for an
unsharded set or an unreachable broker. Real broker, real LanceDB shards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.services.shards.test_status import sharded_set
from tests.services.shards.test_e2e import produce
from tests.support import free_port

from memstream.services.replay.rebuild import replay
from memstream.settings.model import Settings, child_env
from memstream.streams.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def shards(settings: Settings, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memstream", "shards", *args],
        env={**child_env(settings), "COLUMNS": "200"}, cwd=cwd, capture_output=True, text=True, timeout=180,
    )


async def test_shards_lists_every_shard_as_json_and_as_a_table(
    fresh_topics: Topics, settings_for, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    settings = settings_for(fresh_topics, sharded=True, embedder="local")
    spaces = await sharded_set(settings, 2)

    shown = shards(settings, tmp_path, "--json")
    assert shown.returncode == 0, shown.stderr
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [s["partition"] for s in lines] == list(range(fresh_topics.partitions))
    for s in lines:
        assert s["owner"] is None
        assert s["rows"]["memories"] == 2 * spaces.get(s["partition"], 0)
        assert s["lag"] == {fresh_topics.events: 0, fresh_topics.messages: 0}

    table = shards(settings, tmp_path)
    assert table.returncode == 0, table.stderr
    assert f"{fresh_topics.partitions} shard(s)" in table.stdout
    for column in ("shard", "owner", "lag", "memories"):
        assert column in table.stdout

    # Kafka unreachable: a one-line error naming --offline, which still works.
    gone = settings.model_copy(update={"bootstrap_servers": f"127.0.0.1:{free_port()}"})
    down = shards(gone, tmp_path, "--json")
    assert down.returncode != 0
    assert "--offline" in down.stderr and "Traceback" not in down.stderr + down.stdout
    offline = shards(gone, tmp_path, "--json", "--offline")
    assert offline.returncode == 0, offline.stderr
    assert [json.loads(line)["lag"] for line in offline.stdout.splitlines()] == [{}] * fresh_topics.partitions


async def test_shards_on_an_unsharded_set_is_a_one_line_error(
    fresh_topics: Topics, settings_for, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    settings = settings_for(fresh_topics, embedder="local")
    await produce(settings, 1)
    assert (await replay(settings)).swapped
    shown = shards(settings, tmp_path, "--offline")
    assert shown.returncode != 0
    err = shown.stderr.strip()
    assert "is not sharded" in err and "Traceback" not in err and len(err.splitlines()) == 1, err
