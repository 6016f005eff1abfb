"""``memstream bench paraphrase``: recall of facts asked for in other words.

Why: LoCoMo's questions often repeat the words of their evidence, so a lexical system
does well on it; an agent's user does not. This set (``bench/data/paraphrase.json``,
written for memstream, CC0) holds facts about fictional people and one question per
fact that shares no content word with it except the person's name ("Alice prefers
window seats on flights." / "Where does Alice like to sit when she travels by
plane?"; ``tests/bench/test_paraphrase.py`` checks the rule). Every fact of every
person is one memory in a single memory space, so a question competes with the
person's other facts and everyone else's.

What runs: for each embedder asked for (by default the configured one and the
lexical ``local``), the facts are projected by the real projector (which embeds
them, as it does memories written without a vector) into real LanceDB tables, then
every question is searched by memstream's hybrid search and, on the same tables, by
vector similarity alone and BM25 alone. Reported: recall@1 and recall@5 (the share of
questions whose fact is in the top 1 or 5) per system and embedder, and search p50.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

from memstream.bench._common import LatencyLog, console, table
from memstream.domain.events import MemoryAdded, Scope
from memstream.domain.log import LogPosition, PositionedEvent
from memstream.projections.search import hybrid as s
from memstream.projections.embedders import build_embedder
from memstream.projections.projector import Projector
from memstream.projections.store import LanceStore
from memstream.settings import Settings

__all__ = ["Fact", "load_facts", "recall_at", "project_facts", "evaluate", "run", "SCOPE", "CUTOFFS"]

SCOPE = Scope(team_id="paraphrase-bench", user_id="people")
CUTOFFS: tuple[int, ...] = (1, 5)
_WHEN = datetime(2025, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Fact:
    memory_id: str
    person: str
    text: str
    question: str


def load_facts(path: Path | None = None) -> list[Fact]:
    """The facts of the set (the packaged one unless ``path`` is given)."""
    if path is None:
        raw = resources.files("memstream.bench").joinpath("data/paraphrase.json").read_text(encoding="utf-8")
    else:
        raw = Path(path).read_text(encoding="utf-8")
    people: dict[str, list[list[str]]] = json.loads(raw)["people"]
    return [
        Fact(memory_id=f"{person.lower()}-{i}", person=person, text=text, question=question)
        for person, pairs in people.items()
        for i, (text, question) in enumerate(pairs, start=1)
    ]


def recall_at(ranked: Sequence[Sequence[str]], answers: Sequence[str], k: int) -> float:
    """Share of questions whose answer is among the first ``k`` of its ranking."""
    if not answers:
        return 0.0
    return sum(answer in ids[:k] for ids, answer in zip(ranked, answers)) / len(answers)


def project_facts(store: Any, embedder: Any, facts: Sequence[Fact]) -> None:
    """Every fact as a ``MemoryAdded`` without a vector, applied by the projector."""
    events = [
        PositionedEvent(
            position=LogPosition(topic="paraphrase", partition=0, offset=i),
            event=MemoryAdded(
                scope=SCOPE, memory_id=f.memory_id, content=f.text, memory_type="persona",
                occurred_at=_WHEN, recorded_at=_WHEN,
            ),
        )
        for i, f in enumerate(facts)
    ]
    Projector(store, embedder).apply(events)


SearchFn = Callable[[Any, Any, str, int], list[Any]]


def _systems() -> dict[str, SearchFn]:
    cache = s.SearchCache()  # held across the run, as a serving process holds one
    return {
        "memstream": lambda store, emb, q, k: s.search(store, emb, SCOPE, q, k, cache=cache),
        "vector": lambda store, emb, q, k: s.vector_search(store, emb, SCOPE, q, k),
        "bm25": lambda store, emb, q, k: s.text_search(store, emb, SCOPE, q, k),
    }


def evaluate(store: Any, embedder: Any, facts: Sequence[Fact]) -> dict[str, dict[str, float]]:
    """recall@1, recall@5 and search p50 (ms) of every system on projected ``facts``."""
    out: dict[str, dict[str, float]] = {}
    answers = [f.memory_id for f in facts]
    for name, fn in _systems().items():
        latency = LatencyLog()
        ranked: list[list[str]] = []
        for f in facts:
            with latency.measure():
                results = fn(store, embedder, f.question, max(CUTOFFS))
            ranked.append([r.memory_id for r in results])
        out[name] = {f"recall@{k}": round(recall_at(ranked, answers, k), 4) for k in CUTOFFS}
        out[name]["p50_ms"] = round(latency.p50, 2)
    return out


def _one_embedder(kind: str, facts: Sequence[Fact]) -> tuple[str, dict[str, dict[str, float]]]:
    settings = Settings(embeddings={"provider": kind})
    embedder = build_embedder(settings.embeddings)
    workdir = Path(tempfile.mkdtemp(prefix="memstream-bench-paraphrase-"))
    try:
        store = LanceStore(workdir / "lance", embedding_dim=embedder.dim)
        project_facts(store, embedder, facts)
        return embedder.model_id, evaluate(store, embedder, facts)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run(embedders: Sequence[str] = (), data: Path | None = None) -> dict[str, Any]:
    """Run the benchmark for each embedder kind (default: the configured one, then
    ``local``); returns the JSON summary."""
    facts = load_facts(data)
    kinds = list(dict.fromkeys(embedders or (Settings().embeddings.provider, "local")))
    console.print(f"paraphrase set: {len(facts)} facts about {len({f.person for f in facts})} people, one question each")
    result: dict[str, Any] = {"facts": len(facts), "embedders": {}}
    rows = []
    for kind in kinds:
        model_id, scores = _one_embedder(kind, facts)
        result["embedders"][kind] = {"model": model_id, **scores}
        for system, got in scores.items():
            rows.append([kind, system, got["recall@1"], got["recall@5"], got["p50_ms"]])
    console.print(table("paraphrase recall", ["embedder", "system", "recall@1", "recall@5", "p50 ms"], rows))
    first = kinds[0]
    result["memstream_recall_at_5"] = result["embedders"][first]["memstream"]["recall@5"]
    return result
