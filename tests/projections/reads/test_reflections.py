"""Injection: ``context_for`` over reflections projected into a real LanceDB store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import typer
from tests.projections.projection_helpers import DIM, T0, positioned
from typer.testing import CliRunner

from memstream.cli import reflect
from memstream.cli._errors import CLIError
from memstream.domain.events import MemoryReflected, Provenance, Rating, Scope
from memstream.domain.reflection import estimate_tokens, reflection_id_for
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.reads.reflections import context_for, list_reflections
from memstream.projections.store.lance_store import LanceStore, ScopeRequiredError
from memstream.settings.model import get_settings

ANA = Scope(team_id="acme", user_id="ana", agent_id="trader")
ANA_RISK = Scope(team_id="acme", user_id="ana", agent_id="risk")
BOB = Scope(team_id="acme", user_id="bob")
GLOBEX = Scope(team_id="globex", user_id="ana")


def reflected(scope: Scope, n: int, subject: str, *, day: int | None = None) -> MemoryReflected:
    did = f"d-{subject}-{n}"
    return MemoryReflected(
        scope=scope,
        occurred_at=T0 + timedelta(days=day if day is not None else n),
        reflection_id=reflection_id_for(scope, did),
        decision_id=did,
        outcome_id=f"o-{subject}-{n}",
        subject=subject,
        rating=Rating.buy,
        decision_text=f"Decision {n} on {subject}: the thesis for {scope.team_id}.",
        raw_return=0.01 * n,
        alpha=0.002 * n,
        correct=True,
        content=f"Reflection {n} on {subject} in {scope.team_id}/{scope.user_id}. Lesson: keep {n}.",
        lesson=f"keep {n}.",
        templated=True,
        provenance=Provenance(method="template"),
    )


@pytest.fixture
def loaded(store: LanceStore, projector: Projector) -> LanceStore:
    events = (
        [reflected(ANA, n, "AAPL") for n in range(1, 8)]
        + [reflected(ANA_RISK, 8, "AAPL")]
        # 15 other-subject reflections, oldest first, so the newest are the last rows
        + [reflected(ANA, n, f"X{n:02d}", day=20 + n) for n in range(15)]
        + [reflected(GLOBEX, n, "AAPL", day=100 + n) for n in range(3)]
        + [reflected(BOB, n, "AAPL", day=100 + n) for n in range(3)]
    )
    result = projector.apply(positioned(events))
    assert not result.failed
    assert store.count("reflections") == len(events)
    return store


def test_context_has_five_same_subject_and_three_others_newest_first(loaded: LanceStore) -> None:
    ctx = context_for(loaded, ANA, "AAPL", 5_000)
    assert [r.decision_id for r in ctx.same_subject] == [f"d-AAPL-{n}" for n in (8, 7, 6, 5, 4)]
    assert [r.subject for r in ctx.other_subjects] == ["X14", "X13", "X12"]
    text = ctx.text
    assert text.index("Reflection 8 on AAPL") < text.index("Reflection 4 on AAPL") < text.index("Reflection 14 on X14")
    assert "Decision: Decision 7 on AAPL" in text  # same subject: decision, outcome, reflection
    assert "alpha +1.4%" in text and "return +7.0%" in text
    assert "Decision 14 on X14" not in text  # other subjects: the reflection only
    assert "globex" not in text and "acme/bob" not in text  # never another space
    assert ctx.token_estimate == estimate_tokens(text) <= 5_000


def test_context_respects_a_small_budget(loaded: LanceStore) -> None:
    full = context_for(loaded, ANA, "AAPL", 5_000)
    small = context_for(loaded, ANA, "AAPL", full.token_estimate // 3)
    assert 0 < small.token_estimate <= full.token_estimate // 3
    assert small.omitted > 0
    assert list(small.same_subject) == list(full.same_subject)[: len(small.same_subject)]


def test_context_can_be_narrowed_to_one_agent(loaded: LanceStore) -> None:
    ctx = context_for(loaded, ANA_RISK, "AAPL", 5_000, same_agent=True)
    assert [r.decision_id for r in ctx.same_subject] == ["d-AAPL-8"]
    assert ctx.other_subjects == ()


def test_other_tenants_and_users_are_isolated(loaded: LanceStore) -> None:
    ctx = context_for(loaded, GLOBEX, "AAPL", 5_000)
    assert [r.decision_id for r in ctx.same_subject] == ["d-AAPL-2", "d-AAPL-1", "d-AAPL-0"]
    assert all("globex" in r.content for r in ctx.same_subject)
    assert ctx.other_subjects == ()


def test_a_scope_is_required(loaded: LanceStore) -> None:
    with pytest.raises(ScopeRequiredError):
        context_for(loaded, None, "AAPL", 500)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        context_for(loaded, ANA, " ", 500)


def test_empty_store_gives_empty_context(store: LanceStore) -> None:
    ctx = context_for(store, ANA, "AAPL", 500)
    assert ctx.empty and ctx.text == "" and ctx.token_estimate == 0


def test_a_reprojected_reflection_appears_once(store: LanceStore, projector: Projector) -> None:
    event = reflected(ANA, 1, "AAPL")
    projector.apply(positioned([event]))
    projector.apply(positioned([event], start=10))  # the same event emitted again
    ctx = context_for(store, ANA, "AAPL", 1_000)
    assert len(ctx.same_subject) == 1


def test_list_reflections_newest_first(loaded: LanceStore) -> None:
    rows = list_reflections(loaded, ANA, limit=4)
    assert [r.subject for r in rows] == ["X14", "X13", "X12", "X11"]
    aapl = list_reflections(loaded, ANA, subject="AAPL", limit=50)
    assert [r.decision_id for r in aapl] == [f"d-AAPL-{n}" for n in range(8, 0, -1)]
    assert all(r.templated for r in aapl)


# ----------------------------------------------------------------------- the CLI


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "cli-lance"
    monkeypatch.setenv("MEMSTREAM_EMBEDDINGS_PROVIDER", "local")
    monkeypatch.setenv("MEMSTREAM_EMBEDDINGS_DIM", str(DIM))
    monkeypatch.setenv("MEMSTREAM_STORAGE_ROOT", str(root))
    get_settings.cache_clear()
    store = LanceStore(root, embedding_dim=DIM)
    events = [reflected(ANA, n, "AAPL") for n in range(1, 4)] + [reflected(ANA, 9, "MSFT"), reflected(GLOBEX, 5, "AAPL")]
    Projector(store, LocalEmbedder(DIM)).apply(positioned(events))
    yield root
    get_settings.cache_clear()


def _cli() -> typer.Typer:
    app = typer.Typer()
    reflect.register(app)
    return app


def test_cli_context_prints_the_injected_lessons(cli_env: Path) -> None:
    result = CliRunner().invoke(
        _cli(),
        ["reflections", "context", "--subject", "AAPL", "--team", "acme", "--user", "ana", "--budget", "2000"],
        catch_exceptions=False,
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert result.output.index("Reflection 3 on AAPL") < result.output.index("Reflection 1 on AAPL")
    assert "Reflection 9 on MSFT" in result.output and "globex" not in result.output
    as_json = CliRunner().invoke(
        _cli(),
        ["reflections", "context", "--subject", "AAPL", "--team", "acme", "--user", "ana", "--json"],
        catch_exceptions=False,
    )
    payload = json.loads(as_json.output)
    assert [r["decision_id"] for r in payload["same_subject"]] == ["d-AAPL-3", "d-AAPL-2", "d-AAPL-1"]
    assert payload["token_estimate"] <= payload["budget_tokens"]


def test_cli_list_shows_the_newest_reflections_of_the_space(cli_env: Path) -> None:
    result = CliRunner().invoke(
        _cli(),
        ["reflections", "list", "--team", "acme", "--user", "ana", "--json", "--limit", "2"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert [r["subject"] for r in rows] == ["MSFT", "AAPL"]


def test_cli_without_a_projection_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSTREAM_STORAGE_ROOT", str(tmp_path / "nothing-here"))
    get_settings.cache_clear()
    try:
        with pytest.raises(CLIError, match="no projection"):
            CliRunner().invoke(
                _cli(),
                ["reflections", "context", "--subject", "AAPL", "--team", "acme", "--user", "ana"],
                catch_exceptions=False,
            )
    finally:
        get_settings.cache_clear()


def test_cli_prints_tenant_text_as_text_never_as_markup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a lesson holding rich markup crashed `reflections list` with a traceback
    root = tmp_path / "markup-lance"
    monkeypatch.setenv("MEMSTREAM_EMBEDDINGS_DIM", str(DIM))
    monkeypatch.setenv("MEMSTREAM_STORAGE_ROOT", str(root))
    get_settings.cache_clear()
    try:
        store = LanceStore(root, embedding_dim=DIM)
        event = reflected(ANA, 1, "AAPL").model_copy(update={"content": "Sold too early [/bold] [red]x[/red] [link=y]"})
        Projector(store, LocalEmbedder(DIM)).apply(positioned([event]))
        result = CliRunner().invoke(
            _cli(), ["reflections", "list", "--team", "acme", "--user", "ana"], catch_exceptions=False,
            env={"COLUMNS": "300"},
        )
        assert result.exit_code == 0, result.output
        assert "[/bold] [red]x[/red] [link=y]" in result.output
    finally:
        get_settings.cache_clear()
