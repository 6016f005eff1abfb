"""Where a forget stands, from its records' positions and the projection's."""

from memstream.domain.log import LogPosition
from memstream.services.log_reads.forget_progress import ForgetProgress

FORGET = (LogPosition(topic="x.events", partition=1, offset=28), LogPosition(topic="x.messages", partition=1, offset=40))


def test_a_forget_is_applied_once_every_partition_passed_its_record() -> None:
    behind = ForgetProgress(FORGET, {("x.events", 1): 29, ("x.messages", 1): 40})
    assert behind.pending == [FORGET[1]] and not behind.applied
    assert "1/2 forget records applied" in behind.line() and "x.messages:1 at 40 (needs > 40)" in behind.line()
    done = ForgetProgress(FORGET, {("x.events", 1): 29, ("x.messages", 1): 41})
    assert done.applied and "2/2" in done.line()
    assert not ForgetProgress((), {}).applied
