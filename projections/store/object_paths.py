"""Paths under a storage root that may live on an object store (``s3://bucket/prefix``),
with the few ``pathlib`` operations the table sets, shards and leases use.

Why: the storage root holds more than LanceDB's tables: the ``CURRENT`` pointer, the
shard layout marker, replay requests and the write leases. LanceDB reaches S3 by
itself (``storage_options``); these small files go through one S3 client (boto3),
which also makes the conditional writes the lease needs (``If-None-Match``,
``If-Match``). A local root stays a plain :class:`pathlib.Path`, so nothing changes
for it: :func:`as_path` picks the kind.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import threading
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Union

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from memstream.settings import ObjectRoot

__all__ = ["ObjectPath", "RootPath", "as_path", "write_atomically", "remove_tree", "lance_options", "PreconditionFailed"]

_clients: dict[tuple[tuple[str, str], ...], Any] = {}
_clients_lock = threading.Lock()
_MISSING = {"NoSuchKey", "404", "NotFound"}


class PreconditionFailed(RuntimeError):
    """A conditional write lost: the object changed (or appeared) since it was read."""


def _client(options: Mapping[str, str]) -> Any:
    key = tuple(sorted(options.items()))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            endpoint = options.get("aws_endpoint")
            if endpoint and endpoint.startswith("http://") and options.get("allow_http") != "true":
                raise ValueError(f"storage endpoint {endpoint} is plain http: set MEMSTREAM_STORAGE_ALLOW_HTTP=true")
            client = _clients[key] = boto3.client(
                "s3",
                endpoint_url=endpoint,
                region_name=options.get("aws_region"),
                aws_access_key_id=options.get("aws_access_key_id"),
                aws_secret_access_key=options.get("aws_secret_access_key"),
                aws_session_token=options.get("aws_session_token"),
                config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 5, "mode": "standard"}),
            )
        return client


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class ObjectPath:
    """A key (or key prefix, the object store's "directory") under an S3 bucket."""

    def __init__(self, bucket: str, key: str, options: Mapping[str, str]) -> None:
        self.bucket = bucket
        self.key = key.strip("/")
        self.storage_options = dict(options)

    @classmethod
    def of(cls, root: ObjectRoot) -> "ObjectPath":
        bucket, _, key = root.uri[len("s3://"):].partition("/")
        return cls(bucket, key, root.storage_options)

    # --- path arithmetic ----------------------------------------------------------
    def __truediv__(self, part: str | os.PathLike[str]) -> "ObjectPath":
        return ObjectPath(self.bucket, f"{self.key}/{os.fspath(part)}".strip("/"), self.storage_options)

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> "ObjectPath":
        return ObjectPath(self.bucket, self.key.rpartition("/")[0], self.storage_options)

    def with_name(self, name: str) -> "ObjectPath":
        return self.parent / name

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}" if self.key else f"s3://{self.bucket}"

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and (self.bucket, self.key) == (other.bucket, other.key)

    def __hash__(self) -> int:
        return hash((self.bucket, self.key))

    def __lt__(self, other: "ObjectPath") -> bool:
        return (self.bucket, self.key) < (other.bucket, other.key)

    @property
    def client(self) -> Any:
        return _client(self.storage_options)

    # --- reads ----------------------------------------------------------------------
    def is_file(self) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self.key)
        except ClientError as exc:
            if _code(exc) in _MISSING:
                return False
            raise
        return True

    def _list(self, delimiter: bool, limit: int | None = None) -> Iterator[dict[str, Any]]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": f"{self.key}/" if self.key else ""}
        if delimiter:
            kwargs["Delimiter"] = "/"
        if limit:
            kwargs["PaginationConfig"] = {"MaxItems": limit}
        yield from self.client.get_paginator("list_objects_v2").paginate(**kwargs)

    def is_dir(self) -> bool:
        for page in self._list(delimiter=False, limit=1):
            if page.get("Contents") or page.get("CommonPrefixes"):
                return True
        return False

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def iterdir(self) -> Iterator["ObjectPath"]:
        start = len(self.key) + 1 if self.key else 0
        for page in self._list(delimiter=True):
            for prefix in page.get("CommonPrefixes", ()):
                yield self / prefix["Prefix"][start:].rstrip("/")
            for obj in page.get("Contents", ()):
                yield self / obj["Key"][start:]

    def glob(self, pattern: str) -> Iterator["ObjectPath"]:
        return (p for p in self.iterdir() if fnmatch.fnmatchcase(p.name, pattern))

    def read_bytes_and_etag(self) -> tuple[bytes, str] | None:
        """The object's bytes and ETag, or None when there is none."""
        try:
            got = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except ClientError as exc:
            if _code(exc) in _MISSING:
                return None
            raise
        return got["Body"].read(), str(got["ETag"])

    def read_text(self, encoding: str = "utf-8") -> str:
        got = self.read_bytes_and_etag()
        if got is None:
            raise FileNotFoundError(str(self))
        return got[0].decode(encoding)

    # --- writes ---------------------------------------------------------------------
    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to do: an object store's "directories" are key prefixes."""

    def write_text(self, text: str, encoding: str = "utf-8") -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.key, Body=text.encode(encoding))

    def put_if(self, body: bytes, *, etag: str | None) -> str:
        """Write only if the object is unchanged since it had ``etag`` (None: only if
        it does not exist). Returns the new ETag; :class:`PreconditionFailed` if not."""
        condition = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
        try:
            put = self.client.put_object(Bucket=self.bucket, Key=self.key, Body=body, **condition)
        except ClientError as exc:
            if _code(exc) in {"PreconditionFailed", "ConditionalRequestConflict", "412", "409", *_MISSING}:
                raise PreconditionFailed(f"{self} changed meanwhile") from None
            raise
        return str(put["ETag"])

    def unlink(self, missing_ok: bool = False) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.key)  # S3 deletes are idempotent

    def remove_tree(self) -> None:
        """Delete every object under this prefix (and the key itself)."""
        keys = [obj["Key"] for page in self._list(delimiter=False) for obj in page.get("Contents", ())]
        for start in range(0, len(keys), 1000):
            chunk = [{"Key": k} for k in keys[start : start + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})
        if self.key:
            self.unlink(missing_ok=True)


RootPath = Union[Path, ObjectPath]


def as_path(value: Any) -> RootPath:
    """A storage path: :class:`ObjectPath` for an object-store root, else a local Path."""
    if isinstance(value, ObjectPath):
        return value
    if isinstance(value, ObjectRoot):
        return ObjectPath.of(value)
    return Path(value)


def lance_options(path: RootPath) -> dict[str, str] | None:
    """LanceDB's ``storage_options`` for a path (None: a local directory)."""
    return dict(path.storage_options) if isinstance(path, ObjectPath) else None


def write_atomically(path: RootPath, text: str) -> None:
    """Replace the file's content at once: readers see the old text or the new one.
    An object PUT is atomic by itself; a local file is written beside and renamed."""
    if isinstance(path, ObjectPath):
        path.write_text(text)
        return
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a crash
    finally:
        os.close(fd)


def remove_tree(path: RootPath) -> None:
    if isinstance(path, ObjectPath):
        path.remove_tree()
    else:
        shutil.rmtree(path, ignore_errors=True)
