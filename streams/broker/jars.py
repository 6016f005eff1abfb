"""Kafka's jars, fetched once from Maven Central into a cache shared by every clone."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

from memstream.streams.broker.logs import last_lines
from memstream.streams.broker.paths import BrokerError

__all__ = ["PACKAGE", "jar_dir", "jar_cache_complete", "ensure_jars", "locked"]

FETCH_TIMEOUT_S = 900.0
"""Upper bound for the one-time ``mvn dependency:copy-dependencies`` run."""

PACKAGE = "memstream.streams.broker"
_MARKER = "complete.json"


def _version_dir(cache_dir: Path, version: str) -> Path:
    return cache_dir.expanduser().resolve() / f"kafka-{version}"


def jar_dir(cache_dir: Path, version: str) -> Path:
    """Where the jars of Kafka ``version`` live in ``cache_dir`` once fetched."""
    return _version_dir(cache_dir, version) / "libs"


def jar_cache_complete(libs: Path) -> bool:
    """True when ``libs`` holds every jar its completion marker lists. The marker is
    written only after Maven succeeded, so an interrupted download is never trusted."""
    marker = libs.parent / _MARKER
    try:
        listed = json.loads(marker.read_text())["jars"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(listed) and all((libs / name).is_file() for name in listed)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_jars(cache_dir: Path, version: str) -> Path:
    """Make sure the jars of Kafka ``version`` are in ``cache_dir`` and return their directory.

    The first call runs ``mvn dependency:copy-dependencies`` on the packaged pom into a
    temporary directory and renames it into place, then writes the completion marker;
    later calls only check the marker. Maven Central is the only source.
    """
    libs = jar_dir(cache_dir, version)
    if jar_cache_complete(libs):
        return libs
    version_dir = libs.parent
    with locked(version_dir.parent / f"kafka-{version}.lock"):
        if jar_cache_complete(libs):  # another process fetched them while we waited
            return libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise BrokerError(
                "Maven (mvn) is needed once to fetch Kafka's jars from Maven Central, "
                "but it is not on PATH; install Maven 3 and retry"
            )
        version_dir.mkdir(parents=True, exist_ok=True)
        staging = version_dir / f"libs.partial-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        jars = _fetch(version, mvn, version_dir, staging)
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
        marker = {"version": version, "jars": jars}
        tmp_marker = version_dir / f"{_MARKER}.tmp"
        tmp_marker.write_text(json.dumps(marker, indent=1))
        tmp_marker.replace(version_dir / _MARKER)
        return libs


def _fetch(version: str, mvn: str, version_dir: Path, staging: Path) -> list[str]:
    """Run Maven on the packaged pom into ``staging``; the jar names it fetched."""
    pom = version_dir / "pom.xml"
    pom.write_bytes(resources.files(PACKAGE).joinpath("pom.xml").read_bytes())
    command = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
        f"-Dkafka.version={version}",
    ]
    try:
        done = subprocess.run(
            command,
            cwd=version_dir,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=FETCH_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise BrokerError(
            f"fetching Kafka {version} with Maven took longer than "
            f"{FETCH_TIMEOUT_S:.0f} s"
        ) from exc
    jars = sorted(p.name for p in staging.glob("*.jar")) if staging.is_dir() else []
    if done.returncode != 0 or not any(n.startswith("kafka_2.13-") for n in jars):
        shutil.rmtree(staging, ignore_errors=True)
        output = last_lines((done.stdout or "") + (done.stderr or ""), 25)
        raise BrokerError(
            f"Maven could not fetch Kafka {version} "
            f"(exit code {done.returncode}); is Maven Central reachable?\n{output}"
        )
    return jars
