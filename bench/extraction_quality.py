"""``memstream bench extraction-quality``: precision and recall of the extraction call on
a small labelled set.

The set (``bench/data/extraction_labelled.json``) is twenty short conversations written
for memstream (invented, not taken from any data set), each with the facts a good
extraction yields and their memory types: 42 facts. Each session is one window through
the production extraction call (the ``extraction`` prompt, the client's JSON modes,
JSON repair, :func:`~memstream.domain.extraction.parse_extraction` and its weak-output
rules): no Kafka, no LanceDB, only what the model is asked and what is read back.

Matching: an extracted memory matches a labelled fact of its session when the default
embedder's vectors of the two have cosine >= :data:`MATCH_COSINE` (0.6); matches are
paired greedily, best first, one to one. Figures (the last line's JSON):

* ``precision`` (matched memories / memories), ``recall`` (matched facts / facts);
* ``type_accuracy``: matched memories whose type is the labelled one;
* ``valid_source_ids``: memories whose source ids are all turns of their own window
  (the parser drops invented ids; a memory left with none is counted invalid);
* ``windows_by_model``, ``windows_declared_empty``, ``windows_failed`` (no usable
  answer after the call's retry: what the extractor would store by the fallback).

Without ``--llm-url`` the scripted fake answers: one ``persona`` memory per turn, the
turn's text verbatim (the heuristic's shape), a baseline for the matching itself.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from datetime import datetime, timedelta, timezone
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from memstream.bench._events import print_table, status
from memstream.bench.openai_fake import OpenAICompatServer, Reply
from memstream.domain.events import MessageObserved, Scope
from memstream.domain.extraction import (
    EXTRACTION_PROMPTS,
    build_window,
    extraction_schema,
    parse_extraction,
    render_turns,
)
from memstream.domain.prompts import PromptLibrary
from memstream.llm import LLMClient, LLMError
from memstream.projections.embedders import build_embedder, embed_array
from memstream.services.extraction import ask
from memstream.settings import Settings

__all__ = ["MATCH_COSINE", "load_sessions", "score", "run"]

MATCH_COSINE = 0.6
_T0 = datetime(2026, 5, 4, 9, 0, tzinfo=timezone.utc)
_SCOPE = Scope(team_id="bench", user_id="quality", agent_id="assistant")


def load_sessions() -> list[dict[str, Any]]:
    text = resources.files("memstream.bench").joinpath("data/extraction_labelled.json").read_text()
    return list(json.loads(text)["sessions"])


def _turns(i: int, session: dict[str, Any]) -> list[MessageObserved]:
    return [
        MessageObserved(
            scope=_SCOPE, session_id=f"q{i}", message_id=f"q{i}-m{j}", role="user", speaker=session["speaker"],
            content=text, occurred_at=_T0 + timedelta(days=i, minutes=j),
        )
        for j, text in enumerate(session["turns"])
    ]


def scripted_turns(body: dict[str, Any]) -> Reply:
    """The scripted fake: every new turn verbatim as one ``persona`` memory."""
    user = body["messages"][1]["content"].split("NEW TURNS", 1)[1]
    memories = []
    for line in user.splitlines():
        if line.startswith("[t") and "]" in line:
            alias, text = line[1 : line.index("]")], line.split(": ", 1)[-1]
            memories.append({"content": text, "type": "persona", "priority": 50, "source_ids": [alias],
                             "timestamp": None, "timestamp_start": None, "timestamp_end": None, "entities": []})
    return Reply(json_value={"scenes": [{"title": "chat", "message_ids": [], "memories": memories}]})


async def _extract(
    client: LLMClient, prompts: PromptLibrary, turns: list[MessageObserved], retries: int, variant: str
) -> tuple[str, list[Any]]:
    window = build_window(_SCOPE, turns[0].session_id, turns, (), max_background=0)
    background, new = render_turns(window)
    system, user = prompts.get(EXTRACTION_PROMPTS[variant], _SCOPE).render(
        {"background": background, "turns": new, "known": "", "max_memories": 10}
    )
    try:
        call = await ask(client, system, user, extraction_schema(variant, 10), "memstream_extraction",
                         lambda v: parse_extraction(v, window, max_memories=10), retries=retries)
    except LLMError:  # no usable answer after the call's retry: the fallback's window
        return "failed", []
    _, parsed = call.value
    return ("declared_empty" if parsed.nothing_to_remember else "model"), list(parsed.drafts)


def score(sessions: list[dict[str, Any]], extracted: list[list[Any]], embed: Any) -> dict[str, Any]:
    """Precision, recall, type accuracy and valid source ids (see the module docstring)."""
    memories = facts = matched = typed = valid = 0
    for i, (session, drafts) in enumerate(zip(sessions, extracted)):
        gold = session["facts"]
        ids = {f"q{i}-m{j}" for j in range(len(session["turns"]))}
        memories += len(drafts)
        facts += len(gold)
        valid += sum(1 for d in drafts if d.source_message_ids and set(d.source_message_ids) <= ids)
        if not drafts:
            continue
        a = embed([d.content for d in drafts])
        b = embed([g[0] for g in gold])
        sims = a @ b.T
        pairs = sorted(((sims[x, y], x, y) for x in range(len(drafts)) for y in range(len(gold))), reverse=True)
        used_x: set[int] = set()
        used_y: set[int] = set()
        for sim, x, y in pairs:
            if sim < MATCH_COSINE or x in used_x or y in used_y:
                continue
            used_x.add(x)
            used_y.add(y)
            matched += 1
            typed += drafts[x].memory_type.value == gold[y][1]
    return {
        "facts": facts,
        "memories": memories,
        "matched": matched,
        "precision": round(matched / memories, 3) if memories else 0.0,
        "recall": round(matched / facts, 3) if facts else 0.0,
        "type_accuracy": round(typed / matched, 3) if matched else 0.0,
        "valid_source_ids": round(valid / memories, 3) if memories else 0.0,
        "match_cosine": MATCH_COSINE,
    }


async def _measure(settings: Settings, sessions: list[dict[str, Any]]) -> dict[str, Any]:
    embedder = await asyncio.to_thread(build_embedder, settings)

    def embed(texts: list[str]) -> np.ndarray:
        rows = np.asarray(embed_array(embedder, texts), dtype=np.float32)
        return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-9)

    client = LLMClient.from_settings(settings)
    prompts = PromptLibrary(settings.extraction.prompts_dir)
    kinds: list[str] = []
    extracted: list[list[Any]] = []
    try:
        for i, session in enumerate(sessions):
            kind, drafts = await _extract(client, prompts, _turns(i, session), settings.extraction.llm_max_retries, settings.extraction.prompt)
            status(f"session {i}: {kind}, {len(drafts)} memories")
            kinds.append(kind)
            extracted.append(drafts)
    finally:
        await client.close()
    figures = score(sessions, extracted, embed)
    figures.update(
        windows=len(sessions),
        windows_by_model=kinds.count("model"),
        windows_declared_empty=kinds.count("declared_empty"),
        windows_failed=kinds.count("failed"),
        output_mode=client.output_mode,
        model=settings.extraction.llm_model,
        prompt=EXTRACTION_PROMPTS[settings.extraction.prompt],
    )
    return figures


def run(
    llm_url: str | None = None, llm_model: str | None = None, timeout_s: float = 120.0, sessions_n: int | None = None
) -> dict[str, Any]:
    """Run the set (its first ``sessions_n`` sessions when given); prints a table."""
    sessions = load_sessions()[:sessions_n]
    with tempfile.TemporaryDirectory(prefix="memstream-bench-quality-") as tmp, OpenAICompatServer() as fake:
        fake.chat.responder = scripted_turns
        overrides: dict[str, Any] = {
            "home": Path(tmp),
            "llm_base_url": llm_url or fake.base_url,
            "llm_model": llm_model or ("scripted" if not llm_url else "default"),
            "llm_timeout_s": timeout_s,
            "llm_max_tokens": 768,
        }
        figures = asyncio.run(_measure(Settings(**overrides), sessions))
    print_table(
        f"extraction quality of {figures['model']} on {len(sessions)} labelled sessions ({figures['facts']} facts)",
        [
            ("precision", f"{figures['precision']:.2f}", f"{figures['matched']} of {figures['memories']} memories match a fact"),
            ("recall", f"{figures['recall']:.2f}", f"cosine >= {MATCH_COSINE} with the default embedder"),
            ("type_accuracy", f"{figures['type_accuracy']:.2f}", "of the matched memories"),
            ("valid_source_ids", f"{figures['valid_source_ids']:.2f}", "memories citing only their own window"),
            ("windows_by_model", f"{figures['windows_by_model']} / {figures['windows']}",
             f"{figures['windows_declared_empty']} declared empty, {figures['windows_failed']} failed"),
        ],
    )
    return figures
