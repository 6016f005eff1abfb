"""``memstream bench ranking``: memstream's search against its own embedder alone and
BM25 alone, on four shapes of memory store in one run (:mod:`.ranking_shapes`).

Why: a ranking fitted on one shape (LoCoMo stored as raw turns) can fall below its own
embedder on the shapes a memory service mostly holds: atomic facts, written by
extraction or by clients, beside some turns. This benchmark holds the ranking to a
floor on each shape.

What runs: every shape's turns and memories go to private topics on the configured
broker; a real worker extracts the turns with the no-LLM extractor and projects
everything (memories are embedded by the projector, as those written through
``POST /v1/memories`` are). Then every question of every shape is searched by:

- ``memstream``: :func:`memstream.projections.search.hybrid.search`;
- ``embedder``: plain cosine between the question and every memory text of the space,
  both embedded by ``build_embedder(Settings().embeddings)`` in this process (the same model);
- ``bm25``: LanceDB full text alone (``text_search``).

Scoring: recall@k is the share of a question's wanted ids (evidence turns, or the
fact's id) among what its first k results bring (:meth:`Shape.found`). Reported per
shape (and per LoCoMo category for the LoCoMo shapes; "overall" is categories 1-4, as
in ``bench locomo``): recall@1/@5/@10 and search p50 per system, in one JSON line.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memstream.bench import locomo
from memstream.bench._common import LatencyLog, console, table
from memstream.bench.ranking_shapes import PERSON_SEED, SHAPES, Query, Shape, build_shapes
from memstream.domain.events import Scope
from memstream.domain.ranking import RankingWeights
from memstream.projections.search import hybrid as s
from memstream.projections.embedders import build_embedder
from memstream.projections.schema import MEMORIES
from memstream.projections.store import LanceStore, space_where
from memstream.settings import Settings

__all__ = ["CUTOFFS", "Bench", "recall", "summarise", "run"]

CUTOFFS: tuple[int, ...] = (1, 5, 10)
SYSTEMS: tuple[str, ...] = ("memstream", "embedder", "bm25")


def recall(found: Sequence[Sequence[str]], wanted: Iterable[str], k: int) -> float:
    """Share of ``wanted`` among what the first ``k`` results bring."""
    want = set(wanted)
    if not want:
        raise ValueError("recall of a query without wanted ids is undefined")
    got = {x for f in found[:k] for x in f}
    return len(want & got) / len(want)


def summarise(shape: Shape, found: Sequence[Sequence[Sequence[str]]], picks: Iterable[int] | None = None) -> dict[str, Any]:
    """recall@k of a shape's queries (those at ``picks``, default all), overall and
    per LoCoMo category."""
    idx = list(range(len(shape.queries))) if picks is None else list(picks)
    sums: dict[tuple[str, int], float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for i in idx:
        q = shape.queries[i]
        labels = [str(q.category)] if shape.name.startswith("locomo") else []
        if not shape.name.startswith("locomo") or q.category in locomo.SCORED_CATEGORIES:
            labels.append("overall")
        for label in labels:
            counts[label] += 1
            for k in CUTOFFS:
                sums[(label, k)] += recall(found[i], q.wanted, k)
    out: dict[str, Any] = {}
    for label in sorted(counts, key=lambda x: (x == "overall", x)):
        out[label] = {f"recall@{k}": round(sums[(label, k)] / counts[label], 4) for k in CUTOFFS}
        out[label]["n"] = counts[label]
    return out


@dataclass
class Bench:
    """The shapes ingested into one store, searched by each system."""

    store: Any
    embedder: Any
    shapes: dict[str, Shape]
    cache: Any = None

    def __post_init__(self) -> None:
        self.cache = s.SearchCache()
        self._vectors: dict[Scope, tuple[list[str], np.ndarray, list[Sequence[str]]]] = {}

    def memstream(self, weights: RankingWeights | None = None) -> Callable[[Query, int], list[Any]]:
        return lambda q, k: s.search(self.store, self.embedder, q.scope, q.text, k, weights=weights, cache=self.cache)

    def bm25(self, q: Query, k: int) -> list[Any]:
        return s.text_search(self.store, self.embedder, q.scope, q.text, k)

    def embedder_alone(self, q: Query, k: int) -> list[Any]:
        """Plain cosine over the space's memory texts, embedded here."""
        ids, matrix, sources = self._space(q.scope)
        v = np.asarray(self.embedder.embed([q.text])[0], dtype=np.float32)
        v /= np.linalg.norm(v) or 1.0
        order = np.argsort(-(matrix @ v), kind="stable")[:k]
        return [_Hit(ids[i], sources[i]) for i in order]

    def _space(self, scope: Scope) -> tuple[list[str], np.ndarray, list[Sequence[str]]]:
        got = self._vectors.get(scope)
        if got is None:
            rows = (
                self.store.table(MEMORIES).search().where(space_where(scope))
                .select(["memory_id", "content", "source_message_ids"]).limit(None).to_arrow().to_pylist()
            )
            texts = [r["content"] for r in rows]
            m = np.asarray(self.embedder.embed(texts), dtype=np.float32)
            m /= np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
            got = self._vectors[scope] = ([r["memory_id"] for r in rows], m, [r["source_message_ids"] or () for r in rows])
        return got

    def found(self, shape: Shape, fn: Callable[[Query, int], list[Any]], latency: LatencyLog | None = None) -> list[list[Sequence[str]]]:
        """What each query's results bring, in order."""
        out = []
        for q in shape.queries:
            if latency is not None:
                with latency.measure():
                    results = fn(q, max(CUTOFFS))
            else:
                results = fn(q, max(CUTOFFS))
            out.append([shape.found(r) for r in results])
        return out

    def evaluate(self, weights: RankingWeights | None = None) -> dict[str, Any]:
        """Every shape, every system: recall and search p50."""
        out: dict[str, Any] = {}
        for name in SHAPES:
            shape = self.shapes[name]
            per: dict[str, Any] = {"queries": len(shape.queries), "unscored": shape.unscored}
            for system, fn in (("memstream", self.memstream(weights)), ("embedder", self.embedder_alone), ("bm25", self.bm25)):
                log = LatencyLog()
                per[system] = {**summarise(shape, self.found(shape, fn, log)), "p50_ms": round(log.p50, 2)}
            out[name] = per
        return out


