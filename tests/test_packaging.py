"""Packaging: the wheel installs only the ``memstream`` namespace, and both ``pip install .``
and ``pip install -e .`` work in a fresh virtual environment and find the default
embedding model (built by ``setup.py``) with its pinned digest in the package.

The repository keeps the design card's top-level folders (``domain/``, ``streams/``...)
while the installed names all live under ``memstream``; a wrong ``package-dir`` mapping
would put a generic ``domain`` package into site-packages or silently leave a module out.

The fresh environments must not download anything, so they reuse the dependencies of
the interpreter running the tests: ``python -m venv --system-site-packages`` would only
see the *base* interpreter's packages when the tests already run in a venv, so instead
a ``.pth`` file puts a filtered view of the current site-packages (everything except
memstream itself) on the new environment's path, and pip installs with ``--no-deps
--no-build-isolation``.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
DIST_NAME = PYPROJECT["project"]["name"]
VERSION = PYPROJECT["project"]["version"]
PACKAGE_DIRS: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
GENERIC_NAMES = ("domain", "streams", "projections", "bench", "tests", "schemas")
TIMEOUT = 300


def _run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert proc.returncode == 0, f"{' '.join(map(str, args))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what the build reads, so building never writes into the working tree."""
    dest = tmp_path_factory.mktemp("src") / "memstream-src"
    dest.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "NOTICE"):
        if (REPO_ROOT / name).exists():
            shutil.copy2(REPO_ROOT / name, dest / name)
    for folder in sorted({Path(d).parts[0] for d in PACKAGE_DIRS.values()}):
        shutil.copytree(REPO_ROOT / folder, dest / folder, ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def wheel(source_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
        "--disable-pip-version-check", "-w", out, source_tree, cwd=out,
    )
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _wheel_path(repo_file: Path) -> str | None:
    """``domain/events.py`` -> ``memstream/domain/events.py`` (by the package-dir map)."""
    rel = repo_file.relative_to(REPO_ROOT).as_posix()
    best: tuple[str, str] | None = None
    for package, folder in PACKAGE_DIRS.items():
        if rel.startswith(folder.rstrip("/") + "/") and (best is None or len(folder) > len(best[1])):
            best = (package, folder)
    if best is None:
        return None
    package, folder = best
    return package.replace(".", "/") + "/" + rel[len(folder.rstrip("/")) + 1 :]


def test_wheel_top_level_is_only_memstream(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        top = {name.split("/", 1)[0] for name in names}
        dist_info = f"{DIST_NAME}-{VERSION}.dist-info"
        assert top == {"memstream", dist_info}, sorted(top)
        top_level_txt = f"{dist_info}/top_level.txt"
        if top_level_txt in names:
            assert zf.read(top_level_txt).decode().split() == ["memstream"]
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
        assert "memstream = memstream.cli:main" in entry_points
    for generic in GENERIC_NAMES:
        assert generic not in top


def test_wheel_holds_every_module_of_the_mapped_folders(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    expected = {
        "memstream/py.typed",
        "memstream/domain/py.typed",
        "memstream/domain/events/__init__.py",
        "memstream/codec/wire.py",
        "memstream/domain/schemas.py",
        "memstream/schemas_gen.py",
        "memstream/streams/topics.py",
        "memstream/projections/embedders/models/all-MiniLM-L6-v2-int8-dynamic/model.onnx",  # built by setup.py
    }
    for folder in sorted(set(PACKAGE_DIRS.values())):
        for path in (REPO_ROOT / folder).rglob("*.py"):
            if "__pycache__" not in path.parts:
                mapped = _wheel_path(path)
                if mapped is not None:
                    expected.add(mapped)
    missing = sorted(expected - names)
    assert not missing, f"modules missing from the wheel (add their package to pyproject): {missing}"


def _fresh_venv(root: Path) -> Path:
    """A new venv that sees the current dependencies but not memstream itself."""
    _run(sys.executable, "-m", "venv", "--without-pip", root, cwd=root.parent)
    python = root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    target = Path(
        _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=root).stdout.strip()
    )
    deps = root / "parent-deps"
    deps.mkdir()
    for parent in site.getsitepackages():
        for entry in Path(parent).iterdir():
            lowered = entry.name.lower()
            if (
                lowered.startswith(("memstream", "__editable__", "_memstream"))
                or lowered.endswith(".pth")
                or entry.name in GENERIC_NAMES
                or (deps / entry.name).exists()
            ):
                continue
            (deps / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    (target / "_parent_deps.pth").write_text(f"{deps}\n", encoding="utf-8")
    return python


def _check_installed(python: Path, cwd: Path, expect_under: Path) -> None:
    code = (
        "import importlib.util, memstream, memstream.domain.events, memstream.streams.topics\n"
        "from memstream.domain.events import parse_event\n"
        "from memstream.projections.embedders.onnx_build import BUILTIN_MODEL_SHA256, sha256_of\n"
        "from memstream.projections.embedders.onnx_models import default_model\n"
        "e = parse_event({'type': 'MemoryAdded', 'scope': {'team_id': 't'}, 'memory_id': 'm', 'content': 'c'})\n"
        "assert e.schema_version == 2\n"
        f"bad = [n for n in {GENERIC_NAMES!r} if importlib.util.find_spec(n) is not None]\n"
        "assert not bad, bad\n"
        "assert sha256_of(default_model().model_file) == BUILTIN_MODEL_SHA256\n"
        "print(default_model().model_file)\n"
        "print(memstream.__file__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = _run(python, "-c", code, cwd=cwd, env=env)
    *_, model, location = (Path(line).resolve() for line in proc.stdout.strip().splitlines())
    assert location.is_relative_to(expect_under.resolve()), f"memstream imported from {location}"
    assert model.is_relative_to(expect_under.resolve()), f"the default model found at {model}"


def test_pip_install_works_in_a_fresh_venv(source_tree: Path, tmp_path: Path) -> None:
    python = _fresh_venv(tmp_path / "venv")
    neutral = tmp_path / "elsewhere"
    neutral.mkdir()
    _run(
        python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
        "--disable-pip-version-check", source_tree, cwd=neutral,
    )
    _check_installed(python, neutral, expect_under=tmp_path / "venv")
    script = python.parent / ("memstream.exe" if os.name == "nt" else "memstream")
    assert script.exists(), "the memstream console script was not installed"


def test_editable_install_works_in_a_fresh_venv(source_tree: Path, tmp_path: Path) -> None:
    python = _fresh_venv(tmp_path / "venv")
    neutral = tmp_path / "elsewhere"
    neutral.mkdir()
    _run(
        python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
        "--disable-pip-version-check", "-e", source_tree, cwd=neutral,
    )
    _check_installed(python, neutral, expect_under=source_tree)
