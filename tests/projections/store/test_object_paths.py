"""Storage paths: a local root stays a ``Path``; an ``s3://`` root is an
:class:`ObjectPath` whose reads, atomic writes, listings and conditional writes run
against a real S3-compatible server (SeaweedFS, ``scripts/s3-tests``), and
``table_sets`` on an object-store root."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.s3_support import s3_only, s3_prefix, s3_root  # noqa: F401 - fixtures

from memstream.projections.store.object_paths import (
    ObjectPath,
    PreconditionFailed,
    as_path,
    lance_options,
    remove_tree,
    write_atomically,
)
from memstream.projections.store.shards import init_layout, is_sharded, shard_count, shard_dir
from memstream.projections.store.table_sets import TableSets
from memstream.settings.model import ObjectRoot


def test_a_local_root_is_a_plain_path_with_no_storage_options(tmp_path: Path) -> None:
    root = as_path(str(tmp_path / "lance"))
    assert root == tmp_path / "lance" and isinstance(root, Path)
    assert lance_options(root) is None
    write_atomically(tmp_path / "CURRENT", "one")
    write_atomically(tmp_path / "CURRENT", "two")
    assert (tmp_path / "CURRENT").read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["CURRENT"]  # no temporary file left
    (tmp_path / "d" / "e").mkdir(parents=True)
    remove_tree(tmp_path / "d")
    assert not (tmp_path / "d").exists()


def test_an_object_root_is_bucket_and_key_with_path_arithmetic() -> None:
    root = as_path(ObjectRoot("s3://bkt/a/b", {"aws_region": "r"}))
    assert isinstance(root, ObjectPath)
    assert (root.bucket, root.key) == ("bkt", "a/b")
    shard = shard_dir(root, 3)
    assert str(shard) == "s3://bkt/a/b/shards/3" and shard.name == "3"
    assert shard.parent.parent == root and shard.with_name("4") == shard_dir(root, 4)
    assert lance_options(shard) == {"aws_region": "r"}
    assert as_path(shard) is shard and sorted([shard_dir(root, 2), shard]) == [shard_dir(root, 2), shard]


@s3_only
def test_objects_are_read_written_listed_and_removed(s3_root: ObjectPath) -> None:
    f = s3_root / "dir" / "file.txt"
    assert not f.exists() and not s3_root.is_dir()
    with pytest.raises(FileNotFoundError):
        f.read_text()
    write_atomically(f, "hello")
    (s3_root / "dir" / "sub" / "x.lance" / "data").write_text("x")
    assert f.is_file() and f.read_text() == "hello"
    assert (s3_root / "dir").is_dir() and not (s3_root / "dir").is_file()
    assert sorted(p.name for p in (s3_root / "dir").iterdir()) == ["file.txt", "sub"]
    assert [p.name for p in (s3_root / "dir" / "sub").glob("*.lance")] == ["x.lance"]
    remove_tree(s3_root / "dir")
    assert not (s3_root / "dir").exists()


@s3_only
def test_conditional_writes_let_exactly_one_writer_win(s3_root: ObjectPath) -> None:
    lease = s3_root / "lease"
    first = lease.put_if(b"a", etag=None)
    with pytest.raises(PreconditionFailed):
        lease.put_if(b"b", etag=None)  # it exists now
    second = lease.put_if(b"c", etag=first)
    with pytest.raises(PreconditionFailed):
        lease.put_if(b"d", etag=first)  # changed since `first`
    assert lease.read_bytes_and_etag() == (b"c", second)


@s3_only
def test_table_sets_and_the_shard_layout_live_on_the_object_store(s3_root: ObjectPath) -> None:
    sets = TableSets(s3_root)
    assert sets.current() == s3_root and not sets.has_projection()
    built = sets.new_set("first")
    init_layout(built, 4)
    assert is_sharded(built) and shard_count(built) == 4
    sets.point_to("first")
    assert sets.current() == built and sets.has_projection()
    (sets.new_set("second") / "shards" / "PARTITIONS").write_text("4\n")
    sets.point_to("second")
    (sets.path_of("stale") / "memories.lance" / "x").write_text("x")
    assert sets.cleanup() == ["stale"]  # current and previous stay
    request = sets.request_swap("second")
    assert sets.swap_request() == request
    sets.pause(request)
    assert sets.paused_for() == request.id
    sets.withdraw(request)
    assert sets.swap_request() is None and sets.paused_for() is None
