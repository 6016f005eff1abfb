"""``memstream search``, ``sql`` and ``export`` over a real projection on disk."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import typer
from tests.projections.projection_helpers import DIM, link, memory, positioned
from typer.testing import CliRunner

from memstream.bench.openai_fake import OpenAICompatServer, Reply
from memstream.cli import analytics
from memstream.cli._errors import CLIError
from memstream.domain.events import Scope
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.projector.projector import Projector
from memstream.projections.store.lance_store import LanceStore
from memstream.settings.model import get_settings

ALICE = Scope(team_id="acme", user_id="alice")


@pytest.fixture
def lance_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "lance"
    monkeypatch.setenv("MEMSTREAM_EMBEDDINGS_PROVIDER", "local")  # the lexical embedder at a small width
    monkeypatch.setenv("MEMSTREAM_EMBEDDINGS_DIM", str(DIM))
    monkeypatch.setenv("MEMSTREAM_STORAGE_ROOT", str(root))
    get_settings.cache_clear()
    store = LanceStore(root, embedding_dim=DIM)
    Projector(store, LocalEmbedder(DIM)).apply(
        positioned(
            [
                memory(ALICE, "old", "Alice likes cheese pizza", entities=[("Alice", "person")], memory_type="persona"),
                memory(ALICE, "new", "Alice now prefers pepperoni pizza", entities=[("Alice", "person")]),
                link(ALICE, "new", "old", "supersedes"),
                memory(Scope(team_id="other", user_id="alice"), "x", "Secret pizza of another team"),
            ]
        )
    )
    yield root
    get_settings.cache_clear()


@pytest.fixture
def cli() -> typer.Typer:
    app = typer.Typer()
    analytics.register(app)
    return app


def _run(cli: typer.Typer, *args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_search_prints_results_of_the_space_only(cli: typer.Typer, lance_dir: Path) -> None:
    out = _run(cli, "search", "pizza", "--team", "acme", "--user", "alice")
    assert "Alice now prefers pepperoni pizza" in out and "superseded by new" in out
    assert "Secret" not in out
    assert out.index("pepperoni") < out.index("cheese")
    explained = _run(cli, "search", "pizza", "--team", "acme", "--user", "alice", "--explain")
    assert "supersession 0.500" in explained and "bm25" in explained


def test_search_json_filters_and_entity_listing(cli: typer.Typer, lance_dir: Path) -> None:
    rows = [json.loads(line) for line in _run(cli, "search", "pizza", "--team", "acme", "--user", "alice", "--json", "--explain").splitlines()]
    assert [r["memory_id"] for r in rows] == ["new", "old"]
    assert rows[1]["parts"]["supersession"] == 0.5
    current = _run(cli, "search", "pizza", "--team", "acme", "--user", "alice", "--current-only", "--json")
    assert [json.loads(line)["memory_id"] for line in current.splitlines()] == ["new"]
    persona = _run(cli, "search", "pizza", "--team", "acme", "--user", "alice", "--type", "preference", "--json")
    assert [json.loads(line)["memory_id"] for line in persona.splitlines()] == ["old"]
    listing = _run(cli, "search", "--entity", "alice", "--team", "acme", "--user", "alice", "--json")
    assert {json.loads(line)["memory_id"] for line in listing.splitlines()} == {"new", "old"}
    window = _run(cli, "search", "pizza", "--team", "acme", "--user", "alice", "--since", "2030-01-01", "--json")
    assert window.strip() == ""


def test_search_rerank_goes_through_the_configured_reranker(
    cli: typer.Typer, lance_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(CLIError, match="--rerank needs a reranker"):
        CliRunner().invoke(cli, ["search", "pizza", "--team", "acme", "--user", "alice", "--rerank"], catch_exceptions=False)
    with OpenAICompatServer() as fake:
        monkeypatch.setenv("MEMSTREAM_EMBEDDINGS_RERANK_URL", fake.base_url)
        get_settings.cache_clear()
        for word in ("cheese", "pepperoni"):  # the reranker alone decides which comes first
            fake.rerank.responder = lambda body, word=word: Reply(scores=[1.0 if word in d else 0.0 for d in body["documents"]])
            rows = [json.loads(line) for line in _run(
                cli, "search", "pizza", "--team", "acme", "--user", "alice", "--rerank", "--json", "--explain"
            ).splitlines()]
            assert word in rows[0]["content"] and rows[0]["parts"]["rerank"] == 1.0
        assert [body["query"] for body in fake.rerank.requests] == ["pizza", "pizza"]


def test_search_refuses_without_team(cli: typer.Typer, lance_dir: Path) -> None:
    with pytest.raises(CLIError, match="--team is required"):
        CliRunner().invoke(cli, ["search", "pizza"], catch_exceptions=False)
    with pytest.raises(CLIError, match="unknown memory type"):
        CliRunner().invoke(cli, ["search", "pizza", "--team", "acme", "--type", "gossip"], catch_exceptions=False)


def test_sql_over_the_tables(cli: typer.Typer, lance_dir: Path) -> None:
    out = _run(cli, "sql", "SELECT memory_type, count(*) AS n FROM memories GROUP BY 1 ORDER BY 1", "--json")
    assert [json.loads(line) for line in out.splitlines()] == [
        {"memory_type": "episodic", "n": 2},
        {"memory_type": "persona", "n": 1},
    ]
    joined = _run(
        cli, "sql",
        "SELECT m.memory_id, l.relation FROM memories m JOIN links l ON l.to_pk = m.pk ORDER BY 1", "--json",
    )
    assert [json.loads(line) for line in joined.splitlines()] == [{"memory_id": "old", "relation": "supersedes"}]
    table = _run(cli, "sql", "SELECT memory_id, superseded_by FROM memories ORDER BY memory_id")
    assert "null" in table and "old" in table
    with pytest.raises(CLIError, match="SQL"):
        CliRunner().invoke(cli, ["sql", "SELEKT 1"], catch_exceptions=False)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM read_csv('{secret}')",
        "SELECT * FROM read_text('{secret}')",
        "COPY (SELECT memory_id FROM memories) TO '{out}'",
        "ATTACH '{out}.db' AS other",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
    ],
)
def test_sql_has_no_external_access_unless_allowed(cli: typer.Typer, lance_dir: Path, tmp_path: Path, query: str) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("password\nhunter2\n")
    out = tmp_path / "out.csv"
    with pytest.raises(CLIError, match="SQL"):
        CliRunner().invoke(cli, ["sql", query.format(secret=secret, out=out)], catch_exceptions=False)
    assert not out.exists() and not (tmp_path / "out.csv.db").exists()


def test_sql_allow_files_turns_access_back_on(cli: typer.Typer, lance_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "data.csv"
    data.write_text("x\n41\n")
    out = _run(cli, "sql", f"SELECT x + 1 AS y FROM read_csv('{data}')", "--json", "--allow-files")
    assert json.loads(out) == {"y": 42}


def test_positions_read_as_the_furthest_row_per_partition(cli: typer.Typer, lance_dir: Path, tmp_path: Path) -> None:
    store = LanceStore(lance_dir, embedding_dim=DIM)
    before = store.positions()
    (topic, partition), offset = next(iter(sorted(before.items())))
    # positions are appended; the rows behind stay until the worker prunes them
    store.save_positions({(topic, partition): offset + 5})
    store.save_positions({(topic, partition): offset + 9, ("other.topic", 0): 3})
    assert store.count("positions", "topic NOT LIKE 'lance:%'") == len(before) + 3  # (not the table versions)
    want = {**{f"{t}|{p}": o for (t, p), o in before.items()}, f"{topic}|{partition}": offset + 9, "other.topic|0": 3}
    out = _run(cli, "sql", "SELECT topic, partition, next_offset FROM positions", "--json")
    got = {f"{r['topic']}|{r['partition']}": r["next_offset"] for r in map(json.loads, out.splitlines())}
    assert got == want and len(out.splitlines()) == len(want)
    _run(cli, "export", "--table", "positions", str(tmp_path / "pq"))
    exported = pq.read_table(tmp_path / "pq" / "positions.parquet").to_pylist()
    assert {r["pk"]: r["next_offset"] for r in exported} == want and len(exported) == len(want)
    assert all(r["updated_at"] is not None for r in exported)


def test_export_parquet_and_jsonl(cli: typer.Typer, lance_dir: Path, tmp_path: Path) -> None:
    _run(cli, "export", str(tmp_path / "pq"))
    assert pq.read_table(tmp_path / "pq" / "memories.parquet").num_rows == 3
    assert pq.read_table(tmp_path / "pq" / "links.parquet").num_rows == 1
    _run(cli, "export", "--format", "jsonl", "--table", "memories", str(tmp_path / "js"))
    lines = (tmp_path / "js" / "memories.jsonl").read_text().splitlines()
    assert len(lines) == 3
    row = json.loads(lines[0])
    assert len(row["vector"]) == DIM and row["created_at"].endswith("Z")
    assert sorted(p.name for p in (tmp_path / "js").iterdir()) == ["memories.jsonl"]


def test_commands_refuse_a_missing_projection(cli: typer.Typer, tmp_path: Path) -> None:
    with pytest.raises(CLIError, match="no projection"):
        CliRunner().invoke(cli, ["sql", "SELECT 1", "--lance-dir", str(tmp_path / "nothing")], catch_exceptions=False)
    assert not (tmp_path / "nothing").exists()


def test_memory_ids_never_wrap_in_an_80_column_table(cli: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "uuids"
    monkeypatch.setenv("MEMSTREAM_EMBEDDINGS_PROVIDER", "local")
    monkeypatch.setenv("MEMSTREAM_EMBEDDINGS_DIM", str(DIM))
    monkeypatch.setenv("MEMSTREAM_STORAGE_ROOT", str(root))
    get_settings.cache_clear()
    ids = ["0b8e2f4c-3a51-4f0e-9d6a-7c1e5b2a9f30", "5d1c7a9e-2b64-4e8f-a3c0-9f7b1d2e6a48"]
    Projector(LanceStore(root, embedding_dim=DIM), LocalEmbedder(DIM)).apply(
        positioned([memory(ALICE, i, f"Alice booked a window seat to Lisbon on flight {n}") for n, i in enumerate(ids)])
    )
    result = CliRunner().invoke(cli, ["search", "window seat", "--team", "acme", "--user", "alice"],
                                catch_exceptions=False, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    for memory_id in ids:
        assert any(memory_id in line for line in lines), result.output
    get_settings.cache_clear()


def test_export_directory_is_ignored_by_git() -> None:
    ignored = (Path(__file__).parents[2] / ".gitignore").read_text().split()
    assert "out/" in ignored
