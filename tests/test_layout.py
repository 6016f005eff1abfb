"""Tests mirror the package: every module has a test file of its own
(``tests/<folder>/test_<module>.py``, ``memstream/<sub>/`` mirrored as ``tests/<sub>/``)
or is named by a test file of that folder in a line starting ``Covers``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("domain", "streams", "projections", "memstream")
NOT_CODE = {"__init__.py", "__main__.py"}


def _modules() -> list[Path]:
    found: list[Path] = []
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name not in NOT_CODE and "models" not in path.relative_to(ROOT).parts[1:-1]:
                found.append(path.relative_to(ROOT))
    return found


def _mirror(module: Path) -> Path:
    parts = module.parts[1:-1] if module.parts[0] == "memstream" else module.parts[:-1]
    return Path("tests", *parts)


def _covers_lines(folder: Path) -> str:
    text = []
    for test in (ROOT / folder).glob("test_*.py") if (ROOT / folder).is_dir() else ():
        text += [line for line in test.read_text(encoding="utf-8").splitlines() if line.lstrip().startswith("Covers")]
    return "\n".join(text)


def _uncovered() -> list[str]:
    missing = []
    for module in _modules():
        folder, name = _mirror(module), module.stem
        if (ROOT / folder / f"test_{name.lstrip('_')}.py").exists():
            continue
        if re.search(rf"``{re.escape(name)}``", _covers_lines(folder)):
            continue
        missing.append(f"{module} (no {folder}/test_{name}.py and no 'Covers ``{name}``' line in {folder})")
    return missing


def test_every_module_has_its_tests() -> None:
    assert _uncovered() == []


def test_the_rule_sees_a_module_without_tests(tmp_path: Path) -> None:
    assert _mirror(Path("memstream/services/extractor.py")) == Path("tests/services")
    assert _mirror(Path("memstream/settings.py")) == Path("tests")
    assert _mirror(Path("domain/extraction/window.py")) == Path("tests/domain/extraction")
