"""The event consumer: what it refuses to be set up to read."""

from __future__ import annotations

import pytest

from memstream.streams.consumer import EventConsumer
from memstream.streams.topics import Topics


def test_a_consumer_never_reads_its_own_dead_letters() -> None:
    topics = Topics(prefix="x.")
    with pytest.raises(ValueError):
        EventConsumer([topics.events, topics.dead_letter], group_id="g", dead_letter_topic=topics.dead_letter)
