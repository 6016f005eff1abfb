"""The embedding codec: little-endian float32 in base64, exact for float32 values, strict
on decode."""

from __future__ import annotations

import base64
import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.domain.embedding import (
    EmbeddingCodecError,
    decode_array,
    encode_vector,
    encoded_length,
)
from memstream.domain.events import EmbeddingPayload

FLOAT32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
VECTORS = st.lists(FLOAT32, min_size=1, max_size=64)


def bits(values: list[float]) -> bytes:
    """Bit patterns, so -0.0 and 0.0 are told apart."""
    return struct.pack(f"<{len(values)}f", *values)


@settings(max_examples=300)
@given(VECTORS)
def test_round_trip_is_exact_for_float32_values(values: list[float]) -> None:
    data = encode_vector(values)
    decoded = decode_array(data, len(values)).tolist()
    assert decoded == values
    assert bits(decoded) == bits(values)
    assert len(data) == encoded_length(len(values))


@settings(max_examples=200)
@given(st.lists(st.floats(allow_nan=False, min_value=-3e38, max_value=3e38), min_size=1, max_size=32))
def test_float64_values_round_to_float32(values: list[float]) -> None:
    decoded = decode_array(encode_vector(values), len(values)).tolist()
    assert decoded == [float(x) for x in np.asarray(values, dtype=np.float32)]


@settings(max_examples=300)
@given(VECTORS, st.integers(min_value=1, max_value=80))
def test_decode_rejects_a_wrong_dimension(values: list[float], dim: int) -> None:
    if dim == len(values):
        dim += 1
    with pytest.raises(EmbeddingCodecError, match=f"dimension {dim} needs"):
        decode_array(encode_vector(values), dim).tolist()


def test_layout_is_little_endian_float32() -> None:
    assert encode_vector([1.0]) == base64.b64encode(b"\x00\x00\x80\x3f").decode()
    assert encode_vector([1.0, -2.0]) == "AACAPwAAAMA="
    assert decode_array("AACAPwAAAMA=", 2).tolist() == [1.0, -2.0]


def test_numpy_arrays_encode_like_lists() -> None:
    array = np.array([0.1, 0.2, 0.3], dtype=np.float32)
    assert encode_vector(array) == base64.b64encode(array.astype("<f4").tobytes()).decode()


@pytest.mark.parametrize(
    ("data", "dim", "fragment"),
    [
        ("AACAPw=", 1, "is 7 base64 characters; dimension 1 needs 8"),
        ("AACAPw==AA", 1, "needs 8"),
        ("AACA Pw=", 1, "not valid base64"),
        ("AACA\nPw=", 1, "not valid base64"),
        ("AACAP!==", 1, "not valid base64"),
        ("AACAP\u00e9==", 1, "not valid base64"),
        ("AACAPwA=", 1, "holds 5 bytes; dimension 1 needs 4"),
        ("AACAPw==", 0, "must be a positive integer"),
        ("AACAPw==", -1, "must be a positive integer"),
        ("", 1, "needs 8"),
    ],
)
def test_decode_rejects_malformed_payloads(data: str, dim: int, fragment: str) -> None:
    with pytest.raises(EmbeddingCodecError, match=fragment.replace("(", r"\(")):
        decode_array(data, dim).tolist()


def test_decode_rejects_non_text_and_non_integer_dimensions() -> None:
    with pytest.raises(EmbeddingCodecError, match="must be a base64 string"):
        decode_array(b"AACAPw==", 1).tolist()  # type: ignore[arg-type]
    with pytest.raises(EmbeddingCodecError, match="positive integer"):
        decode_array("AACAPw==", True).tolist()
    with pytest.raises(EmbeddingCodecError, match="positive integer"):
        decode_array("AACAPw==", 1.0).tolist()  # type: ignore[arg-type]


def test_encode_rejects_empty_and_out_of_range_vectors() -> None:
    with pytest.raises(EmbeddingCodecError, match="empty"):
        encode_vector([])
    with pytest.raises(EmbeddingCodecError, match="float32 range"):
        encode_vector([1e39])
    with pytest.raises(EmbeddingCodecError, match="not a number"):
        encode_vector(["1.0"])  # type: ignore[list-item]


def test_codec_keeps_non_finite_values_and_the_event_model_refuses_them() -> None:
    data = encode_vector([math.nan, math.inf])
    decoded = decode_array(data, 2).tolist()
    assert math.isnan(decoded[0]) and decoded[1] == math.inf
    with pytest.raises(ValueError, match="NaN or infinite"):
        EmbeddingPayload(model="m", dim=2, data=data)


@settings(max_examples=100)
@given(VECTORS)
def test_payload_round_trips_through_json(values: list[float]) -> None:
    payload = EmbeddingPayload.from_vector("mini", values)
    again = EmbeddingPayload.model_validate_json(payload.model_dump_json())
    assert again == payload
    assert bits(again.to_vector()) == bits(values)
