"""``memstream bench mem0``: memstream and Mem0 side by side on LoCoMo, in one run.

Why: "how does it compare with Mem0?" is the first question a user asks. Both systems
get the same conversations, the same questions, the same memory text and *the same
vectors*, so the comparison measures the systems, not the models:

* the benchmark starts an OpenAI-compatible embedding server
  (:class:`~memstream.bench.openai_fake.OpenAICompatServer`) serving one embedder (the
  configured one by default, all-MiniLM-L6-v2 on onnxruntime; ``--embedder local`` for
  the lexical hashing embedder);
  memstream's worker (``MEMSTREAM_EMBEDDINGS_PROVIDER=openai``) and Mem0 (``embedder.provider =
  openai``) are both pointed at it;
* memstream ingests through its real path (Kafka, the worker's no-LLM extractor, the
  projector; see :mod:`memstream.bench.locomo`): one memory per turn, ``"<speaker>:
  <text>"``;
* Mem0 (the open-source ``mem0ai`` library, ``Memory.add(..., infer=False)``) stores
  one memory per turn with the same text, the turn's ``dia_id`` in its metadata, the
  conversation as its ``user_id``, in its local Qdrant store (``path=`` on disk, no
  server) with its SQLite history; ``infer=False`` means no LLM call. Searches use
  ``threshold=0`` so Mem0 always returns ``k`` results (its default 0.1 would cut
  low-similarity hits and lower its recall).

Reported for both: evidence recall@5/10/20 and hit@k per category (scoring as in the
LoCoMo benchmark), ingest seconds, search p50/p95, and the ratios memstream/Mem0.
What Mem0 switches off without a network (it logs it: spaCy lemmatisation and entity
extraction, fastembed BM25) is captured and reported under ``mem0_offline_notes``.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memstream.bench._common import (
    console,
    err_console,
    progress_bar,
    table,
)
from memstream.bench.locomo import (
    CATEGORY_NAMES,
    SCORED_CATEGORIES,
    Conversation,
    Evaluation,
    bench_settings,
    cleanup_run,
    evaluate,
    ingest,
    load_locomo,
    scope_of,
)
from memstream.bench.openai_fake import OpenAICompatServer
from memstream.projections.embedders import build_embedder
from memstream.projections.search import SearchCache, search
from memstream.projections.store import LanceStore
from memstream.settings import EmbeddingSettings, Settings

__all__ = ["mem0_config", "Mem0Notes", "Mem0Runner", "run"]


def mem0_config(workdir: Path, base_url: str, model: str, dim: int) -> dict[str, Any]:
    """Mem0 fully offline: local Qdrant on disk, SQLite history, embeddings from the
    benchmark's server. The LLM entry only satisfies Mem0's config (``infer=False``
    never calls it; the server would answer 500 if it did)."""
    return {
        "vector_store": {
            "provider": "qdrant",
            "config": {
                "collection_name": "locomo",
                "path": str(workdir / "qdrant"),
                "embedding_model_dims": dim,
                "on_disk": True,
            },
        },
        "embedder": {
            "provider": "openai",
            "config": {"model": model, "api_key": "unused", "openai_base_url": base_url},
        },
        "llm": {
            "provider": "openai",
            "config": {"model": "no-llm", "api_key": "unused", "openai_base_url": base_url},
        },
        "history_db_path": str(workdir / "history.db"),
    }


class Mem0Notes(logging.Handler):
    """Collects Mem0's warnings (what it turned off), each distinct message once."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = " ".join(record.getMessage().split())
        if text not in self.messages:
            self.messages.append(text)


@dataclass(frozen=True)
class _Hit:
    """A Mem0 result shaped like a memstream one for the shared scoring."""

    source_message_ids: tuple[str, ...]


class Mem0Runner:
    """Mem0's ``Memory`` configured by :func:`mem0_config`."""

    def __init__(self, workdir: Path, base_url: str, model: str, dim: int) -> None:
        os.environ["MEM0_DIR"] = str(workdir / "mem0-home")
        os.environ["MEM0_TELEMETRY"] = "false"
        try:
            from mem0 import Memory
        except ImportError as exc:
            raise RuntimeError(
                "Mem0 is not installed: pip install 'memstream[mem0]' (PyPI package mem0ai)"
            ) from exc
        self.memory = Memory.from_config(mem0_config(workdir, base_url, model, dim))

    def add_turns(self, conversations: Sequence[Conversation]) -> float:
        total = sum(len(c.turns) for c in conversations)
        start = time.perf_counter()
        with progress_bar() as bar:
            task = bar.add_task("mem0 add (infer=False)", total=total)
            for conv in conversations:
                user = scope_of(conv).user_id
                for t in conv.turns:
                    self.memory.add(
                        [{"role": "user", "content": f"{t.speaker}: {t.text}", "name": t.speaker}],
                        user_id=user,
                        metadata={"dia_id": t.dia_id, "session": t.session},
                        infer=False,
                    )
                    bar.advance(task)
        return time.perf_counter() - start

    def search(self, _store: Any, _emb: Any, scope: Any, query: str, k: int) -> list[_Hit]:
        found = self.memory.search(query, top_k=k, filters={"user_id": scope.user_id}, threshold=0.0)
        return [_Hit((str((r.get("metadata") or {}).get("dia_id", "")),)) for r in found.get("results", [])]


