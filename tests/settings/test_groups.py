"""The storage group's root: a local path under MEMSTREAM_HOME as before, or an S3 URI
whose connection settings become LanceDB's ``storage_options``."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from memstream.settings.model import ObjectRoot, Settings, child_env, settings_env


def test_a_relative_root_stays_a_local_path_under_home(tmp_path: Path) -> None:
    s = Settings(home=tmp_path, storage={"root": "tables"})
    assert s.storage.root == tmp_path / "tables" and not s.on_object_store


def test_a_command_that_needs_local_files_gets_the_local_root_or_an_error_naming_the_bucket(tmp_path: Path) -> None:
    assert Settings(home=tmp_path, storage={"root": "tables"}).storage.local_root == tmp_path / "tables"
    with pytest.raises(ValueError, match="s3://bucket/prefix"):
        Settings(storage={"root": "s3://bucket/prefix"}).storage.local_root


def test_an_s3_root_carries_the_storage_options_lancedb_names() -> None:
    s = Settings(
        storage={"root": "s3://bucket/some/prefix/", "endpoint": "http://127.0.0.1:8333", "region": "eu-west-1",
                 "access_key_id": "id", "secret_access_key": "hush-hush-42", "allow_http": True},
    )
    assert isinstance(s.storage.root, ObjectRoot) and s.on_object_store
    assert str(s.storage.root) == "s3://bucket/some/prefix"
    assert dict(s.storage.root.storage_options) == {
        "aws_region": "eu-west-1",
        "aws_endpoint": "http://127.0.0.1:8333",
        "aws_access_key_id": "id",
        "aws_secret_access_key": "hush-hush-42",
        "allow_http": "true",
    }
    assert "hush-hush-42" not in repr(s) and "hush-hush-42" not in repr(s.storage.root)


def test_an_s3_root_without_credentials_leaves_them_to_the_usual_aws_sources() -> None:
    s = Settings(storage={"root": "s3://bucket"})
    assert isinstance(s.storage.root, ObjectRoot)
    assert dict(s.storage.root.storage_options) == {"aws_region": "us-east-1"}


@pytest.mark.parametrize(
    ("root", "message"),
    [("gs://bucket/p", "only local paths and s3://"), ("az://c/p", "only local paths and s3://"), ("s3:///p", "names no bucket")],
)
def test_other_object_stores_and_bucketless_uris_are_refused_in_one_line(root: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(storage={"root": root})


def test_a_child_process_gets_the_same_root_and_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    s = Settings(storage={"root": "s3://b/p", "endpoint": "http://h:1", "secret_access_key": "k", "allow_http": True})
    env = child_env(s, base={})
    assert env["MEMSTREAM_STORAGE_ROOT"] == "s3://b/p" and settings_env(s)["MEMSTREAM_STORAGE_SECRET_ACCESS_KEY"] == "k"
    monkeypatch.chdir(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    again = Settings()
    assert again.storage.root == s.storage.root
    assert dict(again.storage.root.storage_options) == dict(s.storage.root.storage_options)  # type: ignore[union-attr]
