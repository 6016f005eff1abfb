"""The real S3-compatible server the ``s3`` tests use (``scripts/s3-tests`` starts
SeaweedFS and sets ``MEMSTREAM_TEST_S3_*``); without one they are skipped."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from memstream.projections.store.object_paths import ObjectPath, as_path
from memstream.settings.model import Settings, settings_env

ENDPOINT = os.environ.get("MEMSTREAM_TEST_S3_ENDPOINT", "")
BUCKET = os.environ.get("MEMSTREAM_TEST_S3_BUCKET", "memstream-test")

needs_s3 = [
    pytest.mark.s3,
    pytest.mark.skipif(
        not ENDPOINT,
        reason="no S3-compatible server: run scripts/s3-tests (starts SeaweedFS, sets MEMSTREAM_TEST_S3_ENDPOINT)",
    ),
]


def s3_only(test):  # type: ignore[no-untyped-def]
    """Mark one test as needing the S3 server (a module uses ``pytestmark = needs_s3``)."""
    for mark in needs_s3:
        test = mark(test)
    return test


def storage_settings(prefix: str) -> dict[str, object]:
    """Settings overrides that put the storage root under ``prefix`` of the test bucket."""
    return {
        "lance_dir": f"s3://{BUCKET}/{prefix}",
        "storage_endpoint": ENDPOINT,
        "storage_access_key_id": os.environ.get("MEMSTREAM_TEST_S3_ACCESS_KEY_ID"),
        "storage_secret_access_key": os.environ.get("MEMSTREAM_TEST_S3_SECRET_ACCESS_KEY"),
        "storage_allow_http": True,
    }


def storage_env(settings: Settings) -> dict[str, str]:
    """The ``MEMSTREAM_*`` variables naming ``settings``' storage root for a child process."""
    return {k: v for k, v in settings_env(settings).items() if k.startswith(("MEMSTREAM_STORAGE_", "MEMSTREAM_STORAGE_ROOT"))}


@pytest.fixture
def s3_prefix() -> Iterator[str]:
    """A fresh key prefix in the test bucket, deleted afterwards."""
    prefix = f"t-{uuid.uuid4().hex[:10]}"
    yield prefix
    root = as_path(Settings(**storage_settings(prefix)).storage.root)  # type: ignore[arg-type]
    assert isinstance(root, ObjectPath)
    root.remove_tree()


@pytest.fixture
def s3_root(s3_prefix: str) -> ObjectPath:
    root = as_path(Settings(**storage_settings(s3_prefix)).storage.root)  # type: ignore[arg-type]
    assert isinstance(root, ObjectPath)
    return root
