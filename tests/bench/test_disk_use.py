"""Disk use per shard, as ``memstream bench chaos --sharded`` reports it (real files
under ``tmp_path``)."""

from __future__ import annotations

from pathlib import Path

import lance
import pyarrow as pa

from memstream.bench.disk_use import dir_bytes, disk_ratios, drop_replaced_versions, set_bytes
from memstream.projections.store.shards import init_layout, shard_dir


def test_a_sharded_set_is_measured_per_shard_and_a_plain_one_whole(tmp_path: Path) -> None:
    sharded = tmp_path / "sharded"
    init_layout(sharded, 3)
    for p, size in ((0, 100), (2, 30)):
        (shard_dir(sharded, p) / "memories.lance").mkdir(parents=True)
        (shard_dir(sharded, p) / "memories.lance" / "data").write_bytes(b"x" * size)
    assert set_bytes(sharded) == {"0": 100, "1": 0, "2": 30}

    plain = tmp_path / "plain"
    (plain / "a" / "b").mkdir(parents=True)
    (plain / "a" / "b" / "f").write_bytes(b"y" * 7)
    (plain / "g").write_bytes(b"z" * 5)
    assert set_bytes(plain) == {"set": 12} and dir_bytes(plain) == 12
    assert dir_bytes(tmp_path / "missing") == 0


def test_ratios_per_shard_in_all_and_the_worst() -> None:
    ratios = disk_ratios({"0": 300, "1": 100, "2": 50}, {"0": 100, "1": 100, "2": 0})
    assert ratios == {"per_shard": {"0": 3.0, "1": 1.0, "2": None}, "total": 2.25, "worst": 3.0}
    assert disk_ratios({"0": 1}, {"0": 0}) == {"per_shard": {"0": None}, "total": None, "worst": None}


def test_a_built_set_without_its_replaced_versions_keeps_only_the_newest(tmp_path: Path) -> None:
    table = shard_dir(tmp_path / "built", 0) / "memories.lance"
    for i in range(5):
        lance.write_dataset(pa.table({"x": list(range(100 * i, 100 * i + 100))}), str(table), mode="overwrite")
    before = dir_bytes(tmp_path / "built")
    drop_replaced_versions(tmp_path / "built")
    ds = lance.dataset(str(table))
    assert [v["version"] for v in ds.versions()] == [5]
    assert ds.to_table().column("x").to_pylist() == list(range(400, 500))
    assert dir_bytes(tmp_path / "built") < before / 2