@dataclass(frozen=True)
class _Hit:
    memory_id: str
    source_message_ids: Sequence[str]


def open_bench(data: Path, workdir: Path, embedder: str | None = None, seed: int = PERSON_SEED) -> Bench:
    """The shapes ingested into ``workdir`` (reused when a finished ingest of the same
    ``seed`` is there). ``seed`` draws the generated person shapes."""
    raw = json.loads(Path(data).read_text(encoding="utf-8"))
    shapes = build_shapes(locomo.load_locomo(Path(data)), raw, seed)
    marker = workdir / "ingested.json"
    if marker.exists():
        kept = json.loads(marker.read_text())
        if kept.pop("seed", PERSON_SEED) != seed:
            raise ValueError(f"{workdir} holds an ingest of another seed: use another --workdir")
        settings = Settings().model_copy(update={"storage.root": Path(kept["lance_dir"]), "embeddings.provider": kept["embedder"]})
    else:
        workdir.mkdir(parents=True, exist_ok=True)
        settings = locomo.bench_settings(Settings(), workdir, embedder=embedder or Settings().embeddings.provider, tag="ranking")
        events = [e for s in shapes.values() for e in s.events]
        try:
            report = locomo.ingest_events(settings, events, workdir)
        finally:
            locomo.cleanup_run(settings, workdir, keep=True)
        console.print(f"ingest: {len(events)} events -> {report.memories} memories in {report.ingest_s:.1f} s")
        marker.write_text(json.dumps({"lance_dir": str(settings.storage.root), "embedder": settings.embeddings.provider, "seed": seed}))
    store = LanceStore.from_settings(settings.storage, settings.embeddings.dim)
    return Bench(store, build_embedder(settings.embeddings), shapes)


def _print(result: Mapping[str, Any]) -> None:
    rows = []
    for name in SHAPES:
        for system in SYSTEMS:
            o = result[name][system]["overall"]
            rows.append([name, system, o["recall@1"], o["recall@5"], o["recall@10"], result[name][system]["p50_ms"]])
    console.print(table("ranking on four shapes", ["shape", "system", "r@1", "r@5", "r@10", "p50 ms"], rows))


def run(data: Path, embedder: str | None = None, workdir: Path | None = None, seed: int = PERSON_SEED) -> dict[str, Any]:
    """Ingest every shape (or reuse ``workdir``'s ingest), evaluate, return the summary
    (``seed``: of the generated person shapes)."""
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="memstream-bench-ranking-")) if workdir is None else Path(workdir)
    try:
        bench = open_bench(data, work, embedder, seed)
        result: dict[str, Any] = {"embedder": bench.embedder.model_id, "seed": seed, **bench.evaluate()}
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    _print(result)
    return result
