"""CLI commands: ``memstream bench NAME`` runs one benchmark.

Every benchmark prints a readable table while it runs and, as its very last line, one
JSON object with its named figures, so scripts can take ``tail -n 1``. Benchmark code
lives in ``memstream.bench.<name>`` and exposes ``run(...) -> dict``; it is imported
lazily so the CLI starts fast and optional extras stay optional.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import typer

from memstream.cli._errors import CLIError

__all__ = ["register", "bench_app"]

bench_app = typer.Typer(help="Run a benchmark; the last line printed is one JSON object.", no_args_is_help=True)


def _run(name: str, **options: Any) -> Any:
    return _run_named(name, "run", **options)


def _run_named(name: str, function: str, **options: Any) -> Any:
    try:
        module = importlib.import_module(f"memstream.bench.{name}")
    except ModuleNotFoundError as exc:
        raise CLIError(f"benchmark {name!r} is not available: {exc}") from exc
    result = getattr(module, function)(**options)
    typer.echo(json.dumps(result, sort_keys=True, default=str))
    return result


@bench_app.command("projector")
def bench_projector(
    quick: bool = typer.Option(False, "--quick", help="20,000 events instead of 200,000."),
    events: int = typer.Option(0, help="Override the number of events."),
) -> None:
    """Projector throughput against raw aiokafka consume and raw LanceDB add."""
    _run("projector", quick=quick, events=events or None)


@bench_app.command("replay")
def bench_replay(
    quick: bool = typer.Option(False, "--quick", help="100,000 events instead of 1,000,000."),
    events: int = typer.Option(0, help="Override the number of events."),
) -> None:
    """Replay throughput against the same raw ceiling."""
    _run("replay", quick=quick, events=events or None)


@bench_app.command("search")
def bench_search(
    quick: bool = typer.Option(False, "--quick", help="100,000 memories only."),
) -> None:
    """Hybrid search latency against LanceDB vector search alone."""
    _run("search", quick=quick)


@bench_app.command("console")
def bench_console(
    quick: bool = typer.Option(False, "--quick", help="20,000 memories instead of 100,000."),
    memories: int = typer.Option(0, help="Override the number of memories in the space."),
    requests: int = typer.Option(40, help="Requests per page (after a warm-up)."),
) -> None:
    """The web console's page server time (p95) with many memories in one space."""
    _run("console", quick=quick, memories=memories or None, requests=requests)


@bench_app.command("forget")
def bench_forget(
    quick: bool = typer.Option(False, "--quick", help="100 memories per subject instead of 1,000."),
) -> None:
    """Crypto-shredding end to end: rows and plaintext left after forgetting, a replay, the others' rows."""
    _run("forget", quick=quick)


@bench_app.command("scale")
def bench_scale(
    quick: bool = typer.Option(False, "--quick", help="6,000 events, 30 s of faults, 1 kill."),
    workers: int = typer.Option(3, min=1, help="Workers (on twice as many partitions)."),
    events: int = typer.Option(0, help="Override the throughput runs' events."),
    kills: int = typer.Option(-1, help="Override the number of SIGKILLs."),
) -> None:
    """N workers in a consumer group, one shard per partition: throughput, kills, rebalances."""
    _run("scale", quick=quick, workers=workers, events=events or None, kills=None if kills < 0 else kills)


@bench_app.command("freshness")
def bench_freshness(
    quick: bool = typer.Option(False, "--quick", help="15 s instead of 60 s."),
    rate: int = typer.Option(1000, help="Events per second to produce."),
) -> None:
    """Produce-to-searchable latency at a steady rate."""
    _run("freshness", quick=quick, rate=rate)


@bench_app.command("mixed")
def bench_mixed(
    quick: bool = typer.Option(False, "--quick", help="5 rounds of 6 s phases instead of 6 rounds of 10 s."),
    rate: float = typer.Option(30.0, help="Writes per second in the mixed phase (half turns, half memories)."),
    seconds: float = typer.Option(0, help="Override the length of each phase of a round, in seconds."),
    mixed_seconds: float = typer.Option(0, help="Override the mixed phase's length (the memory check: --rounds 1 --mixed-seconds 600)."),
    rounds: int = typer.Option(0, help="Override the number of rounds (alone then mixed, alternating)."),
    searchers: int = typer.Option(12, help="Closed-loop search clients."),
) -> None:
    """Search throughput and latency alone and beside a steady stream of writes, in alternating rounds."""
    _run(
        "mixed", quick=quick, rate=rate, seconds=seconds or None, mixed_seconds=mixed_seconds or None,
        rounds=rounds or None, searchers=searchers,
    )


@bench_app.command("ingest")
def bench_ingest(
    quick: bool = typer.Option(False, "--quick", help="150 memories a phase instead of 600."),
    n: int = typer.Option(0, help="Override the memories written a phase."),
    rate: float = typer.Option(30.0, help="Memories per second in the steady phases."),
    concurrency: int = typer.Option(16, help="Writes in flight in the maximum-rate phases."),
    doors: str = typer.Option("http,sdk,mcp", help="Front doors, comma-separated: http, sdk, mcp."),
    embedder: str = typer.Option("", help="Override the embedder (default: the product's)."),
) -> None:
    """CPU per memory per process through each front door against the embedding floor."""
    _run("ingest", quick=quick, n=n or None, rate=rate, concurrency=concurrency, doors=doors, embedder=embedder or None)


