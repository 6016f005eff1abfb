"""From decisions to ADD-only events with provenance."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from memstream.domain.content import content_hash
from memstream.domain.events import (
    EmbeddingPayload,
    LinkRelation,
    MemoryAdded,
    MemoryLinked,
    MemoryType,
    parse_event,
)
from memstream.domain.extraction.building import StageReport, build_events, record_items
from memstream.domain.extraction.dedup import link_id_for, memory_id_for
from memstream.domain.extraction.drafts import MemoryDraft
from memstream.domain.extraction.judgment import Action, Decision, store_all
from memstream.domain.extraction.parsing import parse_extraction
from tests.domain.extraction.helpers import SCOPE, T0, answer, draft, memory, window


EXTRACTION = StageReport(
    "llm",
    prompt_id="extraction",
    prompt_version="1",
    prompt_sha256="ab" * 32,
    model="m1",
    latency_ms=12.5,
    token_usage={"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
)
KEY = b"k" * 32
JUDGMENT = StageReport("llm", prompt_id="judgment", prompt_version="1", prompt_sha256="cd" * 32, model="m1", latency_ms=3.0)


def events_for(decisions: dict[int, Decision], drafts: list[MemoryDraft], **kw: Any):  # type: ignore[no-untyped-def]
    payload = EmbeddingPayload.from_vector("emb", [0.1, 0.2, 0.3])
    return build_events(
        scope=SCOPE,
        session_id="s1",
        drafts=drafts,
        decisions=decisions,
        embeddings=[payload] * len(drafts),
        extraction=kw.pop("extraction", EXTRACTION),
        judgment=kw.pop("judgment", JUDGMENT),
        input_refs=("m0", "m1"),
        batch_record=kw.pop("batch_record", [{"gate": "slash_command", "message_id": "m9"}]),
        recorded_at=T0 + timedelta(seconds=5),
        id_key=KEY,
        correlation_id="x-run",
        own_refs=kw.pop("own_refs", False),
    )


def test_actions_map_to_add_only_events() -> None:
    drafts = [
        draft("Ana now likes pepperoni pizza.", ("m1",), occurred_at=T0 + timedelta(minutes=1)),
        draft("Ana likes tea."),
        draft("Ana loves green tea."),
        draft("Ana said hi."),
    ]
    built = events_for(
        {
            0: Decision(0, Action.update, target="mem-cheese", links=(("mem-cheese", LinkRelation.preference_update),), reason="changed", decided_by="llm"),
            1: Decision(1, Action.store, decided_by="rule"),
            2: Decision(2, Action.merge, target="mem-tea", decided_by="llm"),
            3: Decision(3, Action.drop, reason="small talk", decided_by="llm"),
        },
        drafts,
    )
    assert built.rejected == ()
    kinds = [(type(e).__name__, getattr(e, "relation", None)) for e in built.events]
    assert kinds == [
        ("MemoryAdded", None),
        ("MemoryLinked", LinkRelation.supersedes),
        ("MemoryLinked", LinkRelation.preference_update),
        ("MemoryAdded", None),
        ("MemoryLinked", LinkRelation.duplicates),
    ]
    pepperoni, supersedes, pref, tea, merge = built.events
    assert isinstance(pepperoni, MemoryAdded) and isinstance(supersedes, MemoryLinked)
    assert pepperoni.memory_id == memory_id_for(SCOPE, content_hash(drafts[0].content), KEY)
    assert supersedes.from_memory_id == pepperoni.memory_id and supersedes.to_memory_id == "mem-cheese"
    assert supersedes.decided_by == "llm" and supersedes.reason == "changed"
    assert supersedes.link_id == link_id_for(pepperoni.memory_id, "mem-cheese", LinkRelation.supersedes)
    assert isinstance(merge, MemoryLinked) and merge.to_memory_id == "mem-tea"
    assert merge.from_memory_id == memory_id_for(SCOPE, content_hash("Ana loves green tea."), KEY)
    # the event's own time is when it was said; all share the run's correlation id
    assert pepperoni.occurred_at == T0 + timedelta(minutes=1)
    assert {e.correlation_id for e in built.events} == {"x-run"}
    assert {e.session_id for e in built.events} == {"s1"}
    assert all(e.producer == "memstream-extractor" for e in built.events)
    # provenance: a link names the draft's own turns and the judgment that decided it;
    # every event's record starts with its own decision, then the batch's; all valid
    assert supersedes.provenance is not None and merge.provenance is not None
    assert supersedes.provenance.input_refs == drafts[0].source_message_ids
    assert supersedes.provenance.method == "llm" and supersedes.provenance.prompt_id == JUDGMENT.prompt_id
    assert merge.provenance.decisions[0]["memory_id"] == merge.from_memory_id
    assert tea.provenance is not None and tea.provenance.method == EXTRACTION.method
    assert tea.provenance.decisions[0]["memory_id"] == tea.memory_id  # type: ignore[union-attr]
    assert tea.provenance.decisions[1:] == pepperoni.provenance.decisions[1:]  # type: ignore[union-attr]
    for event in built.events:
        assert parse_event(event.model_dump(mode="json")) == event


def test_every_event_carries_provenance_and_drops_stay_on_record() -> None:
    drafts = [draft("Ana likes tea."), draft("Ana said hi.")]
    built = events_for(
        {0: Decision(0, Action.store), 1: Decision(1, Action.drop, reason="small talk", decided_by="llm")},
        drafts,
    )
    (added,) = built.events
    assert isinstance(added, MemoryAdded)
    p = added.provenance
    assert p is not None
    assert (p.method, p.prompt_id, p.prompt_version, p.prompt_sha256, p.model) == (
        "llm", "extraction", "1", "ab" * 32, "m1",
    )
    assert p.input_refs == ("m0", "m1")
    assert p.output_refs == (added.memory_id,)
    assert p.latency_ms == 12.5
    assert p.token_usage == {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
    assert p.status == "ok"
    actions = [d.get("action") for d in p.decisions]
    assert actions[0] == "store"
    assert {"gate": "slash_command", "message_id": "m9"} in p.decisions
    dropped = [d for d in p.decisions if d.get("action") == "drop"]
    assert dropped and dropped[0]["content"] == "Ana said hi." and dropped[0]["reason"] == "small talk"
    # the event survives its own wire round trip
    assert parse_event(added.model_dump(mode="json")) == added


def test_own_refs_name_each_memory_s_own_turns_and_itself() -> None:
    drafts = [draft("Ana likes tea."), draft("Bo likes rum.", ("m1",))]
    shared = events_for(store_all(2, "heuristic"), drafts).events
    own = events_for(store_all(2, "heuristic"), drafts, own_refs=True).events
    assert [e.provenance.input_refs for e in shared] == [("m0", "m1")] * 2  # type: ignore[attr-defined]
    assert [e.provenance.input_refs for e in own] == [d.source_message_ids for d in drafts]  # type: ignore[attr-defined]
    assert [e.provenance.output_refs for e in own] == [(e.memory_id,) for e in own]  # type: ignore[attr-defined]
    # nothing else differs, and each event survives its wire round trip
    for a, b in zip(shared, own):
        assert a.model_dump(exclude={"event_id", "provenance"}) == b.model_dump(exclude={"event_id", "provenance"})
        assert a.provenance.decisions == b.provenance.decisions  # type: ignore[attr-defined]
        assert parse_event(b.model_dump(mode="json")) == b


def test_status_combines_a_repaired_extraction_and_a_failed_judgment() -> None:
    built = events_for(
        {0: Decision(0, Action.store, reason="judgment failed: stored all")},
        [draft("Ana likes tea.")],
        extraction=StageReport("llm", status="repaired", note="json repaired: trailing_comma"),
        judgment=StageReport("llm", status="failed", note="timeout"),
    )
    p = built.events[0].provenance  # type: ignore[attr-defined]
    assert p.status == "repaired+judgment_failed"
    assert p.note == "json repaired: trailing_comma; timeout"


def test_a_draft_that_cannot_be_an_event_is_rejected_alone() -> None:
    bad = MemoryDraft(
        content="Ana likes tea.",
        memory_type=MemoryType.persona,
        priority=50,
        source_message_ids=("not a valid id!",),
        occurred_at=T0,
    )
    built = events_for(store_all(2, "no candidates"), [bad, draft("Bo likes rum.")])
    assert [e.content for e in built.events] == ["Bo likes rum."]  # type: ignore[attr-defined]
    assert built.rejected[0]["issue"] == "invalid_memory"
    assert built.events[0].provenance.output_refs == (  # type: ignore[attr-defined]
        memory_id_for(SCOPE, content_hash("Bo likes rum."), KEY),
    )


def test_record_items_lists_gate_rejections_issues_and_duplicates() -> None:
    w = window("I love tea", "/clear")
    parsed = parse_extraction(answer(memory("Ana loves tea.", ["t1", "t5"])), w, max_memories=10)
    items = record_items(w, parsed.issues, [(draft("Ana loves tea."), "mem-old")])
    assert items[0] == {"gate": "slash_command", "message_id": "m1", "detail": "client command /clear"}
    assert items[1]["issue"] == "invented_source_ids"
    assert items[2] == {"action": "exact_duplicate", "memory_id": "mem-old", "content": "Ana loves tea."}
