"""Neural sentence embeddings offline: ONNX models run by ``onnxruntime``, tokenised by
Hugging Face ``tokenizers``, with no PyTorch and nothing downloaded at run time.

Why this runtime: ``onnxruntime``'s CPU wheel (about 78 MB) and ``tokenizers`` (12 MB)
run a sentence-transformers model at a few milliseconds a text on two cores, where
PyTorch brings gigabytes. ``fastembed`` wraps the same two libraries but resolves
models through its hub registry (and brings Pillow and a download stack); a model
that ships in a registry package is simpler to run directly.

Which model file runs, and how it is checked, is :mod:`memstream.projections.embedders.onnx_models`
(the default: all-MiniLM-L6-v2 with int8 compute, built with memstream itself); the
embedder's ``model_id`` names the model and the file's digest, so a vector always says
which exact graph made it.

Texts are tokenised in one call (a text repeated in the call is embedded once),
sorted by length and run in batches of about the same padded size in tokens (many
short texts or a few long ones), each padded only to its longest text (padding is most
of the cost of mixed lengths); vectors are pooled over the real tokens and
L2-normalised (cosine = dot product). A call that fits one batch (a query, a single
text) runs on onnxruntime's threads as before; a call of several batches runs them side
by side on one-thread runs, one per core: a run's small matrices parallelise poorly,
so two one-thread runs do more a second than one run on two threads. A text's vector
does not depend on its batch or on the threads. Repeated queries are answered from a
small cache for a minute (:meth:`OnnxEmbedder.embed_query`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import numpy as np
from cachetools import TTLCache

from memstream.projections.embedders.onnx_models import OnnxModel, OnnxModelError, file_sha256

__all__ = ["OnnxEmbedder", "token_batches"]

_QUERY_CACHE_SIZE = 1024
_QUERY_CACHE_TTL_S = 60.0
_BATCH_TOKENS = 256
"""Padded tokens a model run (texts x the longest): runs of a few hundred token rows
cost the least CPU a text here, whatever the texts' lengths (docs/benchmarks-history.md,
embedding)."""


def _verified(path: Path, pinned: str | None, what: str) -> str:
    if not path.is_file():
        raise OnnxModelError(f"{what} {path} does not exist")
    actual = file_sha256(path)
    if pinned is not None and actual != pinned:
        raise OnnxModelError(f"{what} {path} has sha256 {actual}, not the pinned {pinned}: reinstall it")
    return actual


@lru_cache(maxsize=8)
def _load(model_file: str, tokenizer_file: str, max_tokens: int, threads: int) -> tuple[Any, Any]:
    """One inference session and tokenizer per model and process: sessions are
    thread-safe, and loading one costs a few hundred milliseconds."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if threads > 0:
        options.intra_op_num_threads = threads
    # no busy-waiting between runs: the worker's other threads (decode, LanceDB) need
    # the cores the model's threads would spin on
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model_file, sess_options=options, providers=["CPUExecutionProvider"])
    tokenizer = Tokenizer.from_file(tokenizer_file)
    tokenizer.no_padding()  # batches are padded here, each to its own longest text
    tokenizer.enable_truncation(max_length=max_tokens)
    return session, tokenizer


def token_batches(lengths: np.ndarray, order: np.ndarray, budget: int) -> list[np.ndarray]:
    """``order`` (row numbers by ascending length) cut into batches whose padded size,
    rows x the longest row, stays within ``budget`` tokens (a longer row runs alone)."""
    batches: list[np.ndarray] = []
    start = 0
    for end in range(1, len(order) + 1):
        if end == len(order) or (end + 1 - start) * int(lengths[order[end]]) > budget:
            batches.append(order[start:end])
            start = end
    return batches


@lru_cache(maxsize=4)
def _runner(parallel_runs: int) -> ThreadPoolExecutor:
    """The threads calls' batches run on, shared by a process's embedders so that their
    runs together stay at ``parallel_runs`` (model runs release the GIL)."""
    return ThreadPoolExecutor(parallel_runs, thread_name_prefix="onnx-embed")


