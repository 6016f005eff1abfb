"""Reason codes: each bad record docs/producers.md lists, read through the one decode
path, gets the code the page promises; the page names no code memstream lacks."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from memstream.streams.dead_letters.reasons import REASON_CODES, reason_code
from memstream.streams.dead_letters.publisher import DeadLetter
from memstream.streams.records.codec import read_record, screen

DOC = Path(__file__).parents[3] / "docs" / "producers.md"
GOOD = {
    "type": "MemoryAdded", "schema_version": 2, "event_id": str(uuid.uuid4()), "occurred_at": "2026-12-01T10:00:00Z",
    "scope": {"team_id": "acme", "user_id": "alice"}, "memory_id": "m-1", "content": "Alice prefers window seats",
}


def body(**changes: object) -> bytes:
    return json.dumps({k: v for k, v in {**GOOD, **changes}.items() if v is not None}).encode()


CASES = [
    ("empty", None, None),
    ("not-utf8", b"\xff\xfe{}", None),
    ("not-json", b"{not json", None),
    ("not-json", b'{"type": NaN}', None),
    ("not-object", b"[1, 2]", None),
    ("missing-type", b"{}", None),
    ("unknown-type", body(type="MemoryAddded"), None),
    ("invalid", body(content=None, contnet="x"), None),
    ("invalid", body(scope=None), None),
    ("too-large", body(content="x" * 2_000_000), None),
    ("header-mismatch", body(), [("memstream-type", b"MessageObserved")]),
    ("bad-header", body(), [("memstream-schema-version", b"two")]),
    ("refused-record", body(), [("memstream-opened", b"00")]),
]


@pytest.mark.parametrize(("code", "value", "headers"), CASES)
def test_each_documented_bad_record_gets_its_code(code: str, value: bytes | None, headers: list | None) -> None:  # type: ignore[type-arg]
    letter = read_record(None, "t", 0, 0, b"acme/alice", value, headers)
    assert isinstance(letter, DeadLetter), letter
    assert reason_code(letter.reason, letter.stage) == code, letter.reason


def test_later_stages_and_the_sealer() -> None:
    assert reason_code("cannot seal: Object missing required field `scope`", "seal") == "not-sealable"
    assert reason_code("memory m-1 already exists under another scope", "project") == "project"
    assert reason_code(screen(b"k" * 70_000, None) or "", "seal") == "refused-record"


def test_the_page_lists_only_real_codes_and_every_decode_code() -> None:
    table = DOC.read_text().split("## What is dead-lettered, and why", 1)[1].split("## Examples", 1)[0]
    documented = set(re.findall(r"^\|[^|]+\| `([a-z0-9-]+)` \|", table, flags=re.M))
    assert documented - {"project"} <= set(REASON_CODES)
    assert {code for code, _, _ in CASES} <= documented
