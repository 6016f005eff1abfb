"""Write (or check) the committed event JSON Schemas: ``python -m memstream.schemas_gen``.

Usage, from the repository root::

    python -m memstream.schemas_gen            # regenerate schemas/
    python -m memstream.schemas_gen --check    # exit 1 if schemas/ drifted from the models
    python -m memstream.schemas_gen DIR        # another directory

The generator itself is pure (:func:`memstream.domain.schemas.generate_schemas`); this
module is the small I/O shell around it, kept out of ``domain/`` on purpose. Writing
also removes schema files of event versions the models no longer produce, so the
directory always equals the generator's output.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from memstream.domain.schemas import INDEX_FILENAME, generate_schemas

__all__ = ["Drift", "find_drift", "write_schemas", "main"]

DEFAULT_DIR = Path("schemas")
_GENERATED_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]*\.v[0-9]+\.json$")


def _is_generated_name(name: str) -> bool:
    return name == INDEX_FILENAME or bool(_GENERATED_NAME.match(name))


@dataclass(frozen=True)
class Drift:
    """How a schema directory differs from the generator's output."""

    missing: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.missing or self.changed or self.stale)

    def describe(self) -> str:
        parts = []
        for label, names in (("missing", self.missing), ("out of date", self.changed), ("stale", self.stale)):
            if names:
                parts.append(f"{label}: {', '.join(names)}")
        return "; ".join(parts) or "up to date"


def find_drift(directory: Path, expected: dict[str, str] | None = None) -> Drift:
    """Compare ``directory`` with the generated schemas (byte for byte, as UTF-8)."""
    expected = generate_schemas() if expected is None else expected
    present = (
        {p.name for p in directory.iterdir() if p.is_file() and _is_generated_name(p.name)}
        if directory.is_dir()
        else set()
    )
    drift = Drift()
    for name, text in expected.items():
        path = directory / name
        if name not in present:
            drift.missing.append(name)
        elif path.read_bytes() != text.encode("utf-8"):
            drift.changed.append(name)
    drift.stale.extend(sorted(present - set(expected)))
    return drift


def write_schemas(directory: Path) -> Drift:
    """Make ``directory`` equal the generated schemas; returns what had to change."""
    expected = generate_schemas()
    drift = find_drift(directory, expected)
    directory.mkdir(parents=True, exist_ok=True)
    for name in drift.missing + drift.changed:
        # newline="" keeps "\n" on every platform: the files are compared byte for byte.
        with open(directory / name, "w", encoding="utf-8", newline="") as fh:
            fh.write(expected[name])
    for name in drift.stale:
        (directory / name).unlink()
    return drift


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memstream.schemas_gen",
        description="Generate the event JSON Schemas from memstream's models.",
    )
    parser.add_argument("directory", nargs="?", type=Path, default=DEFAULT_DIR)
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if the directory drifted"
    )
    args = parser.parse_args(argv)
    directory: Path = args.directory
    if args.check:
        drift = find_drift(directory)
        if drift:
            print(
                f"{directory}: schemas drifted from the models ({drift.describe()}); "
                "run `python -m memstream.schemas_gen` and commit the result",
                file=sys.stderr,
            )
            return 1
        print(f"{directory}: schemas match the models")
        return 0
    drift = write_schemas(directory)
    print(f"{directory}: {drift.describe() if drift else 'already up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
