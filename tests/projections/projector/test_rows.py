"""The fast read path and its column-built rows give exactly the tables the general
path (pydantic events, per-event handlers) gives: same rows, same columns, same view."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memstream.codec.fast_decode import FastMemoryDecoder
from memstream.codec.wire import encode_event
from memstream.domain.events import EventBase, MessageObserved, Provenance, Scope
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.schema import POSITIONS, TABLE_NAMES
from memstream.projections.store.lance_store import LanceStore
from memstream.projections.store.positions import VERSION_TOPIC
from memstream.services.projector.runtime import apply_decoded
from memstream.streams.records.batches import DecodedBatch, RawRecord, decode_batch
from tests.projections.projection_helpers import DIM, EVENTS_TOPIC, T0, carried, link, memory

EMBEDDER = LocalEmbedder(DIM)
ALICE = Scope(team_id="acme", user_id="alice", agent_id="planner")
BOB = Scope(team_id="acme", user_id="bob")


def _vec(seed: int) -> list[float]:
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32).tolist()


def _m(scope: Scope, mid: str, content: str, seed: int, **fields: Any) -> Any:
    return memory(scope, mid, content, embedding=carried(_vec(seed), EMBEDDER.model_id), **fields)


def _log() -> list[EventBase]:
    """Memories of every shape (most with a vector of the projector's model, so they
    take the fast path), links before and after their memories, a re-added id,
    memories without a vector (fast path, embedded by the projector), one of another
    model (general path), a message."""
    later = T0.replace(hour=18)
    return [
        MessageObserved(scope=ALICE, message_id="turn-1", content="I love cheese pizza", occurred_at=T0),
        _m(ALICE, "m1", "Alice likes cheese pizza", 1, source_message_ids=("turn-1",),
           entities=[("Alice", "person"), ("ALICE", "person"), ("Naples", "location")],
           metadata={"source": "chat", "score": 0.5, "tags": ["a", "b"]}, scene="dinner\nat home",
           session_id="s-1", priority=80, memory_type="persona"),
        link(ALICE, "m3", "m2", "duplicates"),
        _m(ALICE, "m2", "Alice enjoys cheese pizza a lot", 2, timestamp=T0,
           timestamp_start=T0, timestamp_end=later,
           provenance=Provenance(method="llm", model="m", input_refs=("memstream.messages:0:1",))),
        _m(ALICE, "m3", "Alice enjoys cheese pizza very much", 3),
        memory(ALICE, "m4", "Alice now prefers pepperoni pizza", entities=[("Alice", "person")]),
        link(ALICE, "m4", "m1", "supersedes"),
        _m(BOB, "m1", "Bob drives a red car", 4, entities=[("Car", "product")]),
        _m(BOB, "m5", "Bob has a dog", 5, entities=[("Rex", "other")]),
        memory(BOB, "m6", "Bob reads novels", embedding=carried(_vec(6), "another-model")),
        _m(BOB, "m5", "Bob has a dog named Rex", 7, entities=[("Dog", "other")]),  # re-added
        memory(BOB, "m1", "Bob drives a blue car"),  # re-added on the general path
        _m(ALICE, "m7", "Alice plans a trip to Porto", 8, recorded_at=later),
        link(BOB, "m5", "m6", "contradicts"),
    ]


def _records(events: list[EventBase]) -> list[RawRecord]:
    out = []
    for offset, event in enumerate(events):
        rec = encode_event(event)
        out.append(RawRecord(EVENTS_TOPIC, 0, offset, rec.key, rec.value, tuple(rec.headers)))
    return out


def _tables(store: LanceStore) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for name in TABLE_NAMES:
        rows = store.table(name).to_arrow().to_pylist()
        if name == POSITIONS:  # the log positions (not the table versions published with them)
            rows = [r for r in rows if not r["topic"].startswith(VERSION_TOPIC)]
        for row in rows:
            row.pop("updated_at", None)  # when a position was written, not what
        key = "pk" if rows and "pk" in rows[0] else next(iter(rows[0])) if rows else ""
        out[name] = sorted(rows, key=lambda r: str(r.get(key)))
    return out


def _project(
    tmp_path: Path, name: str, records: list[RawRecord], cuts: list[int], fast: bool
) -> tuple[LanceStore, list[DecodedBatch]]:
    store = LanceStore(tmp_path / name, embedding_dim=DIM)
    projector = Projector(store, LocalEmbedder(DIM))
    decoder = FastMemoryDecoder(EMBEDDER.model_id, DIM) if fast else None
    batches = []
    for lo, hi in zip([0, *cuts], [*cuts, len(records)]):
        decoded = decode_batch(records[lo:hi], decoder)
        batches.append(decoded)
        result = apply_decoded(projector, decoded)
        assert result.failed == []
    return store, batches


@pytest.mark.parametrize("cuts", [[], [3], [2, 6, 11], list(range(1, 14))])
def test_fast_path_tables_equal_general_path_tables(tmp_path: Path, cuts: list[int]) -> None:
    records = _records(_log())  # once: events get random ids and times when built
    general, _ = _project(tmp_path, "general", records, cuts, fast=False)
    fast, batches = _project(tmp_path, "fast", records, cuts, fast=True)
    taken = sum(len(b.memories) for b in batches if b.memories is not None)
    assert taken == 9  # every memory with a vector of the projector's model, or none
    assert _tables(fast) == _tables(general)
    view = {r["pk"]: (r["superseded_by"], r["canonical_id"], r["status"]) for r in _tables(fast)["memories"]}
    assert view["acme|alice|m1"] == ("m4", None, "superseded")
    assert view["acme|alice|m3"] == (None, "m2", "duplicate")
    assert view["acme|bob|m6"] == ("m5", None, "superseded")


def test_fast_path_apply_is_idempotent(tmp_path: Path) -> None:
    store, batches = _project(tmp_path, "fast", _records(_log()), [5], fast=True)
    before = _tables(store)
    projector = Projector(store, LocalEmbedder(DIM))
    for decoded in batches:
        result = apply_decoded(projector, decoded)
        assert result.applied == 0 and result.skipped > 0
    assert _tables(store) == before
    # rows written but positions lost (a crash between the two): applied again, the
    # tables do not change (no duplicate rows, same view)
    store.table(POSITIONS).delete("true")
    restarted = Projector(store, LocalEmbedder(DIM))
    for decoded in batches:
        apply_decoded(restarted, decoded)
    after = _tables(store)
    assert after.pop(POSITIONS) == before.pop(POSITIONS)
    assert after == before


def test_a_non_finite_vector_is_dead_lettered_by_the_general_path(tmp_path: Path) -> None:
    bad = memory(ALICE, "m9", "broken vector")
    record = encode_event(bad)
    # Hand-made: a payload the SDK would refuse to build, as another producer might send it.
    data = base64.b64encode(np.full(DIM, np.inf, dtype="<f4").tobytes())
    payload = b'"embedding":{"model":"%s","dim":%d,"data":"%s"}' % (EMBEDDER.model_id.encode(), DIM, data)
    body = record.value.replace(b'"embedding":null', payload)
    assert body != record.value
    good = _records([_m(ALICE, "m8", "fine", 9)])[0]
    records = [RawRecord(EVENTS_TOPIC, 0, 0, record.key, body, tuple(record.headers)),
               RawRecord(EVENTS_TOPIC, 0, 1, good.key, good.value, good.headers)]
    decoded = decode_batch(records, FastMemoryDecoder(EMBEDDER.model_id, DIM))
    assert decoded.memories is not None and decoded.memories.positions == [(EVENTS_TOPIC, 0, 1)]
    assert [d.source_offset for d in decoded.dead] == [0]
    assert "NaN or infinite" in decoded.dead[0].reason


class _CountingEmbedder(LocalEmbedder):
    """The local embedder, recording each batch of texts it is asked for."""

    def __init__(self) -> None:
        super().__init__(DIM)
        self.calls: list[list[str]] = []

    def embed_array(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return super().embed_array(texts)


def test_memories_without_a_vector_are_embedded_once_per_batch_in_one_call(tmp_path: Path) -> None:
    records = _records([
        memory(ALICE, "a", "Alice walks her dog at dawn"),
        memory(BOB, "b", "Bob reads novels", embedding=carried(_vec(6), "another-model")),
        _m(ALICE, "c", "Alice has a vector already", 3),
        memory(ALICE, "a", "Alice walks her dog at dusk"),  # re-added: only this version is written
    ])
    decoded = decode_batch(records, FastMemoryDecoder(EMBEDDER.model_id, DIM))
    assert decoded.memories is not None and decoded.memories.unembedded == [0, 2]
    embedder = _CountingEmbedder()
    store = LanceStore(tmp_path / "s", embedding_dim=DIM)
    assert apply_decoded(Projector(store, embedder), decoded).failed == []
    # one call: the general path's memory of another model, then the fast path's
    assert embedder.calls == [["Bob reads novels", "Alice walks her dog at dusk"]]
    rows = {r["memory_id"]: r for r in store.table("memories").to_arrow().to_pylist()}
    for mid in ("a", "b"):
        want = EMBEDDER.embed_array([rows[mid]["content"]])[0]
        assert np.array_equal(np.asarray(rows[mid]["vector"], dtype=np.float32), want)
    assert np.array_equal(np.asarray(rows["c"]["vector"], dtype=np.float32), np.asarray(_vec(3), dtype=np.float32))
    # applied again (positions already stored): nothing is embedded
    assert apply_decoded(Projector(store, embedder), decoded).applied == 0
    assert len(embedder.calls) == 1


def test_a_batch_embedded_ahead_is_written_without_another_call(tmp_path: Path) -> None:
    """The worker embeds a decoded batch on its own thread while the batch before is
    written; the write then finds every vector there (the same rows as embedding in
    the write), and a batch applied without it still embeds what is missing."""
    records = _records([
        memory(ALICE, "a", "Alice walks her dog at dawn"),
        memory(BOB, "b", "Bob reads novels", embedding=carried(_vec(6), "another-model")),
        _m(ALICE, "c", "Alice has a vector already", 3),
        memory(ALICE, "d", "Alice plants tulips"),
    ])
    ahead = decode_batch(records, FastMemoryDecoder(EMBEDDER.model_id, DIM))
    embedder = _CountingEmbedder()
    store = LanceStore(tmp_path / "ahead", embedding_dim=DIM)
    projector = Projector(store, embedder)
    assert projector.embed_ahead(ahead.events, ahead.memories) == 3
    assert embedder.calls == [["Bob reads novels", "Alice walks her dog at dawn", "Alice plants tulips"]]
    assert ahead.memories is not None and ahead.memories.unembedded == []
    assert apply_decoded(projector, ahead).failed == []
    assert len(embedder.calls) == 1  # nothing left to embed at write time
    plain = LanceStore(tmp_path / "plain", embedding_dim=DIM)
    apply_decoded(Projector(plain, LocalEmbedder(DIM)), decode_batch(records, FastMemoryDecoder(EMBEDDER.model_id, DIM)))

    def rows(s: LanceStore) -> dict[str, Any]:
        return {r["memory_id"]: r["vector"] for r in s.table("memories").to_arrow().to_pylist()}

    assert rows(store) == rows(plain)
    assert projector._ahead == {}  # nothing kept once its batch is written


# --- the map from events to rows --------------------------------------------------------

from memstream.codec.values import value_names  # noqa: E402
from memstream.domain.events import MemoryAdded, MemoryLinked, MemoryReflected  # noqa: E402
from memstream.projections.projector.rows import DERIVED, UNSTORED_FIELDS  # noqa: E402
from memstream.projections.schema import LINKS, MEMORIES, MESSAGES, REFLECTIONS, schema_for  # noqa: E402

EVENT_OF_TABLE = {MEMORIES: MemoryAdded, MESSAGES: MessageObserved, LINKS: MemoryLinked, REFLECTIONS: MemoryReflected}


@pytest.mark.parametrize("table", sorted(EVENT_OF_TABLE))
def test_every_field_of_an_event_is_a_column_of_its_table_or_listed_as_unstored(table: str) -> None:
    """A field added to an event needs a column of the same name in its table (or a
    line in ``UNSTORED_FIELDS`` saying why it is not kept)."""
    columns = set(schema_for(table, DIM).names)
    fields = set(value_names(EVENT_OF_TABLE[table])) | ({"embedding"} if table == MEMORIES else set())
    missing = fields - columns - UNSTORED_FIELDS[table] - set(DERIVED[table])
    assert not missing, f"{table} keeps no column for {sorted(missing)}"
    assert not (UNSTORED_FIELDS[table] & columns), "a field listed as unstored has a column"


@pytest.mark.parametrize("table", sorted(EVENT_OF_TABLE))
def test_every_column_is_an_event_field_or_derived(table: str) -> None:
    fields = set(value_names(EVENT_OF_TABLE[table]))
    for name in schema_for(table, DIM).names:
        assert name in fields or name in DERIVED[table], name
