"""Fit the ranking on the four shapes of ``bench ranking``, honestly: a development
tool (``python -m memstream.bench.ranking_fit --data ... --workdir ...``), not a
benchmark. Its output is kept in ``bench/data/ranking_fit.json``.

Every variant of the grid (the full product of the values given) ranks every query
of every shape once, on one kept ingest; then:

- **leave one conversation out**: for each LoCoMo conversation, the variant best on
  the others (both LoCoMo shapes and the two person shapes) is scored on it;
- **leave one shape out**: for each shape, the variant best on the other three is
  scored on it;
- **rules**: each switch of the grid is flipped from the variant chosen on all data:
  a rule stays only if it helps on at least two shapes and costs none more than 0.01.

The objective is the mean over shapes of (recall@5 + recall@10) / 2, each shape
weighing the same. The LoCoMo data is CC BY-NC: read from where the caller says.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from memstream.bench.ranking import Bench, open_bench, recall
from memstream.bench.ranking_shapes import SHAPES
from memstream.domain.ranking import RankingWeights

__all__ = ["GRID", "variants", "objective", "main"]

GRID: dict[str, list[Any]] = {
    "speaker_about": [False, True],
    "query_confidence": [False, True],
    "turn_prior": [1.0, 0.5],
    "date_weight": [0.0, 2.0],
    "diversity_weight": [0.0, 0.5],
}

Found = dict[str, list[list[Sequence[str]]]]


def variants(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    names = list(grid)
    return [dict(zip(names, values)) for values in itertools.product(*(grid[n] for n in names))]


def score(bench: Bench, found: Found, shape: str, picks: Sequence[int] | None = None) -> float:
    """(recall@5 + recall@10) / 2 of a shape's scored queries (those at ``picks``)."""
    queries = bench.shapes[shape].queries
    idx = [i for i in (range(len(queries)) if picks is None else picks) if queries[i].category != 5]
    if not idx:
        return float("nan")
    return statistics.fmean((recall(found[shape][i], queries[i].wanted, 5) + recall(found[shape][i], queries[i].wanted, 10)) / 2 for i in idx)


def objective(bench: Bench, found: Found, shapes: Sequence[str], leave: str | None = None) -> float:
    """Mean over ``shapes`` of :func:`score`, without conversation ``leave``."""
    out = []
    for shape in shapes:
        qs = bench.shapes[shape].queries
        out.append(score(bench, found, shape, [i for i, q in enumerate(qs) if q.group != leave]))
    return statistics.fmean(out)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "memstream-ranking-fit")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    bench = open_bench(args.data, args.workdir)
    runs: list[tuple[dict[str, Any], Found]] = []
    base = RankingWeights()
    for change in variants(GRID):
        fn = bench.memstream(replace(base, **change))
        found = {s: bench.found(bench.shapes[s], fn) for s in SHAPES}
        runs.append((change, found))
        print(json.dumps({"variant": change, **{s: round(score(bench, found, s), 4) for s in SHAPES}}), flush=True)
    emb = {s: bench.found(bench.shapes[s], bench.embedder_alone) for s in SHAPES}
    result: dict[str, Any] = {"grid": GRID, "embedder": {s: round(score(bench, emb, s), 4) for s in SHAPES}}
    best = max(runs, key=lambda r: objective(bench, r[1], SHAPES))
    result["chosen"] = {"variant": best[0], **{s: round(score(bench, best[1], s), 4) for s in SHAPES}}
    convs = sorted({q.group for q in bench.shapes["locomo_turns"].queries})
    loco = []
    for conv in convs:
        pick = max(runs, key=lambda r: objective(bench, r[1], SHAPES, leave=conv))
        held = {s: round(score(bench, pick[1], s, [i for i, q in enumerate(bench.shapes[s].queries) if q.group == conv]), 4)
                for s in ("locomo_turns", "locomo_atomic")}
        loco.append({"held_out": conv, "variant": pick[0], **held})
    result["leave_one_conversation_out"] = loco
    loso = []
    for shape in SHAPES:
        rest = [s for s in SHAPES if s != shape]
        pick = max(runs, key=lambda r: objective(bench, r[1], rest))
        loso.append({"held_out": shape, "variant": pick[0], "score": round(score(bench, pick[1], shape), 4),
                     "embedder": result["embedder"][shape], "chosen_on_all": result["chosen"][shape]})
    result["leave_one_shape_out"] = loso
    rules = {}
    by_key = {json.dumps(c, sort_keys=True): f for c, f in runs}
    for name, values in GRID.items():
        for value in values:
            if value == best[0][name]:
                continue
            other = by_key[json.dumps({**best[0], name: value}, sort_keys=True)]
            rules[f"{name}={value}"] = {s: round(score(bench, other, s) - score(bench, best[1], s), 4) for s in SHAPES}
    result["flip_from_chosen"] = rules
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
