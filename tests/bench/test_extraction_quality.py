"""``memstream bench extraction-quality``: the labelled set and its scoring."""

from __future__ import annotations

from typing import Any

import numpy as np

from memstream.bench.extraction_quality import MATCH_COSINE, load_sessions, score
from memstream.domain.events import MemoryType
from memstream.domain.extraction import MemoryDraft


def draft(content: str, kind: str, sources: tuple[str, ...]) -> MemoryDraft:
    return MemoryDraft(content=content, memory_type=MemoryType(kind), priority=50, source_message_ids=sources, occurred_at=None)


def test_the_set_has_twenty_sessions_each_fact_typed_among_the_seven() -> None:
    sessions = load_sessions()
    assert len(sessions) == 20
    for session in sessions:
        assert session["turns"] and session["facts"]
        assert all(kind in set(MemoryType) for _, kind in session["facts"])


def test_scoring_pairs_one_to_one_above_the_threshold() -> None:
    sessions = [{"turns": ["a", "b"], "facts": [["fact one", "persona"], ["fact two", "episodic"]]}]
    vectors = {"fact one": [1.0, 0.0], "fact two": [0.0, 1.0], "close to one": [0.9, 0.1],
               "also one": [0.95, 0.05], "nothing": [-1.0, 0.0]}

    def embed(texts: list[str]) -> Any:
        rows = np.asarray([vectors[t] for t in texts], dtype=np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    drafts = [draft("also one", "persona", ("q0-m0",)), draft("close to one", "episodic", ("q0-m1",)),
              draft("nothing", "persona", ("q0-m9",))]
    figures = score(sessions, [drafts], embed)
    assert MATCH_COSINE == figures["match_cosine"]
    # "also one" takes fact one; "close to one" finds no fact left above the threshold
    assert (figures["matched"], figures["memories"], figures["facts"]) == (1, 3, 2)
    assert figures["precision"] == round(1 / 3, 3) and figures["recall"] == 0.5
    assert figures["type_accuracy"] == 1.0 and figures["valid_source_ids"] == round(2 / 3, 3)
