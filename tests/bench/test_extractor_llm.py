"""``memstream bench extractor --llm-url``: the harness against an endpoint, here the
scripted fake answering like a weak model (SmolLM2-135M: a copied type list, a speaker
name as a source id, a sentence its sources never said), over llama-cpp-python's
refusal of ``json_schema``. No timing is asserted: the counts must match what the
scripted model wrote, and nothing may be lost."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from memstream.bench import extractor_llm
from memstream.cli import app
from memstream.cli._errors import CLIError
from tests.fakes.openai_server import FakeOpenAI, Reply, fake_llm  # noqa: F401 - the fixture

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

_NEW = re.compile(r"^\[(t\d+)\] [^|]*\| user ([^:]*): (.*)$")


def weak_model(body: dict[str, Any]) -> Reply:
    """Per window: the first turn's text with a copied type list and the speaker's name
    as its only source, and an invented sentence citing the second turn."""
    user = body["messages"][1]["content"]
    turns = [m.groups() for m in map(_NEW.match, user.split("NEW TURNS", 1)[1].splitlines()) if m]
    alias, speaker, text = turns[0]
    return Reply(json_value={"scenes": [{"title": "chat", "message_ids": [], "memories": [
        {"content": f"{speaker} said: {text}", "type": "persona|episodic|instruction|work_fact",
         "priority": 50, "source_ids": [speaker.lower()], "timestamp": None, "timestamp_start": None,
         "timestamp_end": None, "entities": []},
        {"content": "I'm still enjoying the local cuisine", "type": "episodic", "priority": 50,
         "source_ids": [turns[1][0]], "timestamp": None, "timestamp_start": None, "timestamp_end": None,
         "entities": []},
    ]}]})


def test_the_bench_against_an_endpoint_reports_what_the_weak_model_did(fake_llm: FakeOpenAI, tmp_path: Path) -> None:  # noqa: F811
    fake_llm.chat.responder = weak_model
    fake_llm.reject_json_schema = True
    fake_llm.format_refusal_status = 500
    result = CliRunner().invoke(
        app, ["bench", "extractor", "--quick", "--llm-url", fake_llm.base_url, "--llm-model", "weak"]
    )
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    sessions = extractor_llm.QUICK_SESSIONS
    assert figures["turns"] == 4 * sessions and figures["windows"] == sessions
    assert figures["turns_lost"] == 0 and figures["turns_pending"] == 0
    assert figures["windows_with_memories"] == sessions and figures["fallback_windows"] == 0
    # one repaired type, one speaker-name id and one ungrounded sentence per window
    assert figures["type_repairs"] == figures["invented_ids_dropped"] == figures["hallucination_suspects"] == sessions
    assert figures["memories_added"] == sessions
    assert figures["windows_by_model"] == sessions and figures["windows_by_fallback"] == 0
    assert figures["windows_declared_empty"] == figures["declared_empty_with_facts"] == 0
    assert figures["model_answered"] is True
    assert figures["output_mode"] == "json_object_schema" and figures["refused_modes"] == ["json_schema"]
    assert figures["llm_calls"] == sessions and figures["llm_p50_ms"] > 0
    assert 0 <= figures["max_partition_stall_s"]


def test_a_model_that_never_answers_is_flagged_and_the_run_fails(fake_llm: FakeOpenAI) -> None:  # noqa: F811
    fake_llm.chat.responder = lambda body: Reply(status=400, error_message="model crashed")
    result = CliRunner().invoke(
        app, ["bench", "extractor", "--quick", "--llm-url", fake_llm.base_url, "--llm-model", "dead"]
    )
    assert result.exit_code == 3, result.output
    figures = json.loads([line for line in result.output.splitlines() if line.startswith("{")][-1])
    assert figures["model_answered"] is False and figures["windows_by_model"] == 0
    assert figures["windows_by_fallback"] == figures["windows"] == extractor_llm.QUICK_SESSIONS
    assert "WARNING: the model answered nothing usable" in result.output


def test_windows_declared_empty_over_plain_facts_are_counted_and_fall_back(fake_llm: FakeOpenAI) -> None:  # noqa: F811
    fake_llm.chat.responder = lambda body: Reply(json_value={"scenes": []})
    result = CliRunner().invoke(
        app, ["bench", "extractor", "--quick", "--llm-url", fake_llm.base_url, "--llm-model", "mute"]
    )
    assert result.exit_code == 0, result.output  # the model did answer: "nothing"
    figures = json.loads(result.output.strip().splitlines()[-1])
    sessions = extractor_llm.QUICK_SESSIONS
    assert figures["windows_declared_empty"] == figures["declared_empty_with_facts"] == sessions
    assert figures["windows_by_fallback"] == sessions and figures["windows_by_model"] == 0
    assert figures["turns_lost"] == 0


def test_an_url_that_is_not_http_is_a_one_line_error() -> None:
    result = CliRunner().invoke(app, ["bench", "extractor", "--llm-url", "localhost:8080"])
    assert isinstance(result.exception, CLIError)  # what the CLI prints as one line
    assert str(result.exception) == "--llm-url must be an http(s) URL, got 'localhost:8080'"
