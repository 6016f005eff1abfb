"""Tests mirror the package: every module has a test file of its own
(``tests/<folder>/test_<module>.py``, ``memstream/<sub>/`` mirrored as ``tests/<sub>/``),
or is listed in :data:`COVERED_ELSEWHERE` with the test file that exercises it and why
that file rather than one of its own. That table is the only escape: a docstring in a
test file does not count."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("domain", "streams", "projections", "memstream")
NOT_CODE = {"__init__.py", "__main__.py"}
KNOWN_GAPS = {
    # Modules with no test yet, named here so the gap is visible and new ones are not.
    "memstream/cli/sealing.py": "`memstream forget` / `reseal` commands: their functions are tested, the CLI wrapper is not",
}

PART = "split from the modules tested in that file for size: its behaviour is theirs and is tested with them"
HTTP = "a part of the HTTP API: its behaviour shows only in requests, which that file sends over HTTP"
MCP = "a part of the MCP server: tested through MCP sessions in that file"
CLI = "a CLI command's wrapper: that file runs the command (its functions are tested there too)"
RUNNING = "a piece of a running service: tested where the service runs on the real broker"
CONSOLE = "a part of the web console: its behaviour shows only in pages, which that file requests as keys and as the operator"

COVERED_ELSEWHERE: dict[str, tuple[str, str]] = {
    "domain/events/models.py": ("tests/domain/test_events.py", PART),
    "domain/events/parsing.py": ("tests/domain/test_events.py", PART),
    "domain/events/values.py": ("tests/domain/test_events.py", PART),
    "domain/extraction/drafts.py": ("tests/domain/extraction/test_heuristic.py", PART),
    "domain/extraction/fallback.py": ("tests/domain/extraction/test_fallback_and_marks.py", PART),
    "domain/extraction/known.py": ("tests/services/extraction/test_extractor_known.py", PART),
    "domain/log.py": ("tests/services/extraction/test_extractor.py", PART),
    "domain/priority.py": ("tests/projections/search/test_priority.py", PART),
    "domain/ranking/weights.py": ("tests/domain/ranking/test_fusion.py", PART),
    "domain/reflection/wording.py": ("tests/domain/reflection/test_templated.py", PART),
    "domain/extraction/resume_marks.py": ("tests/domain/extraction/test_fallback_and_marks.py", PART),
    "streams/admin.py": ("tests/streams/sealing/test_keys.py", PART),
    "streams/dead_letters/reader.py": ("tests/cli/test_dead_letters.py", "read by `memstream dead-letters`: that file lists, shows and counts real letters through it"),
    "streams/broker/logs.py": ("tests/streams/broker/test_local.py", PART),
    "streams/broker/paths.py": ("tests/streams/broker/test_local.py", PART),
    "streams/broker/process.py": ("tests/streams/broker/test_local.py", PART),
    "streams/sealing/forget.py": ("tests/streams/sealing/test_forget_e2e.py", PART),
    "streams/producers/kafka_producer.py": ("tests/streams/producers/test_producer.py", PART),
    "streams/sealing/key_records.py": ("tests/streams/sealing/test_forged_records.py", PART),
    "streams/records/batches.py": ("tests/streams/records/test_codec.py", PART),
    "streams/rerouting.py": ("tests/streams/producers/test_contract.py", PART),
    "streams/sealing/sealed_records.py": ("tests/streams/sealing/test_reseal.py", PART),
    "streams/producers/typed_writes.py": ("tests/streams/producers/test_producer.py", PART),
    "streams/producers/sync_producer.py": ("tests/streams/producers/test_producer.py", PART),
    "streams/topics.py": ("tests/streams/sealing/test_keys.py", PART),
    "projections/store/dir_lock.py": ("tests/projections/store/test_object_lease.py", PART),
    "projections/embedders/api.py": ("tests/projections/embedders/test_factory.py", PART),
    "projections/store/key_filter.py": ("tests/projections/store/test_writes.py", PART),
    "projections/store/lance_async.py": ("tests/projections/search/test_reads.py", PART),
    "projections/projector/plan_writer.py": ("tests/projections/projector/test_projector.py", PART),
    "projections/schema.py": ("tests/projections/projector/test_rows.py", PART),
    "projections/search/queries.py": ("tests/projections/search/test_reads.py", PART),
    "projections/search/ranking.py": ("tests/projections/search/test_hybrid.py", PART),
    "projections/search/turns.py": ("tests/projections/search/test_cache.py", PART),
    "projections/search/view.py": ("tests/projections/search/test_cache.py", PART),
    "projections/reads/session_turns.py": ("tests/services/extraction/test_retry.py", PART),
    "projections/projector/sharded.py": ("tests/projections/store/test_shards.py", PART),
    "projections/store/lance_store.py": ("tests/projections/store/test_reads.py", PART),
    "projections/store/filters.py": ("tests/projections/store/test_reads.py", PART),
    "projections/store/table_sets.py": ("tests/projections/store/test_object_paths.py", PART),
    "memstream/banks.py": ("tests/interfaces/test_banks.py", PART),
    "memstream/interfaces/console/pages.py": ("tests/interfaces/console/test_console_scope.py", CONSOLE),
    "memstream/interfaces/console/routes_auth.py": ("tests/interfaces/console/test_console_scope.py", CONSOLE),
    "memstream/interfaces/console/routes_ledger.py": ("tests/interfaces/console/test_console_scope.py", CONSOLE),
    "memstream/interfaces/console/routes_memory.py": ("tests/interfaces/console/test_console_scope.py", CONSOLE),
    "memstream/interfaces/console/routes_ops.py": ("tests/interfaces/console/test_console_scope.py", CONSOLE),
    "memstream/interfaces/console/session.py": ("tests/cli/test_console.py", "the operator token's file: that file creates, shows and rotates it through `memstream console token`"),
    "memstream/interfaces/mcp_http.py": ("tests/interfaces/test_mcp_live.py", MCP),
    "memstream/cli/bench.py": ("tests/bench/test_bench_smoke.py", CLI),
    "memstream/cli/broker.py": ("tests/streams/broker/test_local.py", CLI),
    "memstream/cli/events.py": ("tests/streams/test_interop.py", CLI),
    "memstream/cli/extract.py": ("tests/services/extraction/test_extractor.py", CLI),
    "memstream/cli/projector.py": ("tests/interfaces/test_any_cwd.py", CLI),
    "memstream/cli/reflect.py": ("tests/services/reflection/test_reflector.py", CLI),
    "memstream/cli/serve.py": ("tests/interfaces/test_mcp.py", CLI),
    "memstream/cli/banks.py": ("tests/interfaces/test_banks.py", CLI),
    "memstream/codec/batch.py": ("tests/projections/store/test_shards.py", PART),
    "memstream/codec/values.py": ("tests/codec/test_fast_decode.py", PART),
    "memstream/interfaces/api_auth.py": ("tests/interfaces/test_api.py", HTTP),
    "memstream/interfaces/api_models.py": ("tests/interfaces/test_api.py", HTTP),
    "memstream/interfaces/api_requests.py": ("tests/interfaces/test_api.py", HTTP),
    "memstream/interfaces/asgi.py": ("tests/interfaces/test_api.py", HTTP),
    "memstream/interfaces/errors.py": ("tests/interfaces/test_api.py", HTTP),
    "memstream/interfaces/guards.py": ("tests/interfaces/test_api.py", HTTP),
    "memstream/interfaces/mcp_server.py": ("tests/interfaces/test_mcp.py", MCP),
    "memstream/interfaces/mcp_tools.py": ("tests/interfaces/test_mcp.py", MCP),
    "memstream/interfaces/ratelimit.py": ("tests/interfaces/test_bounds.py", HTTP),
    "memstream/interfaces/routes_ops.py": ("tests/interfaces/test_api.py", HTTP),
    "memstream/interfaces/routes_read.py": ("tests/interfaces/test_api.py", HTTP),
    "memstream/interfaces/routes_write.py": ("tests/interfaces/test_api.py", HTTP),
    "memstream/llm/client.py": ("tests/llm/test_modes.py", PART),
    "memstream/metrics.py": ("tests/services/extraction/test_extractor_fallback.py", PART),
    "memstream/schemas_gen.py": ("tests/domain/test_schemas.py", PART),
    "memstream/sealing/keyring.py": ("tests/streams/sealing/test_keys.py", PART),
    "memstream/sealing/master.py": ("tests/streams/sealing/test_keys.py", PART),
    "memstream/services/extraction/candidate_recall.py": ("tests/services/extraction/test_extractor.py", PART),
    "memstream/services/extraction/calls.py": ("tests/services/extraction/test_extractor.py", PART),
    "memstream/services/extraction/run.py": ("tests/services/extraction/test_extractor.py", PART),
    "memstream/services/log_reads/dead_letters.py": ("tests/interfaces/console/test_console_scope.py", CONSOLE),
    "memstream/services/extraction/commits.py": ("tests/services/extraction/test_extractor.py", RUNNING),
    "memstream/services/extraction/service.py": ("tests/services/extraction/test_extractor.py", RUNNING),
    "memstream/services/extraction/tables.py": ("tests/services/extraction/test_extractor.py", RUNNING),
    "memstream/services/reflection/outcomes.py": ("tests/services/reflection/test_reflector.py", RUNNING),
    "memstream/services/projector/service.py": ("tests/services/test_worker.py", RUNNING),
    "memstream/services/reflection/runner.py": ("tests/services/reflection/test_reflector.py", RUNNING),
    "memstream/services/reflection/writers.py": ("tests/services/reflection/test_reflector.py", RUNNING),
    "memstream/services/reflection/agent.py": ("tests/services/reflection/test_reflector.py", RUNNING),
    "memstream/services/replay/finish.py": ("tests/services/replay/test_rebuild.py", PART),
    "memstream/services/replay/diff.py": ("tests/services/replay/test_rebuild.py", PART),
    "memstream/services/replay/report.py": ("tests/services/replay/test_rebuild.py", PART),
    "memstream/services/projector/shard_owner.py": ("tests/services/shards/test_group.py", RUNNING),
    "memstream/services/shards/routing.py": ("tests/services/shards/test_group.py", RUNNING),
}
"""Module -> (the test file that exercises it, why there). Shrink it: a module that gets
a test file of its own must leave the table (a test below fails on a stale entry)."""


def _modules(root: Path) -> list[Path]:
    found: list[Path] = []
    for folder in PACKAGE_FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            if path.name not in NOT_CODE and "models" not in path.relative_to(root).parts[1:-1]:
                found.append(path.relative_to(root))
    return found


def _mirror(module: Path) -> Path:
    parts = module.parts[1:-1] if module.parts[0] == "memstream" else module.parts[:-1]
    return Path("tests", *parts)


def _own_test(root: Path, module: Path) -> Path:
    return root / _mirror(module) / f"test_{module.stem.lstrip('_')}.py"


def _uncovered(root: Path = ROOT, elsewhere: dict[str, tuple[str, str]] | None = None) -> list[str]:
    listed = COVERED_ELSEWHERE if elsewhere is None else elsewhere
    missing = []
    for module in _modules(root):
        path = module.as_posix()
        if (root == ROOT and path in KNOWN_GAPS) or _own_test(root, module).exists() or path in listed:
            continue
        missing.append(f"{module} (no {_mirror(module)}/test_{module.stem}.py and not in COVERED_ELSEWHERE)")
    return missing


def test_every_module_has_its_tests() -> None:
    assert _uncovered() == []


def test_every_entry_of_the_table_is_still_needed_and_names_a_real_test() -> None:
    modules = {m.as_posix(): m for m in _modules(ROOT)}
    for path, (test, why) in COVERED_ELSEWHERE.items():
        assert path in modules, f"{path} is gone: drop it from COVERED_ELSEWHERE"
        assert not _own_test(ROOT, modules[path]).exists(), f"{path} has its own test now: drop it from COVERED_ELSEWHERE"
        assert (ROOT / test).is_file() and why, path


def test_the_rule_sees_a_module_without_tests_and_a_docstring_does_not_excuse_it(tmp_path: Path) -> None:
    assert _mirror(Path("memstream/services/extractor.py")) == Path("tests/services")
    assert _mirror(Path("memstream/settings.py")) == Path("tests")
    (tmp_path / "streams").mkdir()
    (tmp_path / "streams" / "admin.py").write_text("")
    (tmp_path / "tests" / "streams").mkdir(parents=True)
    other = tmp_path / "tests" / "streams" / "test_other.py"
    other.write_text('"""Other things.\n\nCovers ``admin``."""\n')
    assert [line.split(" ")[0] for line in _uncovered(tmp_path, {})] == ["streams/admin.py"]
    assert _uncovered(tmp_path, {"streams/admin.py": ("tests/streams/test_other.py", PART)}) == []
    (tmp_path / "tests" / "streams" / "test_admin.py").write_text("")
    assert _uncovered(tmp_path, {}) == []
