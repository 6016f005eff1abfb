"""memstream's build: the package as pyproject.toml declares it, plus one step that
builds the default embedding model's int8 graph into the package data
(``projections/embedders/onnx_build.py`` holds the recipe; its inputs are pyproject.toml's
[build-system] requirements). A wheel gets the file in its build directory; an
editable install (PEP 660, ``editable_mode``) gets it in the source tree, gitignored."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _recipe():  # noqa: ANN202 - a module loaded by its path
    # memstream is not importable while it is being built: load the one file by path
    spec = importlib.util.spec_from_file_location("memstream_onnx_build", ROOT / "projections" / "embedders" / "onnx_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class build_py_with_model(build_py):
    """``build_py``, then the default model into ``memstream/projections/embedders/models/``."""

    def _models_dir(self) -> Path:
        if self.editable_mode:
            return ROOT / "projections" / "embedders" / "models"
        return Path(self.build_lib) / "memstream" / "projections" / "embedders" / "models"

    def run(self) -> None:
        super().run()
        target = _recipe().build_default_model(self._models_dir())
        self.announce(f"built {target}", level=2)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:  # type: ignore[override]
        model = _recipe().default_model_file(Path(self.build_lib) / "memstream" / "projections" / "embedders" / "models")
        return [*super().get_outputs(include_bytecode), str(model)]


setup(cmdclass={"build_py": build_py_with_model})
