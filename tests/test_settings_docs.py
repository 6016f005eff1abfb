"""docs/configuration.md lists every setting as the models define it, and the operator's
part stays small."""

from __future__ import annotations

from pathlib import Path

from memstream.settings import setting_fields
from memstream.settings_docs import BEGIN, END, documented, render

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
MOST_DOCUMENTED = 30


def test_the_configuration_reference_is_the_models_tables() -> None:
    text = DOC.read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:end] == render(), "docs/configuration.md is stale: paste `python -m memstream.settings_docs`"


def test_at_most_thirty_variables_for_the_operator_and_every_setting_is_described() -> None:
    assert len(documented()) <= MOST_DOCUMENTED
    undescribed = [path for path, info, _ in setting_fields() if not (info.description or "").strip()]
    assert undescribed == []


def test_every_setting_appears_in_exactly_one_table() -> None:
    rendered = render().split("### Old names")[0]
    for path, _info, _value in setting_fields():
        variable = "`MEMSTREAM_" + path.replace(".", "_").upper() + "` |"
        assert rendered.count("| " + variable) == 1, path