def _embedder(name: str) -> Any:
    return build_embedder(EmbeddingSettings(provider=name))


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def run(data: Path, embedder: str | None = None, k: tuple[int, ...] = (5, 10, 20)) -> dict[str, Any]:
    """Run both systems (see the module docstring) with ``embedder`` (default: the
    configured one); returns the JSON summary."""
    cutoffs = tuple(sorted(set(k) | {10}))
    conversations = load_locomo(Path(data))
    model = _embedder(embedder or Settings().embeddings.provider)
    workdir = Path(tempfile.mkdtemp(prefix="memstream-bench-mem0-"))
    notes = Mem0Notes()
    logging.getLogger("mem0").addHandler(notes)
    logging.getLogger("mem0").setLevel(logging.WARNING)
    server = OpenAICompatServer(model).start()
    base = Settings().model_copy(
        update={
            "embedding_base_url": server.base_url,
            "embedding_model": model.model_id,
            "embedding_dim": model.dim,
            "embedding_api_key": "unused",
        }
    )
    settings = bench_settings(base, workdir, embedder="openai", tag="mem0")
    console.print(
        f"memstream vs Mem0 on {len(conversations)} conversations, "
        f"{sum(len(c.turns) for c in conversations)} turns; both embed with {model.model_id} "
        f"served at {server.base_url}"
    )
    try:
        before = _embedding_work(server)
        report = ingest(settings, conversations, workdir)
        ms_work = _embedding_work(server, since=before)

        store = LanceStore.from_settings(settings.storage, settings.embeddings.dim)
        store.optimize()
        query_embedder = build_embedder(settings.embeddings)
        ms_eval = evaluate(
            store, query_embedder, conversations, cutoffs,
            {"memstream": lambda st, e, sc, q, kk, cache=SearchCache(): search(st, e, sc, q, kk, cache=cache)},
        )
        mem0 = Mem0Runner(workdir, server.base_url, model.model_id, model.dim)
        before = _embedding_work(server)
        mem0_ingest_s = mem0.add_turns(conversations)
        m0_work = _embedding_work(server, since=before)
        m0_eval = evaluate(store, query_embedder, conversations, cutoffs, {"mem0": mem0.search})
    finally:
        server.stop()
        logging.getLogger("mem0").removeHandler(notes)
        cleanup_run(settings, workdir, keep=False)
    summary = _report(ms_eval, m0_eval, cutoffs, report.ingest_s, mem0_ingest_s, model.model_id, notes.messages)
    summary["ingest_embedding"] = {"memstream": ms_work, "mem0": m0_work}
    for system, work in summary["ingest_embedding"].items():
        console.print(
            f"{system} ingest: the server embedded {work['texts']} texts "
            f"in {work['requests']} requests, {work['seconds']} s computing"
        )
    return summary


def _embedding_work(server: OpenAICompatServer, since: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the shared server embedded (texts, requests, seconds computing), since ``since``:
    each system's embedding work at ingest, on the same model."""
    now = {
        "texts": server.embedded_texts,
        "requests": server.embeddings.count,
        "seconds": server.embed_seconds,
    }
    if since is None:
        return now
    return {k: round(now[k] - since[k], 2) if k == "seconds" else now[k] - since[k] for k in now}


def _report(
    ms: Evaluation,
    m0: Evaluation,
    cutoffs: tuple[int, ...],
    ms_ingest: float,
    m0_ingest: float,
    embedder: str,
    notes: list[str],
) -> dict[str, Any]:
    per = {**ms.board.summary(), **m0.board.summary()}
    groups = [*(str(c) for c in SCORED_CATEGORIES), "overall", "5"]
    for kk in cutoffs:
        rows = []
        for system in ("memstream", "mem0"):
            rows.append([system, *(per[system].get(g, {}).get(f"recall@{kk}") for g in groups)])
        cols = ["system", *(f"{c} {CATEGORY_NAMES[c]}" for c in SCORED_CATEGORIES), "overall 1-4", "5 adversarial"]
        console.print(table(f"evidence recall@{kk}", cols, rows))
    ms_lat, m0_lat = ms.latency["memstream"], m0.latency["mem0"]
    console.print(
        table(
            "cost",
            ["system", "ingest s", "search p50 ms", "search p95 ms"],
            [["memstream", ms_ingest, ms_lat.p50, ms_lat.p95], ["mem0", m0_ingest, m0_lat.p50, m0_lat.p95]],
        )
    )
    if notes:
        err_console.print("Mem0 offline notes:\n  " + "\n  ".join(notes))
    ms_r10 = per["memstream"]["overall"]["recall@10"]
    m0_r10 = per["mem0"]["overall"]["recall@10"]
    return {
        "embedder": embedder,
        "memstream_recall_at_10": ms_r10,
        "mem0_recall_at_10": m0_r10,
        "memstream_ingest_s": round(ms_ingest, 2),
        "mem0_ingest_s": round(m0_ingest, 2),
        "memstream_search_p50_ms": round(ms_lat.p50, 2),
        "mem0_search_p50_ms": round(m0_lat.p50, 2),
        "memstream_search_p95_ms": round(ms_lat.p95, 2),
        "mem0_search_p95_ms": round(m0_lat.p95, 2),
        "recall_at_10_margin": round(ms_r10 - m0_r10, 4),
        "ratios": {
            "recall_at_10": _ratio(ms_r10, m0_r10),
            "ingest_s": _ratio(ms_ingest, m0_ingest),
            "ingest_speedup": _ratio(m0_ingest, ms_ingest),
            "search_p50": _ratio(ms_lat.p50, m0_lat.p50),
        },
        "per_category": per,
        "k": list(cutoffs),
        "mem0_offline_notes": notes,
    }
