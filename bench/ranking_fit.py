"""A harness to fit the ranking on the dev data: LoCoMo (ingested once, kept) and the
paraphrase set, with each query's candidate reads memoised so that only the ranking
re-runs per variant. A development tool (``python -m memstream.bench.ranking_fit``),
not a product path and not a benchmark: the figures it prints are recall only.

Memoised: the query's embedding and LanceDB's BM25 list (keyed by everything it is
asked with: text, filter, depth, columns; filtered searches only); the lists of an
unfiltered search come from the space's kept vectors and text index
(``search_vectors``, ``search_lexical``); the rest of a search's reads
(the candidates' sessions, entity statistics) are kept by the ``SearchCache`` the
harness holds, as a serving process does. A variant that changes what is read (a
deeper candidate list, a different text for either leg) reads it once and is then
memoised too.

The LoCoMo data is CC BY-NC: it is read from where the caller says and never copied;
the kept store lives in a temporary directory outside the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from memstream.bench import locomo, paraphrase
from memstream.domain.ranking import RankingWeights
from memstream.projections import search as s
from memstream.projections import search_queries
from memstream.projections.embedder import build_embedder
from memstream.projections.store import LanceStore
from memstream.settings import Settings

__all__ = ["MemoEmbedder", "memoised_lists", "LoCoMoDev", "ParaphraseDev", "main"]


class MemoEmbedder:
    """An embedder that embeds each text once (the wrapped one does the work)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self._seen: dict[str, list[float]] = {}

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if t not in self._seen]
        if missing:
            for text, vector in zip(missing, self.inner.embed(missing)):
                self._seen[text] = [float(x) for x in vector]
        return [self._seen[t] for t in texts]


@contextlib.contextmanager
def memoised_lists() -> Iterator[None]:
    """Within: LanceDB's BM25 list query answers repeated questions from memory (a
    filtered search's; an unfiltered one ranks the space's kept vectors and text index
    in-process: ``search_vectors``, ``search_lexical``)."""
    text_query = search_queries.text_query
    seen: dict[Any, Any] = {}

    async def text(table: Any, query: str, where: str, limit: int, columns: Sequence[str] = ()) -> Any:
        key = (id(table), query, where, limit, tuple(columns))
        if key not in seen:
            seen[key] = await text_query(table, query, where, limit, *([columns] if columns else []))
        return seen[key]

    search_queries.text_query = text  # type: ignore[assignment]
    try:
        yield
    finally:
        search_queries.text_query = text_query


class LoCoMoDev:
    """LoCoMo dev ingested once into ``workdir`` (reused when already there)."""

    def __init__(self, data: Path, workdir: Path, embedder: str) -> None:
        self.conversations = locomo.load_locomo(data)
        marker = workdir / "ingested.json"
        if marker.exists():
            settings = Settings(**{**Settings().model_dump(), **json.loads(marker.read_text())})
        else:
            workdir.mkdir(parents=True, exist_ok=True)
            settings = locomo.bench_settings(Settings(), workdir, embedder=embedder, tag="fit")
            try:
                locomo.ingest(settings, self.conversations, workdir)
            finally:
                locomo.cleanup_run(settings, workdir, keep=True)
            keep = {"lance_dir": str(settings.lance_dir), "embedder": embedder}
            marker.write_text(json.dumps(keep))
        self.store = LanceStore.from_settings(settings)
        self.embedder = MemoEmbedder(build_embedder(settings))
        self.cache = s.SearchCache()

    def score(self, weights: RankingWeights, candidates: int | None = None, k: int = 10) -> dict[str, float]:
        """recall@k per category (1-5) and overall (1-4) of memstream's search."""
        board = locomo.ScoreBoard((k,))
        for conv in self.conversations:
            scope = locomo.scope_of(conv)
            for item in conv.qa:
                valid, _ = locomo.resolve_evidence(item.evidence, conv.turn_ids)
                if not valid:
                    continue
                results = s.search(
                    self.store, self.embedder, scope, item.question, k,
                    weights=weights, candidates=candidates, cache=self.cache,
                )
                board.add("memstream", item.category, [r.source_message_ids for r in results], valid)
        summary = board.summary()["memstream"]
        return {label: round(summary[label][f"recall@{k}"], 4) for label in ("1", "2", "3", "4", "overall", "5")}


class ParaphraseDev:
    """The paraphrase set projected once into a temporary store."""

    def __init__(self, workdir: Path, embedder: str) -> None:
        self.facts = paraphrase.load_facts()
        self.embedder = MemoEmbedder(build_embedder(Settings(embedder=embedder)))
        self.store = LanceStore(workdir / "paraphrase-lance", embedding_dim=self.embedder.dim)
        if not self.store.count("memories"):
            paraphrase.project_facts(self.store, self.embedder, self.facts)
        self.cache = s.SearchCache()

    def score(self, weights: RankingWeights, candidates: int | None = None) -> dict[str, float]:
        ranked = [
            [r.memory_id for r in s.search(
                self.store, self.embedder, paraphrase.SCOPE, f.question, 5,
                weights=weights, candidates=candidates, cache=self.cache,
            )]
            for f in self.facts
        ]
        answers = [f.memory_id for f in self.facts]
        return {f"p@{k}": round(paraphrase.recall_at(ranked, answers, k), 4) for k in (1, 5)}


def variants(spec: Mapping[str, Sequence[Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """One variant per value of each field (the others at their defaults)."""
    yield "default", {}
    for name, values in spec.items():
        for value in values:
            yield f"{name}={value}", {name: value}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "memstream-ranking-fit")
    parser.add_argument("--embedder", default=Settings().embedder)
    parser.add_argument("--grid", default="{}", help='JSON: {"field": [values]}; "candidates" sets the depth')
    args = parser.parse_args(argv)
    grid: dict[str, list[Any]] = json.loads(args.grid)
    with memoised_lists():
        dev = LoCoMoDev(args.data, args.workdir, args.embedder)
        para = ParaphraseDev(args.workdir, args.embedder)
        base = RankingWeights()
        for label, change in variants(grid):
            depth = change.pop("candidates", None)
            weights = replace(base, **change)
            row = {"variant": label, **dev.score(weights, depth), **para.score(weights, depth)}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