class OnnxEmbedder:
    """Embeddings of an :class:`OnnxModel`; ``model_id`` is ``<name>:<first 12 hex
    digits of the model file's sha256>``."""

    def __init__(
        self, model: OnnxModel, *, batch_tokens: int | None = None, threads: int = 0, parallel_runs: int = 0
    ) -> None:
        """``batch_tokens``: padded tokens a model run (a longer text runs alone; default
        ``_BATCH_TOKENS``, or 1, every text alone, for a model that ``runs_alone``);
        ``threads``: threads of a call that fits one batch (0: onnxruntime's default,
        one per core); ``parallel_runs``: one-thread runs at once for a call of several
        batches (0: one per core this process may use; 1: one batch after another)."""
        if batch_tokens is None:
            batch_tokens = 1 if model.runs_alone else _BATCH_TOKENS
        if batch_tokens < 1:
            raise OnnxModelError("batch_tokens must be at least 1")
        digest = _verified(model.model_file, model.model_sha256, "model file")
        _verified(model.tokenizer_file, model.tokenizer_sha256, "tokenizer file")
        try:
            self._session, self._tokenizer = _load(
                str(model.model_file), str(model.tokenizer_file), model.max_tokens, threads
            )
        except Exception as exc:  # noqa: BLE001 - onnxruntime's errors have no common base
            raise OnnxModelError(f"cannot load {model.model_file}: {type(exc).__name__}: {exc}") from None
        self.model = model
        self.model_id = f"{model.name}:{digest[:12]}"
        self.batch_tokens = batch_tokens
        self.parallel_runs = parallel_runs or len(os.sched_getaffinity(0))
        self._load_args = (str(model.model_file), str(model.tokenizer_file), model.max_tokens)
        self._inputs = {i.name for i in self._session.get_inputs()}
        self._side_session: Any = None  # loaded by warm() or the first call of several batches
        self._cache: TTLCache[str, np.ndarray] = TTLCache(_QUERY_CACHE_SIZE, _QUERY_CACHE_TTL_S, timer=time.monotonic)
        self._cache_lock = threading.Lock()
        self.dim = int(self._run(["dimension probe"]).shape[1])

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return cast("list[list[float]]", self.embed_array(texts).tolist())

    def warm(self) -> None:
        """Load the one-thread session of side-by-side runs and run it once on every
        runner, so that a process about to embed batches (a worker, a model server) pays
        that at its start, not on its first call's clock (about 0.4-1.2 s here)."""
        if self.parallel_runs > 1:  # texts too long to share a batch: one run each
            self._run([f"{i} " + "warm " * (self.batch_tokens // 2) for i in range(self.parallel_runs)])

    def embed_array(self, texts: Sequence[str]) -> np.ndarray:
        """The vectors as one float32 ``(len(texts), dim)`` matrix, in input order."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._run(texts)

    def embed_query(self, text: str) -> np.ndarray:
        """One query's vector; the same query within a minute is not embedded again
        (an agent asks the same thing in bursts)."""
        with self._cache_lock:
            hit = self._cache.get(text)
        if hit is not None:
            return hit
        vector = self._run([text])[0]
        vector.setflags(write=False)
        with self._cache_lock:
            self._cache[text] = vector
        return vector

    def _run(self, texts: Sequence[str]) -> np.ndarray:
        unique = list(dict.fromkeys(texts))
        vectors = self._run_unique(unique)
        if len(unique) == len(texts):
            return vectors
        row_of = {text: row for row, text in enumerate(unique)}
        return vectors[[row_of[t] for t in texts]]

    def _run_unique(self, texts: list[str]) -> np.ndarray:
        encodings = self._tokenizer.encode_batch(texts)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.intp, count=len(encodings))
        order = np.argsort(lengths, kind="stable")
        batches = token_batches(lengths, order, self.batch_tokens)

        side_by_side = len(batches) > 1 and self.parallel_runs > 1
        # one thread a run when side by side (that session is shared by the process)
        session = self._side_by_side_session() if side_by_side else self._session

        def run(rows: np.ndarray) -> np.ndarray:
            return self._run_batch(session, [encodings[i] for i in rows], int(lengths[rows].max()))

        if side_by_side:
            pooled = list(_runner(self.parallel_runs).map(run, batches))
        else:
            pooled = [run(rows) for rows in batches]
        out = np.empty((len(texts), pooled[0].shape[1]), dtype=np.float32)
        for rows, vectors in zip(batches, pooled):
            out[rows] = vectors
        return out

    def _side_by_side_session(self) -> Any:
        if self._side_session is None:
            self._side_session = _load(*self._load_args, 1)[0]
        return self._side_session

    def _run_batch(self, session: Any, encodings: list[Any], width: int) -> np.ndarray:
        ids = np.zeros((len(encodings), width), dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            ids[row, : len(enc.ids)] = enc.ids
            mask[row, : len(enc.ids)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = session.run(None, {k: v for k, v in feeds.items() if k in self._inputs})[0]
        if hidden.ndim == 2:  # the export pools itself
            pooled = hidden.astype(np.float32)
        elif self.model.pooling == "cls":
            pooled = hidden[:, 0, :]
        else:
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)

    def __repr__(self) -> str:
        return f"OnnxEmbedder(model_id={self.model_id!r}, dim={self.dim})"
