"""When an outcome settles a decision, when a decision expires, and whether the call was right.

An outcome settles a decision only when it covers the decision's whole horizon, and only
in the same scope (team, user and agent) and subject; a decision with no outcome by its
deadline expires."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from memstream.domain.events import DecisionRecorded, OutcomeObserved, Rating
from memstream.domain.reflection.ratings import rating_direction

__all__ = [
    "HOLD_BAND",
    "SUBJECT_WINDOW_SLACK_DAYS",
    "OutcomeMatch",
    "covers_horizon",
    "match_outcome",
    "performance",
    "direction_correct",
]

HOLD_BAND = 0.02
"""A ``hold`` is right when the subject stayed within +/- 2 % of the benchmark (alpha)
over the horizon; outside the band a directional call would have been better."""

SUBJECT_WINDOW_SLACK_DAYS = 4
"""A subject-wide outcome (one without ``decision_id``) whose window is given settles
a decision only if the window starts on the decision's day or up to this many calendar
days later (a decision taken on a Friday evening is measured from Monday's close)."""


@dataclass(frozen=True)
class OutcomeMatch:
    """Whether an outcome settles a decision, and in words why (or why not)."""

    settles: bool
    reason: str

    def __bool__(self) -> bool:
        return self.settles


def covers_horizon(decision: DecisionRecorded, outcome: OutcomeObserved) -> bool:
    """True when the outcome measures at least the decision's whole horizon.

    Horizons count trading days. When the outcome gives its window, the window must
    also span at least ``horizon_days`` calendar days: trading days are a subset of
    calendar days, so a shorter calendar span cannot hold the horizon.
    """
    if outcome.horizon_days < decision.horizon_days:
        return False
    if outcome.window_start is not None and outcome.window_end is not None:
        if outcome.window_end - outcome.window_start < timedelta(days=decision.horizon_days):
            return False
    return True


def match_outcome(decision: DecisionRecorded, outcome: OutcomeObserved) -> OutcomeMatch:
    """Decide whether ``outcome`` settles ``decision``.

    Rules, in order:

    1. same scope (team, user and agent): an outcome never crosses tenants, and one
       agent's outcome never judges another agent's call (a key that may write for
       several agents settles an agent's decision by writing the outcome in that
       agent's scope; docs/security.md);
    2. same subject;
    3. an outcome naming a ``decision_id`` settles that decision only;
    4. the outcome covers the whole horizon (:func:`covers_horizon`);
    5. a subject-wide outcome (no ``decision_id``) must describe the time after the
       decision: its window, when given, starts on the decision's day or up to
       :data:`SUBJECT_WINDOW_SLACK_DAYS` later; without a window, it must have been
       observed after the decision was taken.
    """
    d_scope, o_scope = decision.scope, outcome.scope
    if (d_scope.team_id, d_scope.user_id) != (o_scope.team_id, o_scope.user_id):
        return OutcomeMatch(False, "outcome belongs to another memory space")
    if d_scope.agent_id != o_scope.agent_id:
        return OutcomeMatch(False, "outcome belongs to another agent")
    if outcome.subject != decision.subject:
        return OutcomeMatch(False, f"outcome is for {outcome.subject}, not {decision.subject}")
    if outcome.decision_id is not None and outcome.decision_id != decision.decision_id:
        return OutcomeMatch(False, f"outcome is for decision {outcome.decision_id}")
    if not covers_horizon(decision, outcome):
        return OutcomeMatch(
            False,
            f"outcome covers {outcome.horizon_days} of {decision.horizon_days} horizon days",
        )
    if outcome.decision_id is None:
        decided = decision.occurred_at
        if outcome.window_start is not None:
            start_day = outcome.window_start.date()
            first, last = decided.date(), decided.date() + timedelta(days=SUBJECT_WINDOW_SLACK_DAYS)
            if not first <= start_day <= last:
                return OutcomeMatch(
                    False,
                    f"outcome window starts {start_day}, outside {first}..{last} for this decision",
                )
        elif outcome.occurred_at < decided:
            return OutcomeMatch(False, "outcome was observed before the decision was taken")
    return OutcomeMatch(True, "outcome covers the whole horizon")


def performance(outcome: OutcomeObserved) -> tuple[float, str]:
    """The number a call is judged on and its name: the alpha against the benchmark
    when known (computed from the benchmark return when only that is given), else the
    raw return."""
    if outcome.alpha is not None:
        return outcome.alpha, "alpha"
    if outcome.benchmark_return is not None:
        return outcome.raw_return - outcome.benchmark_return, "alpha"
    return outcome.raw_return, "raw return"


def direction_correct(
    rating: Rating,
    alpha: float | None,
    raw_return: float | None = None,
    *,
    hold_band: float = HOLD_BAND,
) -> bool | None:
    """Was the call's direction right?

    Bullish calls (buy, overweight) are right when the subject beat the benchmark
    (alpha > 0), bearish ones (underweight, sell) when it lagged (alpha < 0), a hold
    when ``|alpha| <= hold_band``. Without an alpha the raw return stands in (the call
    is then judged against cash); with neither, the answer is ``None`` (unknown).
    """
    measure = alpha if alpha is not None else raw_return
    if measure is None or not math.isfinite(measure):
        return None
    direction = rating_direction(rating)
    if direction > 0:
        return measure > 0
    if direction < 0:
        return measure < 0
    return abs(measure) <= hold_band
