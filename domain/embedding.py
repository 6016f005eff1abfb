"""The embedding wire codec: little-endian float32, base64 (standard alphabet, padded).

Carrying vectors inside events lets a replay rebuild the vector table without calling
an embedding model again, and lets any language read them (every platform has
little-endian float32 and base64). Values are rounded to float32 when encoded; a value
that already is a float32 survives the round trip bit for bit (NaN payloads included;
the event model refuses non-finite vectors, the codec does not judge).
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Sequence

import numpy as np

__all__ = ["EmbeddingCodecError", "encode_vector", "decode_array", "encoded_length"]


class EmbeddingCodecError(ValueError):
    """A payload that is not base64 of exactly ``dim`` little-endian float32 values."""


def encoded_length(dim: int) -> int:
    """Length in base64 characters of ``dim`` float32 values (padded base64)."""
    return 4 * ((dim * 4 + 2) // 3)


def encode_vector(values: Sequence[float]) -> str:
    """``values`` -> base64 of little-endian float32. Raises :class:`EmbeddingCodecError`
    for an empty vector or a value outside the float32 range."""
    if len(values) == 0:
        raise EmbeddingCodecError("embedding is empty")
    try:
        packed = struct.pack(f"<{len(values)}f", *values)
    except OverflowError:
        raise EmbeddingCodecError("embedding holds a value outside the float32 range") from None
    except struct.error as exc:
        raise EmbeddingCodecError(f"embedding holds a value that is not a number ({exc})") from None
    return base64.b64encode(packed).decode("ascii")


def decode_array(data: str, dim: int) -> np.ndarray:
    """base64 of ``dim`` little-endian float32 values -> a read-only float32 array.

    Strict: the standard alphabet with padding, no whitespace, exactly ``dim * 4``
    bytes. Raises :class:`EmbeddingCodecError` with the reason. The array form is
    what readers store and compare (one C-level copy, no Python float per value).
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
        raise EmbeddingCodecError(f"embedding dimension must be a positive integer, got {dim!r:.40}")
    if not isinstance(data, str):
        raise EmbeddingCodecError(f"embedding data must be a base64 string, got {type(data).__name__}")
    expected = encoded_length(dim)
    if len(data) != expected:
        # Checked before decoding so junk of any size costs nothing to refuse.
        raise EmbeddingCodecError(
            f"embedding data is {len(data)} base64 characters; dimension {dim} needs {expected}"
        )
    try:
        raw = binascii.a2b_base64(data.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise EmbeddingCodecError("embedding data is not valid base64") from None
    if len(raw) != dim * 4:
        raise EmbeddingCodecError(
            f"embedding data holds {len(raw)} bytes; dimension {dim} needs {dim * 4}"
        )
    return np.frombuffer(raw, dtype="<f4")

