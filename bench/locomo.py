"""``memstream bench locomo``: evidence recall on LoCoMo through memstream's real path.

Why this benchmark: a memory system is chosen on whether it brings back the turns that
answer a question. LoCoMo (Maharana et al., ACL 2024) gives long multi-session
conversations and questions whose *evidence* is a set of turn ids, so retrieval can be
scored without any LLM judge: did the top-k results cite the evidence turns?

What runs (nothing is shortcut):

1. every conversation becomes its own memory space (team ``locomo-bench``, user = the
   sample id); every turn becomes a ``MessageObserved`` on Kafka with its speaker, its
   ``dia_id`` as ``message_id``, its session's date and time as ``occurred_at`` and the
   session as ``session_id``; an image turn carries its caption in the text;
2. a real worker process (``python -m memstream.services.worker``) extracts them with the
   no-LLM extractor (each qualifying turn becomes one memory whose source is the turn)
   and projects them into LanceDB; ingest time runs from the first send until the
   extractor committed every turn and the projector's stored positions reached the end
   of both topics;
3. each QA item's question is searched in its conversation's space by memstream's
   search and, on the same tables in the same run, by the three simple baselines:
   vector similarity alone, BM25 full text alone and plain reciprocal rank fusion of
   the two (k = 60).

Scoring (pure functions below, unit-tested): an item's evidence strings are split on
``;``, ``,`` and whitespace; ids that match no turn of the conversation are ignored and
counted; recall@k is the share of the remaining evidence ids found among the source
message ids of the top-k results, hit@k is 1 when any is. Means are reported per
category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial) and
"overall" over categories 1-4 (5 has no answer in the conversation and is reported
apart). Items without a valid evidence id are not scored (and counted).

The data is CC BY-NC: it is read from where the caller says and never copied.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from memstream.bench._common import (
    LatencyLog,
    LogWatch,
    WorkerProcess,
    console,
    delete_topics,
    err_console,
    progress_bar,
    table,
    wait_caught_up,
)
from memstream.bench.locomo_data import (
    CATEGORY_NAMES,
    SCORED_CATEGORIES,
    Conversation,
    QAItem,
    ScoreBoard,
    Turn,
    hit_at_k,
    load_locomo,
    parse_session_time,
    recall_at_k,
    resolve_evidence,
    split_evidence,
)
from memstream.bench.openai_fake import OpenAICompatServer
from memstream.domain.events import MessageObserved, Scope
from memstream.domain.ranking import RankingWeights
from memstream.projections.embedders import build_embedder, embed_array
from memstream.projections.schema import MEMORIES
from memstream.projections.search import HttpReranker
from memstream.projections.search import hybrid as s
from memstream.projections.store import LanceStore
from memstream.settings import Settings
from memstream.streams.admin import ensure_topics
from memstream.streams.producers.producer import MemstreamProducer
from memstream.streams.topics import Topics

__all__ = [
    "CATEGORY_NAMES",
    "SCORED_CATEGORIES",
    "DEFAULT_K",
    "Turn",
    "QAItem",
    "Conversation",
    "parse_session_time",
    "load_locomo",
    "split_evidence",
    "resolve_evidence",
    "recall_at_k",
    "hit_at_k",
    "ScoreBoard",
    "bench_settings",
    "conversation_events",
    "scope_of",
    "IngestReport",
    "ingest",
    "ingest_events",
    "SYSTEMS",
    "PLAIN_RANKING",
    "cleanup_run",
    "embed_alone_s",
    "EMBED_BATCH",
    "evaluate",
    "Evaluation",
    "run",
]

DEFAULT_K: tuple[int, ...] = (5, 10, 20)
TEAM = "locomo-bench"


# ------------------------------------------------------------------------------ ingest
def scope_of(conversation: Conversation) -> Scope:
    """One memory space per conversation."""
    user = re.sub(r"[^A-Za-z0-9_.:@/+=-]", "_", conversation.sample_id)[:128] or "conversation"
    return Scope(team_id=TEAM, user_id=user)


def conversation_events(conversation: Conversation) -> list[MessageObserved]:
    """The turns of one conversation as ``MessageObserved`` events, in order."""
    scope = scope_of(conversation)
    return [
        MessageObserved(
            scope=scope,
            message_id=t.dia_id,
            role="user",
            speaker=t.speaker,
            content=t.text,
            occurred_at=t.occurred_at,
            recorded_at=t.occurred_at,
            session_id=f"session_{t.session}",
            producer="memstream-bench-locomo",
        )
        for t in conversation.turns
    ]


def bench_settings(base: Settings, workdir: Path, *, embedder: str, tag: str) -> Settings:
    """Settings for a private run: own topics, app id and LanceDB directory on the
    configured broker, and the no-LLM extractor with the product's defaults (without
    an LLM every turn is due at once, and the turns read together are extracted in
    one batch: no bench-only tuning)."""
    suffix = uuid.uuid4().hex[:8]
    return base.model_copy(
        update={
            "broker.topic_prefix": f"bench-{tag}-{suffix}.",
            "worker.app_id": f"bench-{tag}-{suffix}",
            "storage.root": workdir / "lance",
            "home": workdir / "home",
            "embeddings.provider": embedder,
            "extraction.llm_base_url": None,
            "extraction.llm_api_key": None,
        }
    )


@dataclass(frozen=True)
class IngestReport:
    turns: int
    memories: int
    ingest_s: float
    worker_start_s: float
    produce_s: float


def ingest(settings: Settings, conversations: Sequence[Conversation], workdir: Path) -> IngestReport:
    """Run the worker, send every turn, wait until all is extracted and projected."""
    return ingest_events(settings, [e for c in conversations for e in conversation_events(c)], workdir)


def ingest_events(settings: Settings, events: Sequence[Any], workdir: Path) -> IngestReport:
    """Run the worker, send ``events`` (turns and memories), wait until every turn is
    extracted and everything projected."""
    asyncio.run(ensure_topics(settings.broker.bootstrap_servers, Topics.from_settings(settings.broker)))
    worker = WorkerProcess(settings, workdir / "worker", loglevel="info")
    started = time.perf_counter()
    worker.start()
    try:
        worker.wait_log("extractor assigned", timeout=120.0)
        worker_start_s = time.perf_counter() - started
        store_box: list[Any] = []

        def positions() -> Mapping[tuple[str, int], int]:
            if not store_box:
                if not (settings.local_lance_dir / "positions.lance").exists():
                    return {}
                store_box.append(LanceStore.from_settings(settings.storage, settings.embeddings.dim, read_consistency_interval=_ZERO))
            return store_box[0].positions()

        with progress_bar() as bar:
            task = bar.add_task("extract + project", total=len(events))

            def on_poll(state: Any) -> None:
                done = sum(min(end, state.extracted.get(tp, 0)) for tp, end in state.message_ends.items())
                bar.update(task, completed=done)

            async def measured() -> tuple[float, float, Any]:
                # The clients connect before the clock starts, as an agent's producer
                # is connected before its turns arrive.
                async with (
                    LogWatch(settings) as watch,
                    MemstreamProducer(settings.streams, client_id="memstream-bench") as producer,
                ):
                    t0 = time.perf_counter()
                    # A stream of turns, each enqueued as soon as it is encoded (one
                    # ``send_many`` encodes every event before it sends any), with the
                    # loop given a turn every ``_SEND_CHUNK`` so the client sends
                    # meanwhile; then every acknowledgement is awaited.
                    sent: list[asyncio.Future[Any]] = []
                    for i, event in enumerate(events, 1):
                        sent.append(await producer.send_nowait(event))
                        if i % _SEND_CHUNK == 0:
                            await asyncio.sleep(0)
                    await asyncio.gather(*sent)
                    produced = time.perf_counter()
                    done = await wait_caught_up(
                        settings, positions, timeout=900.0, poll=_POLL_S, alive=worker.alive, on_poll=on_poll,
                        watch=watch, settle_poll=_SETTLE_POLL_S,
                    )
                    return t0, produced - t0, done

            t0, produce_s, done = asyncio.run(measured())
        # when everything was first seen extracted and projected (see _SETTLE_POLL_S)
        ingest_s = done.observed_at - t0
    except BaseException:
        err_console.print(f"[red]worker log tail:[/red]\n{worker.tail(40)}")
        raise
    finally:
        worker.stop()
    store = LanceStore.from_settings(settings.storage, settings.embeddings.dim)
    memories = store.count(MEMORIES)
    return IngestReport(len(events), memories, ingest_s, worker_start_s, produce_s)


_ZERO = timedelta(0)
_SEND_CHUNK = 100
"""Turns enqueued between two turns of the event loop while the benchmark sends."""
_POLL_S = 0.05
"""How often the ingest's end is looked for while extraction is still behind (cheap
polls: the log's ends and the extractor's commits)."""
_SETTLE_POLL_S = 0.01
"""The interval once extraction is done and only the projection of its last events
is left (each poll then reads the positions table): the figure is at most about this
late (plus one read)."""


# ------------------------------------------------------------------------------ search
SearchFn = Callable[[Any, Any, Scope, str, int], list[Any]]


PLAIN_RANKING: dict[str, Any] = {
    "fusion": "rrf",
    "query_processing": False,
    "context_forward": 0.0,
    "context_forward_statement": 0.0,
    "context_backward": 0.0,
    "speaker_weight": 0.0,
    "temporal_weight": 0.0,
    "question_penalty": 1.0,
}
"""memstream's ranking before the conversation-aware steps (weighted RRF, recency,
supersession, entity boost): reported as ``memstream_plain``, the "before"."""


def _systems(reranker: Any = None) -> dict[str, SearchFn]:
    plain = RankingWeights(**PLAIN_RANKING)
    cache = s.SearchCache()  # held across the run, as a serving process holds one
    extra: dict[str, SearchFn] = {}
    if reranker is not None:  # memstream's ranking, then the reranker over its top results
        extra["memstream_rerank"] = lambda store, emb, scope, q, k: s.search(
            store, emb, scope, q, k, cache=cache, reranker=reranker
        )
    return {
        **extra,
        "memstream": lambda store, emb, scope, q, k: s.search(store, emb, scope, q, k, cache=cache),
        "memstream_plain": lambda store, emb, scope, q, k: s.search(store, emb, scope, q, k, weights=plain, cache=cache),
        "vector": lambda store, emb, scope, q, k: s.vector_search(store, emb, scope, q, k),
        "bm25": lambda store, emb, scope, q, k: s.text_search(store, emb, scope, q, k),
        "rrf": lambda store, emb, scope, q, k: s.rrf_search(store, emb, scope, q, k, rrf_k=60),
    }


SYSTEMS: tuple[str, ...] = ("memstream", "memstream_plain", "vector", "bm25", "rrf")


@dataclass
class Evaluation:
    board: ScoreBoard
    latency: dict[str, LatencyLog]
    scored: int
    unscored: int
    invalid_ids: int
    invalid_items: int


def evaluate(
    store: Any,
    embedder: Any,
    conversations: Sequence[Conversation],
    cutoffs: tuple[int, ...],
    systems: Mapping[str, SearchFn],
) -> Evaluation:
    """Search every QA item with every system and score the results."""
    board = ScoreBoard(cutoffs)
    latency = {name: LatencyLog() for name in systems}
    kmax = max(cutoffs)
    scored = unscored = invalid_ids = invalid_items = 0
    total = sum(len(c.qa) for c in conversations)
    with progress_bar() as bar:
        task = bar.add_task("search", total=total)
        for conv in conversations:
            scope = scope_of(conv)
            known = conv.turn_ids
            for item in conv.qa:
                bar.advance(task)
                valid, invalid = resolve_evidence(item.evidence, known)
                if invalid:
                    invalid_ids += len(invalid)
                    invalid_items += 1
                if not valid:
                    unscored += 1
                    continue
                scored += 1
                for name, fn in systems.items():
                    with latency[name].measure():
                        results = fn(store, embedder, scope, item.question, kmax)
                    board.add(name, item.category, [r.source_message_ids for r in results], valid)
    return Evaluation(board, latency, scored, unscored, invalid_ids, invalid_items)


# ------------------------------------------------------------------------------ report
def _print_report(summary: Mapping[str, Any], ev: Evaluation, cutoffs: tuple[int, ...]) -> None:
    for k in cutoffs:
        rows = []
        for system in ev.board.systems():
            per = summary[system]
            row: list[Any] = [system]
            for label in ("1", "2", "3", "4", "overall", "5"):
                row.append(per.get(label, {}).get(f"recall@{k}"))
            row.append(per.get("overall", {}).get(f"hit@{k}"))
            rows.append(row)
        cols = ["system", *(f"{c} {CATEGORY_NAMES[c]}" for c in SCORED_CATEGORIES), "overall 1-4", "5 adversarial", "hit overall"]
        console.print(table(f"evidence recall@{k}", cols, rows))
    lat_rows = [[name, log.p50, log.p95, len(log.samples_ms)] for name, log in ev.latency.items()]
    console.print(table("search latency (ms)", ["system", "p50", "p95", "queries"], lat_rows))


def run(
    data: Path,
    k: tuple[int, ...] = DEFAULT_K,
    embedder: str | None = None,
    keep: bool = False,
    rerank_url: str | None = None,
) -> dict[str, Any]:
    """Run the whole benchmark (see the module docstring) with ``embedder`` (default:
    the configured one); returns the JSON summary. ``rerank_url``: a ``/rerank``
    endpoint whose reranker is measured as ``memstream_rerank`` (``fake``: the scripted
    server's word-overlap stand-in, which measures the hook's cost, not a model)."""
    cutoffs = tuple(sorted(set(k) | {10}))
    conversations = load_locomo(Path(data))
    workdir = Path(tempfile.mkdtemp(prefix="memstream-bench-locomo-"))
    base = Settings()
    settings = bench_settings(base, workdir, embedder=embedder or base.embeddings.provider, tag="locomo")
    emb = build_embedder(settings.embeddings)
    console.print(
        f"LoCoMo: {len(conversations)} conversations, {sum(len(c.turns) for c in conversations)} turns, "
        f"{sum(len(c.qa) for c in conversations)} QA items; embedder {emb.model_id}; "
        f"broker {settings.broker.bootstrap_servers}, topics {settings.broker.topic_prefix}*"
    )
    try:
        report = ingest(settings, conversations, workdir)
        console.print(
            f"ingest: {report.turns} turns -> {report.memories} memories in {report.ingest_s:.1f} s "
            f"(produce {report.produce_s:.1f} s; worker start {report.worker_start_s:.1f} s, not counted)"
        )
        store = LanceStore.from_settings(settings.storage, settings.embeddings.dim)
        store.optimize()
        embed_s = embed_alone_s(emb, store)
        console.print(
            f"the embedder alone embeds the same {report.memories} memories in {embed_s:.1f} s "
            f"(batches of {EMBED_BATCH}): ingest / embedding = {report.ingest_s / embed_s:.2f}"
        )
        with _reranker(rerank_url) as reranker:
            ev = evaluate(store, emb, conversations, cutoffs, _systems(reranker))
    finally:
        cleanup_run(settings, workdir, keep)
    summary = ev.board.summary()
    _print_report(summary, ev, cutoffs)
    overall = {s: summary[s]["overall"] for s in summary}
    mem_log = ev.latency["memstream"]
    result: dict[str, Any] = {
        "embedder": emb.model_id,
        "memstream_recall_at_10": overall["memstream"]["recall@10"],
        "memstream_hit_at_10": overall["memstream"]["hit@10"],
        "vector_recall_at_10": overall["vector"]["recall@10"],
        "bm25_recall_at_10": overall["bm25"]["recall@10"],
        "rrf_recall_at_10": overall["rrf"]["recall@10"],
        "memstream_plain_recall_at_10": overall["memstream_plain"]["recall@10"],
        "per_category": summary,
        "ingest_s": round(report.ingest_s, 2),
        "embed_alone_s": round(embed_s, 2),
        "ingest_over_embed_alone": round(report.ingest_s / embed_s, 3),
        "search_p50_ms": round(mem_log.p50, 2),
        "search_p95_ms": round(mem_log.p95, 2),
        "search_ms": {n: {"p50": round(l.p50, 2), "p95": round(l.p95, 2)} for n, l in ev.latency.items()},
        "k": list(cutoffs),
        "conversations": len(conversations),
        "turns": report.turns,
        "memories": report.memories,
        "qa_items": ev.scored + ev.unscored,
        "qa_scored": ev.scored,
        "qa_without_valid_evidence": ev.unscored,
        "invalid_evidence_ids": ev.invalid_ids,
    }
    if "memstream_rerank" in overall:
        result["memstream_rerank_recall_at_10"] = overall["memstream_rerank"]["recall@10"]
        result["rerank_gain_at_10"] = round(overall["memstream_rerank"]["recall@10"] - overall["memstream"]["recall@10"], 4)
        result["rerank_url"] = rerank_url
    best = max(result["vector_recall_at_10"], result["bm25_recall_at_10"], result["rrf_recall_at_10"])
    result["best_baseline_recall_at_10"] = best
    result["margin_over_best_baseline"] = round(result["memstream_recall_at_10"] - best, 4)
    return result


@contextlib.contextmanager
def _reranker(url: str | None) -> Iterator[Any]:
    """The reranker at ``url`` (``fake``: one the bench serves itself), closed after."""
    if not url:
        yield None
        return
    with contextlib.ExitStack() as stack:
        if url == "fake":
            url = stack.enter_context(OpenAICompatServer()).base_url
        reranker = HttpReranker(url)
        stack.callback(reranker.close)
        yield reranker


EMBED_BATCH = 500
"""Texts per call when the embedder alone is timed (the no-LLM extractor's batch)."""


def embed_alone_s(embedder: Any, store: Any) -> float:
    """Seconds the embedder alone takes to embed every stored memory's content in
    batches: the floor of an ingest that must embed them all."""
    texts = store.table(MEMORIES).to_arrow().column("content").to_pylist()
    started = time.perf_counter()
    for i in range(0, len(texts), EMBED_BATCH):
        embed_array(embedder, texts[i : i + EMBED_BATCH])
    return time.perf_counter() - started


def cleanup_run(settings: Settings, workdir: Path, keep: bool) -> None:
    """Delete a run's private topics and (unless ``keep``) its working directory."""
    try:
        asyncio.run(delete_topics(settings.broker.bootstrap_servers, Topics.from_settings(settings.broker), settings.worker.app_id))
    except Exception as exc:  # noqa: BLE001 - cleanup must not hide the result
        err_console.print(f"[yellow]could not delete the bench topics: {exc}[/yellow]")
    if keep:
        err_console.print(f"kept {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
