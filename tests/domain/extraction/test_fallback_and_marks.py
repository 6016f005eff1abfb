"""The pure rules of the extractor's fallback and of its commits' resume marks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memstream.domain.extraction.fallback import FallbackReason, fallback_reason, fallback_record, fallback_windows
from memstream.domain.extraction.resume_marks import MAX_CHARS, ResumeMark, WindowBudget, decode_mark, encode_mark


def test_only_failures_no_retry_can_fix_fall_back_at_once() -> None:
    assert fallback_reason("refused", 400, "flagged by the content policy") is FallbackReason.refused
    assert fallback_reason("refused", 400, "maximum context length is 8192 tokens") is FallbackReason.context_length
    assert fallback_reason("http", 413, "Request too large") is FallbackReason.refused
    assert fallback_reason("parse", None, "no JSON object") is FallbackReason.unparseable
    for kind, status in [("timeout", None), ("connection", None), ("http", 500), ("http", 429), ("http", 408), ("empty", None)]:
        assert fallback_reason(kind, status, "try again") is None


def test_fallback_windows_are_read_back_from_their_memories_once_per_run() -> None:
    entry = fallback_record(
        FallbackReason.refused, "400 policy", run_id="x-1", attempts=1, window=["m1", "m2"], background=["m0"]
    )
    base = {"team_id": "t", "user_id": "u", "agent_id": "a", "session_id": "s", "recorded_at": "2026-01-01"}
    rows = [
        {**base, "memory_id": "a", "source_message_ids": ["m1"], "provenance": {"status": "fallback", "decisions": [entry]}},
        {**base, "memory_id": "b", "source_message_ids": ["m2"], "provenance": {"status": "fallback", "decisions": [entry]}},
        {**base, "memory_id": "c", "source_message_ids": ["m3"], "provenance": {"status": "ok", "decisions": []}},
    ]
    (window,) = fallback_windows(rows)
    assert (window.run_id, window.reason, window.window, window.background) == ("x-1", "refused", ("m1", "m2"), ("m0",))
    assert window.memories == {"a": ("m1",), "b": ("m2",)} and window.session_id == "s"
    assert fallback_windows(rows, retried=["x-1"]) == []


@given(
    commit=st.integers(0, 10**12),
    span=st.integers(0, 400),
    pending=st.sets(st.integers(0, 399), max_size=200),
)
def test_a_resume_mark_says_exactly_which_turns_after_the_commit_are_done(commit: int, span: int, pending: set[int]) -> None:
    end = commit + span
    offsets = {commit + p for p in pending if p < span}
    text = encode_mark(commit, end, offsets)
    assert len(text) <= MAX_CHARS
    mark = decode_mark(commit, text)
    if mark is None:  # nothing after the commit is done: every turn read again is pending
        assert text == "" and (span == 0 or len(offsets) == span)
        return
    for offset in range(commit, end + 3):
        assert mark.done(offset) == (offset < end and offset not in offsets)


def test_an_unknown_or_broken_mark_means_every_turn_is_pending() -> None:
    assert decode_mark(5, "") is None and decode_mark(5, "some other tool") is None
    assert decode_mark(5, "x1:zz:!!") is None


@given(
    commit=st.integers(0, 10**12),
    span=st.integers(1, 400),
    pending=st.sets(st.integers(0, 399), max_size=50),
    budgets=st.dictionaries(
        st.integers(0, 399), st.tuples(st.integers(0, 50), st.integers(0, 4 * 10**12)), max_size=20
    ),
)
def test_a_resume_mark_carries_the_budgets_of_the_windows_after_its_commit(
    commit: int, span: int, pending: set[int], budgets: dict[int, tuple[int, int]]
) -> None:
    end = commit + span
    offsets = {commit + p for p in pending if p < span}
    given_budgets = {commit + o: WindowBudget(f, ms / 1000) for o, (f, ms) in budgets.items()}
    mark = decode_mark(commit, encode_mark(commit, end, offsets, given_budgets))
    kept = {o: b for o, b in given_budgets.items() if o < end}
    if mark is None:  # nothing done and no budget after the commit
        assert not kept and len(offsets) == span
        return
    assert dict(mark.budgets) == kept
    for offset in range(commit, end + 3):
        assert mark.done(offset) == (offset < end and offset not in offsets)
    assert decode_mark(commit, encode_mark(commit, end, offsets)) == (
        None if len(offsets) == span else ResumeMark(mark.end, mark.pending)
    )
