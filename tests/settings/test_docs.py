"""docs/configuration.md lists every setting as the models define it, and the operator's
part stays small."""

from __future__ import annotations

import re
from pathlib import Path

from memstream.settings.model import setting_fields
from memstream.settings.docs import BEGIN, END, documented, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
MOST_DOCUMENTED = 30


def test_the_configuration_reference_is_the_models_tables() -> None:
    text = DOC.read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:end] == render(), "docs/configuration.md is stale: paste `python -m memstream.settings.docs`"


def test_at_most_thirty_variables_for_the_operator_and_every_setting_is_described() -> None:
    assert len(documented()) <= MOST_DOCUMENTED
    undescribed = [path for path, info, _ in setting_fields() if not (info.description or "").strip()]
    assert undescribed == []


def test_every_setting_appears_in_exactly_one_table() -> None:
    rendered = render().split("### Old names")[0]
    for path, _info, _value in setting_fields():
        variable = "`MEMSTREAM_" + path.replace(".", "_").upper() + "` |"
        assert rendered.count("| " + variable) == 1, path


NOT_SETTINGS = {
    "MEMSTREAM_TEST_S3", "MEMSTREAM_TEST_S3_ENDPOINT", "MEMSTREAM_TEST_S3_BUCKET", "MEMSTREAM_TEST_S3_ACCESS_KEY",
    "MEMSTREAM_TEST_S3_ACCESS_KEY_ID", "MEMSTREAM_TEST_S3_SECRET_KEY", "MEMSTREAM_TEST_S3_SECRET_ACCESS_KEY",
    "MEMSTREAM_TEST_LLM_URL", "MEMSTREAM_TEST_LLM_MODEL", "MEMSTREAM_WEED", "MEMSTREAM_WEED_VERSION",
}
"""Variables the test and CI scripts read, not settings."""


def test_the_documentation_names_only_settings_that_exist() -> None:
    root = DOC.parents[1]
    current = {"MEMSTREAM_" + path.replace(".", "_").upper() for path, _info, _v in setting_fields()}
    for doc in [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").glob("*.md"))]:
        if doc.name in ("benchmarks-history.md", "configuration.md"):
            continue  # the history records the settings of its day; the reference has the old-names table
        named = set(re.findall(r"MEMSTREAM_[A-Z0-9_]*[A-Z0-9]", doc.read_text(encoding="utf-8")))
        unknown = sorted(n for n in named - current - NOT_SETTINGS if not any(c.startswith(n + "_") for c in current))
        assert unknown == [], f"{doc.name} names variables that are not settings: {unknown}"