@bench_app.command("extractor")
def bench_extractor(
    quick: bool = typer.Option(False, "--quick"),
    llm_url: str = typer.Option(
        "", "--llm-url", help="Run against this OpenAI-compatible endpoint instead of the scripted LLM."
    ),
    llm_model: str = typer.Option("", "--llm-model", help="The model name to ask for (with --llm-url)."),
    faults: bool = typer.Option(
        False, "--faults", help="Then windows the model always refuses, and a worker restart mid-session."
    ),
    known_ab: bool = typer.Option(
        False, "--known-ab", help="Without, then with, the known memories in the extraction call."
    ),
    replay: Path | None = typer.Option(
        None, "--replay", exists=True, dir_okay=False,
        help="Replay this LoCoMo-format transcript (read in place) without, then with, known memories.",
    ),
    conversations: int = typer.Option(2, "--conversations", min=1, help="With --replay: how many conversations."),
) -> None:
    """Extraction pipeline overhead with an instant scripted LLM, or (--llm-url) what a
    real model server does to the pipeline; --faults adds poison windows and a restart."""
    if llm_url:
        if faults:
            raise CLIError("--faults runs with the scripted model only (not with --llm-url)")
        _run_against_endpoint(quick=quick, llm_url=llm_url, llm_model=llm_model)
        return
    if replay is not None:
        _run("extractor_replay", data=replay, conversations=conversations)
        return
    if known_ab:
        _run_named("extractor", "run_known_ab", quick=quick)
        return
    _run("extractor_faults" if faults else "extractor", quick=quick)


def _run_against_endpoint(*, quick: bool, llm_url: str, llm_model: str) -> None:
    if not llm_url.startswith(("http://", "https://")):
        raise CLIError(f"--llm-url must be an http(s) URL, got {llm_url!r}")
    figures = _run("extractor_llm", llm_url=llm_url, llm_model=llm_model or None, quick=quick)
    if not figures["model_answered"]:
        raise typer.Exit(3)  # the figures above measured the fallback, not the model


@bench_app.command("extraction-quality")
def bench_extraction_quality(
    llm_url: str = typer.Option("", "--llm-url", help="This OpenAI-compatible endpoint instead of the scripted fake."),
    llm_model: str = typer.Option("", "--llm-model", help="The model name to ask for (with --llm-url)."),
    sessions: int = typer.Option(0, "--sessions", min=0, help="Only the set's first N sessions (0: all 20)."),
) -> None:
    """Precision and recall of the extraction call on the labelled set (bench/data)."""
    if llm_url and not llm_url.startswith(("http://", "https://")):
        raise CLIError(f"--llm-url must be an http(s) URL, got {llm_url!r}")
    _run("extraction_quality", llm_url=llm_url or None, llm_model=llm_model or None, sessions_n=sessions or None)


@bench_app.command("reflection")
def bench_reflection(quick: bool = typer.Option(False, "--quick")) -> None:
    """Settling 10,000 pending decisions with an instant scripted LLM."""
    _run("reflection", quick=quick)


@bench_app.command("locomo")
def bench_locomo(
    data: Path = typer.Option(..., exists=True, dir_okay=False, help="LoCoMo JSON (read in place, never copied)."),
    k: str = typer.Option("5,10,20", help="Comma-separated cut-offs."),
    embedder: str = typer.Option("", help="onnx | local | minilm | openai (default: the configured one)"),
    rerank_url: str = typer.Option(
        "", "--rerank-url",
        help="Also measure memstream + the reranker at this /rerank endpoint ('fake': a word-overlap stand-in the bench serves).",
    ),
) -> None:
    """Evidence recall on LoCoMo: memstream against vector, BM25 and RRF baselines."""
    cutoffs = tuple(sorted({int(x) for x in k.split(",") if x.strip()}))
    _run("locomo", data=data, k=cutoffs, embedder=embedder or None, rerank_url=rerank_url or None)


@bench_app.command("ranking")
def bench_ranking(
    data: Path = typer.Option(..., exists=True, dir_okay=False, help="LoCoMo JSON (read in place, never copied)."),
    embedder: str = typer.Option("", help="onnx | local | minilm | openai (default: the configured one)"),
    workdir: Path = typer.Option(None, help="Keep the ingest here and reuse it (default: a temporary one)."),
    seed: int = typer.Option(41, help="Seed of the generated person-facts and mixed shapes (41: the one tuned on)."),
) -> None:
    """memstream, its embedder alone and BM25 alone on four shapes of memory store."""
    _run("ranking", data=data, embedder=embedder or None, workdir=workdir, seed=seed)


@bench_app.command("paraphrase")
def bench_paraphrase(
    embedder: str = typer.Option("", help="Comma-separated embedders (default: the configured one, then local)."),
) -> None:
    """Recall of facts asked for in other words (a set shipped with memstream)."""
    _run("paraphrase", embedders=tuple(e.strip() for e in embedder.split(",") if e.strip()))


@bench_app.command("mem0")
def bench_mem0(
    data: Path = typer.Option(..., exists=True, dir_okay=False),
    embedder: str = typer.Option("", help="onnx | local | minilm (default: the configured one)"),
) -> None:
    """memstream and Mem0 side by side on the same conversations and embedder."""
    _run("mem0", data=data, embedder=embedder or None)


@bench_app.command("gate")
def bench_gate() -> None:
    """The injection gate's catch and false-positive rates on its corpus."""
    _run("gate")


@bench_app.command("chaos")
def bench_chaos(
    quick: bool = typer.Option(False, "--quick"),
    sharded: bool = typer.Option(False, "--sharded", help="One shard per partition; report each shard's disk use."),
) -> None:
    """Fault injection: worker kills, broker restarts, bad inputs, a flaky LLM."""
    _run("chaos", quick=quick, sharded=sharded)


@bench_app.command("fold")
def bench_fold(
    seconds: float = typer.Option(60.0, "--seconds", min=1, help="How long to run the machine."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random steps."),
) -> None:
    """The fold machine: random steps on the real stack, every read compared with the reference model."""
    _run("fold", seconds=seconds, seed=seed)


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
