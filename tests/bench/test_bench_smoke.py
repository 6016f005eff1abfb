"""The benchmark harness works end to end at a tiny size (no timing is asserted).

What must hold: each benchmark's core runs against the real broker, the real worker
and real LanceDB, returns its named figures, and its counts match what it produced;
the rows the search benchmark bulk-loads (memories, their L0 turns, entities) are
exactly the rows the real projector writes for the same events (otherwise it would time a table the product never
builds); ``memstream bench`` prints the JSON object as its last line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from memstream.bench import _events, freshness, projector, search
from memstream.cli import app
from memstream.domain.log import LogPosition, PositionedEvent
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.schema import ENTITIES, MEMORIES, MESSAGES
from memstream.projections.store.lance_store import LanceStore

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

_LOG_COLUMNS = {"log_topic", "log_partition", "log_offset", "event_id"}


def _finite_positive(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


def _sorted_rows(table: pa.Table, drop: set[str]) -> list[dict[str, object]]:
    keep = [c for c in table.column_names if c not in drop]
    rows = table.select(keep).to_pylist()
    return sorted(rows, key=lambda r: str(r["pk"]))


def test_bulk_rows_equal_what_the_projector_writes(tmp_path: Path) -> None:
    embedder = LocalEmbedder(_events.DIM)
    corpus = _events.make_corpus(120, spaces=3, entity_rate=0.5, seed=3)
    store = LanceStore(tmp_path / "lance", embedding_dim=_events.DIM)
    batch = [
        PositionedEvent(
            position=LogPosition(topic="bench.events", partition=0, offset=i),
            event=_events.memory_event(corpus, i, model_id=embedder.model_id),
        )
        for i in range(len(corpus))
    ] + [
        PositionedEvent(
            position=LogPosition(topic="bench.messages", partition=0, offset=i),
            event=_events.message_event(corpus, i),
        )
        for i in range(len(corpus))
    ]
    result = Projector(store, embedder).apply(batch)
    assert result.applied == 2 * len(corpus) and not result.failed

    projected = store.table(MEMORIES).to_arrow()
    built = _events.memory_rows(corpus, model_id=embedder.model_id)
    assert built.schema == projected.schema
    assert _sorted_rows(built, _LOG_COLUMNS) == _sorted_rows(projected, _LOG_COLUMNS)

    projected_messages = store.table(MESSAGES).to_arrow()
    built_messages = _events.message_rows(corpus)
    assert built_messages.num_rows == len(corpus)
    assert _sorted_rows(built_messages, _LOG_COLUMNS) == _sorted_rows(projected_messages, _LOG_COLUMNS)

    projected_entities = store.table(ENTITIES).to_arrow()
    built_entities = _events.entity_rows(corpus)
    assert built_entities.num_rows == sum(len(e) for e in corpus.entities) > 0
    assert _sorted_rows(built_entities, _LOG_COLUMNS) == _sorted_rows(projected_entities, _LOG_COLUMNS)


def test_superseded_rows_point_at_their_successor() -> None:
    corpus = _events.make_corpus(200, spaces=1, seed=4)
    rows = _events.memory_rows(corpus, model_id="m", superseded_every=50).to_pylist()
    superseded = [r for r in rows if r["superseded_by"]]
    assert [r["memory_id"] for r in superseded] == ["m000049", "m000099", "m000149"]  # m000199 has no successor
    ids = {r["memory_id"] for r in rows}
    assert all(r["status"] == "superseded" and r["superseded_by"] in ids for r in superseded)


def test_projector_bench(kafka_bootstrap: str) -> None:
    result = projector.run(events=500, repeats=1)
    assert result["events"] == 500
    for key in ("raw_consume_eps", "raw_lance_add_eps", "projector_eps", "ratio"):
        assert _finite_positive(result[key]), key
    assert result["ratio"] == pytest.approx(
        result["projector_eps"] / min(result["raw_consume_eps"], result["raw_lance_add_eps"])
    )
    serial = 1 / (1 / result["raw_consume_eps"] + 1 / result["raw_lance_add_eps"])
    assert result["serial_ceiling_eps"] == pytest.approx(serial)
    assert result["serial_ratio"] == pytest.approx(result["projector_eps"] / serial)
    assert all(len(v) == 1 for v in result["samples"].values())
    assert isinstance(result["meets_target"], bool)
    json.dumps(result)


def test_replay_bench_through_the_cli(kafka_bootstrap: str) -> None:
    outcome = CliRunner().invoke(app, ["bench", "replay", "--events", "400"])
    assert outcome.exit_code == 0, outcome.output
    result = json.loads(outcome.output.strip().splitlines()[-1])
    assert result["benchmark"] == "replay" and result["events"] == 400
    for key in ("raw_consume_eps", "raw_lance_add_eps", "replay_eps", "ratio", "replay_end_to_end_eps"):
        assert result[key] > 0, key
    assert result["replay_end_to_end_eps"] <= result["replay_eps"]
    assert len(result["samples"]["replay_eps"]) == result["repeats"] == 1


def test_search_bench() -> None:
    result = search.run(sizes=(1500,), queries=12)
    size = result["sizes"]["1500"]
    assert size["memories"] == result["memories"] == 1500
    assert size["queries"] == 12
    assert size["vector_index"] == "none (exact)"  # below the product's threshold
    assert size["hybrid_empty_results"] == 0 and size["raw_vector_short_results"] == 0
    for key in ("hybrid_p50_ms", "hybrid_p99_ms", "raw_vector_p50_ms", "ratio_p50"):
        assert _finite_positive(result[key]), key
    assert result["hybrid_p99_ms"] >= result["hybrid_p50_ms"]


def test_freshness_bench(kafka_bootstrap: str) -> None:
    result = freshness.run(rate=100, seconds=2)
    assert result["events"] == 200
    assert result["missing"] == 0
    assert _finite_positive(result["p99_visible_ms"])
    assert result["p99_visible_ms"] >= result["p50_visible_ms"]
    assert result["search_check"] == "20/20"
