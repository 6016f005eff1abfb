"""The LoCoMo dataset as the benchmarks read it (conversations, sessions and their times,
question/answer items with evidence turn ids) and the metrics that evidence defines:
recall@k, hit@k and a score board per question category. The data is read from where it
lies (its licence is non-commercial); nothing of it is copied into the repository."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

CATEGORY_NAMES: dict[int, str] = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}
SCORED_CATEGORIES: tuple[int, ...] = (1, 2, 3, 4)
"""Categories averaged into "overall" (5 is adversarial: no answer to find)."""


# ------------------------------------------------------------------------------ data
@dataclass(frozen=True)
class Turn:
    dia_id: str
    speaker: str
    text: str
    session: int
    occurred_at: datetime


@dataclass(frozen=True)
class QAItem:
    question: str
    category: int
    evidence: tuple[str, ...]
    """The evidence strings as given (unsplit)."""


@dataclass(frozen=True)
class Conversation:
    sample_id: str
    speakers: tuple[str, ...]
    turns: tuple[Turn, ...]
    qa: tuple[QAItem, ...]

    @property
    def turn_ids(self) -> frozenset[str]:
        return frozenset(t.dia_id for t in self.turns)


_SESSION_KEY = re.compile(r"^session_(\d+)$")
_SESSION_TIME_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%I:%M%p on %d %B, %Y")


def parse_session_time(text: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` -> 2023-05-08 13:56 UTC. LoCoMo states no time zone;
    UTC is assumed (only the order and distances of times matter here)."""
    cleaned = " ".join(text.strip().split())
    for fmt in _SESSION_TIME_FORMATS:
        try:
            return datetime.strptime(cleaned, fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    raise ValueError(f"unrecognised session date-time {text!r} (expected e.g. '1:56 pm on 8 May, 2023')")


def turn_text(raw: Mapping[str, Any]) -> str:
    """The turn's text, with the caption of a shared image appended: the caption is all
    a text-only memory system can know about the picture."""
    text = str(raw.get("text") or "").strip()
    caption = str(raw.get("blip_caption") or "").strip()
    if caption:
        return f"{text} [image: {caption}]" if text else f"[image: {caption}]"
    return text


def load_locomo(path: Path) -> list[Conversation]:
    """Read a LoCoMo JSON file (a list of samples) into :class:`Conversation` values."""
    with open(path, encoding="utf-8") as fh:
        raw = json.load(fh)
    if not isinstance(raw, list):
        raise ValueError(f"{path}: expected a JSON list of conversations")
    out: list[Conversation] = []
    for sample in raw:
        conv = sample["conversation"]
        sessions = sorted(
            (int(m.group(1)), key) for key in conv if (m := _SESSION_KEY.match(key)) and isinstance(conv[key], list)
        )
        turns: list[Turn] = []
        for number, key in sessions:
            when_text = conv.get(f"{key}_date_time")
            if not when_text:
                raise ValueError(f"{sample.get('sample_id')}: {key} has no date_time")
            when = parse_session_time(when_text)
            for item in conv[key]:
                text = turn_text(item)
                if not text:
                    continue
                turns.append(Turn(str(item["dia_id"]), str(item["speaker"]), text, number, when))
        qa = tuple(
            QAItem(
                question=str(q["question"]),
                category=int(q["category"]),
                evidence=tuple(str(e) for e in (q.get("evidence") or ())),
            )
            for q in sample.get("qa") or ()
        )
        speakers = tuple(str(conv[k]) for k in ("speaker_a", "speaker_b") if conv.get(k))
        out.append(Conversation(str(sample["sample_id"]), speakers, tuple(turns), qa))
    return out


# ------------------------------------------------------------------------------ metrics
_EVIDENCE_SPLIT = re.compile(r"[;,\s]+")


def split_evidence(evidence: Iterable[Any]) -> list[str]:
    """Every id in the evidence strings (split on ``;``, ``,`` and whitespace), in order,
    without repeats."""
    ids: list[str] = []
    for item in evidence:
        for part in _EVIDENCE_SPLIT.split(str(item)):
            part = part.strip()
            if part and part not in ids:
                ids.append(part)
    return ids


def resolve_evidence(evidence: Iterable[Any], known_ids: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(valid, invalid)``: the evidence ids that name a turn of the conversation, and
    those that do not (ignored by the scoring, counted in the report)."""
    known = set(known_ids)
    ids = split_evidence(evidence)
    return tuple(i for i in ids if i in known), tuple(i for i in ids if i not in known)


def _found(results: Sequence[Sequence[str]], k: int) -> set[str]:
    return {sid for sources in results[:k] for sid in sources}


def recall_at_k(results: Sequence[Sequence[str]], evidence: Iterable[str], k: int) -> float:
    """Share of ``evidence`` among the source ids of the first ``k`` results (each
    result is its sequence of source message ids). Raises on empty evidence: such an
    item cannot be scored."""
    wanted = set(evidence)
    if not wanted:
        raise ValueError("recall of an item without evidence is undefined")
    if k < 1:
        raise ValueError("k must be at least 1")
    return len(wanted & _found(results, k)) / len(wanted)


def hit_at_k(results: Sequence[Sequence[str]], evidence: Iterable[str], k: int) -> float:
    """1.0 when any evidence id is among the first ``k`` results' sources, else 0.0."""
    wanted = set(evidence)
    if not wanted:
        raise ValueError("hit of an item without evidence is undefined")
    if k < 1:
        raise ValueError("k must be at least 1")
    return 1.0 if wanted & _found(results, k) else 0.0


@dataclass
class ScoreBoard:
    """Accumulates recall@k / hit@k per system and category; :meth:`summary` averages."""

    cutoffs: tuple[int, ...]
    _sums: dict[tuple[str, int, str, int], float] = field(default_factory=lambda: defaultdict(float))
    _counts: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))

    def add(self, system: str, category: int, results: Sequence[Sequence[str]], evidence: Sequence[str]) -> None:
        self._counts[(system, category)] += 1
        for k in self.cutoffs:
            self._sums[(system, category, "recall", k)] += recall_at_k(results, evidence, k)
            self._sums[(system, category, "hit", k)] += hit_at_k(results, evidence, k)

    def systems(self) -> list[str]:
        return sorted({s for s, _ in self._counts}, key=lambda s: (not s.startswith("memstream"), s))

    def mean(self, system: str, categories: Iterable[int], metric: str, k: int) -> float:
        """Mean over the items of ``categories`` (micro-average: every item weighs 1)."""
        cats = list(categories)
        n = sum(self._counts.get((system, c), 0) for c in cats)
        if n == 0:
            return float("nan")
        return sum(self._sums.get((system, c, metric, k), 0.0) for c in cats) / n

    def count(self, system: str, categories: Iterable[int]) -> int:
        return sum(self._counts.get((system, c), 0) for c in categories)

    def summary(self) -> dict[str, dict[str, dict[str, float]]]:
        """``{system: {"1".."5", "overall": {"recall@k": .., "hit@k": .., "n": ..}}}``."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for system in self.systems():
            per: dict[str, dict[str, float]] = {}
            groups: list[tuple[str, tuple[int, ...]]] = [(str(c), (c,)) for c in sorted(CATEGORY_NAMES)]
            groups.append(("overall", SCORED_CATEGORIES))
            for label, cats in groups:
                n = self.count(system, cats)
                if n == 0:
                    continue
                entry: dict[str, float] = {"n": n}
                for k in self.cutoffs:
                    entry[f"recall@{k}"] = round(self.mean(system, cats, "recall", k), 4)
                    entry[f"hit@{k}"] = round(self.mean(system, cats, "hit", k), 4)
                per[label] = entry
            out[system] = per
        return out
