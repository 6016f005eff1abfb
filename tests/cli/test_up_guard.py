"""What ``memstream up`` checks before it claims, on the real broker: one ``up`` per
home (the second names the first's pid and ports), the broker's cluster id, and
topics that another home serves refused unless shared."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from memstream.cli._errors import CLIError
from memstream.cli.up_guard import claim_topics, cluster_id, hold_home
from memstream.settings.model import Settings

pytestmark = [pytest.mark.kafka]


def _settings(kafka_bootstrap: str, home: Path, prefix: str) -> Settings:
    return Settings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, home=home, api_port=18123)


def test_a_second_up_in_the_same_home_is_refused_at_once(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", api_port=18123, bootstrap_servers="127.0.0.1:19999")
    held = hold_home(settings)
    try:
        with pytest.raises(CLIError) as refused:
            hold_home(settings)
        text = str(refused.value)
        assert f"pid {os.getpid()}" in text and "API port 18123" in text and "127.0.0.1:19999" in text
        assert hold_home(Settings(home=tmp_path / "other")).release() is None  # another home is free
    finally:
        held.release()
    hold_home(settings).release()  # free again once the first ended


def test_topics_of_another_home_are_refused_unless_shared(kafka_bootstrap: str, tmp_path: Path) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}."
    first = _settings(kafka_bootstrap, tmp_path / "first", prefix)
    second = _settings(kafka_bootstrap, tmp_path / "second", prefix)
    assert "served from this home" in claim_topics(first, share=False)
    assert "belong to this home" in claim_topics(first, share=False)
    with pytest.raises(CLIError) as refused:
        claim_topics(second, share=False)
    assert str(first.home) in str(refused.value) and "--share-broker" in str(refused.value)
    assert "shared as asked" in claim_topics(second, share=True)
    assert "served from this home" in claim_topics(_settings(kafka_bootstrap, tmp_path / "third", f"t{uuid.uuid4().hex[:10]}."), share=False)


def test_the_cluster_is_named(kafka_bootstrap: str, tmp_path: Path) -> None:
    named = cluster_id(_settings(kafka_bootstrap, tmp_path, "x."))
    assert named != "unknown" and len(named) >= 8
    assert cluster_id(_settings("127.0.0.1:1", tmp_path, "x.")) == "unknown"
