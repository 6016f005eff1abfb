"""Ids in log lines are keyed hashes: stable within a deployment, never the id itself."""

from memstream.streams.log_ids import log_id


def test_a_log_id_is_stable_short_and_not_the_id() -> None:
    assert log_id("sess-123") == log_id("sess-123") != log_id("sess-124")
    assert "sess-123" not in log_id("sess-123") and len(log_id("sess-123")) == 14
