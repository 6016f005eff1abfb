"""``memstream.cli._common``: the space from options, the projection opened read-only,
rows made JSON."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pytest

from memstream.cli._common import jsonable, open_store, scope_from_options
from memstream.cli._errors import CLIError
from memstream.settings.model import Settings


def test_a_command_never_runs_without_a_team() -> None:
    with pytest.raises(CLIError, match="--team is required"):
        scope_from_options("  ")


def test_empty_user_and_agent_mean_default() -> None:
    scope = scope_from_options("acme", "", "")
    assert (scope.team_id, scope.user_id, scope.agent_id) == ("acme", "default", "default")


def test_a_malformed_id_is_one_line() -> None:
    with pytest.raises(CLIError) as caught:
        scope_from_options("acme", "al\nice")
    assert "\n" not in str(caught.value)


def test_a_missing_projection_is_refused_and_not_created(tmp_path: Path) -> None:
    root = tmp_path / "lance"
    with pytest.raises(CLIError, match="no projection in"):
        open_store(Settings(home=tmp_path), root)
    assert not (root / "memories.lance").exists()


@dataclass
class _Row:
    at: datetime
    score: float


def test_jsonable_makes_rows_json() -> None:
    at = datetime(2026, 12, 1, 13, 0, tzinfo=timezone(timedelta(hours=2)))
    value = jsonable({"rows": [_Row(at, math.nan)], "day": date(2026, 12, 1), "raw": b"\x01\xff", "n": (1, 2.5)})
    assert value == {
        "rows": [{"at": "2026-12-01T11:00:00Z", "score": None}],
        "day": "2026-12-01",
        "raw": "01ff",
        "n": [1, 2.5],
    }
    json.dumps(value, allow_nan=False)
