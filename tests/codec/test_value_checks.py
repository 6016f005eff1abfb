"""The fast reader's value checks: a value passes as its plain form or the record is
left to the general path (``Unsure``)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from memstream.codec.value_checks import UUID, Pattern, Unsure, chain, finite, optional, utc


def test_utc_reads_the_writers_iso_shape_into_utc() -> None:
    assert utc("2025-01-31T09:30:01.25+01:00") == datetime(2025, 1, 31, 8, 30, 1, 250000, tzinfo=timezone.utc)
    assert utc("2025-01-31T09:30:00Z").tzinfo is timezone.utc


@pytest.mark.parametrize("value", ["2025-01-31 09:30:00Z", "2025-01-31T09:30:00", "2025-01-31T09:30:00+01:00:30"])
def test_utc_leaves_other_forms_to_the_model(value: str) -> None:
    with pytest.raises(Unsure):
        utc(value)


def test_finite_refuses_nan_and_infinity() -> None:
    assert finite(1.5) == 1.5
    for value in (float("nan"), float("inf")):
        with pytest.raises(Unsure):
            finite(value)


def test_a_pattern_checks_joined_values_without_letting_a_newline_split_one() -> None:
    ids = Pattern(r"^[a-z0-9-]+$")
    assert ids.all(["a-1", "b"]) == ["a-1", "b"]
    with pytest.raises(Unsure):
        ids.all(["a-1\nb"])  # one value holding a newline would pass as two
    with pytest.raises(Unsure):
        ids.all(["a-1", "B"])


def test_uuid_accepts_only_the_canonical_form() -> None:
    assert UUID("0b1f6d2e-9c3a-4f5e-8d7c-6b5a4f3e2d1c")
    for value in ("0B1F6D2E-9C3A-4F5E-8D7C-6B5A4F3E2D1C", "0b1f6d2e9c3a4f5e8d7c6b5a4f3e2d1c"):
        with pytest.raises(Unsure):
            UUID(value)


def test_chain_and_optional_compose_checks() -> None:
    both = chain([str.strip, str.upper])
    assert both is not None and both(" a ") == "A"
    assert chain([]) is None
    maybe = optional(finite)
    assert maybe is not None and maybe(None) is None and maybe(2.0) == 2.0
