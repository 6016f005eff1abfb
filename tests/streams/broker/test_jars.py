"""The jar cache: trusted only when complete, in the configured directory."""

from __future__ import annotations

import json
from pathlib import Path

from memstream.streams.broker import jars
from tests.streams.broker.helpers import broker_settings


def test_jar_cache_is_trusted_only_with_a_complete_marker(tmp_path: Path) -> None:
    libs = tmp_path / "kafka-9.9.9" / "libs"
    libs.mkdir(parents=True)
    for name in ("kafka_2.13-9.9.9.jar", "kafka-clients-9.9.9.jar"):
        (libs / name).write_bytes(b"jar")
    assert not jars.jar_cache_complete(libs)  # no marker: an interrupted download

    marker = libs.parent / "complete.json"
    marker.write_text(json.dumps({"version": "9.9.9", "jars": sorted(p.name for p in libs.iterdir())}))
    assert jars.jar_cache_complete(libs)

    (libs / "kafka-clients-9.9.9.jar").unlink()
    assert not jars.jar_cache_complete(libs)
    marker.write_text("{not json")
    assert not jars.jar_cache_complete(libs)


def test_jar_dir_lives_in_the_configured_cache(tmp_path: Path) -> None:
    settings = broker_settings(tmp_path, kafka_cache_dir=tmp_path / "cache", kafka_version="4.1.1")
    assert jars.jar_dir(settings.resolved_kafka_cache_dir, settings.broker.kafka_version) == (tmp_path / "cache" / "kafka-4.1.1" / "libs").resolve()
